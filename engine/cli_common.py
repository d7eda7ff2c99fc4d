"""Helpers shared by the ``fraudlens`` commands (:mod:`engine.cli`): the console, one-line errors
and notes with text from files printed as text, output-path checks made before any work, and the
read step that prints its row accounting."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from engine.data.csv_writer import show_controls

console = Console(width=None if sys.stdout.isatty() else 150)
#: bench logs carry "[transformer]"-style prefixes and markdown: printed as is, not as rich markup
plain_log = partial(console.print, markup=False)


#: the narrowest ``--help``: typer renders help with rich at the console's width, 80 columns when
#: stdout is not a terminal (a pipe, CI, ``| less``), and its option table then cuts long names
#: (``--target-preci…``); at 120 every option name of every command is whole
HELP_MIN_WIDTH = 120


def wide_help_console(make):
    """Wrap typer's help console factory (``typer.rich_utils._get_rich_console``, called at every
    ``--help`` and usage error) so the console is at least :data:`HELP_MIN_WIDTH` columns wide when
    the terminal is narrower or unknown (80 when stdout is not a terminal); a wider terminal,
    ``$COLUMNS`` or ``$TERMINAL_WIDTH`` keeps its width. Read at each help, not at import, so a
    ``COLUMNS`` set later (a test runner's env) still counts."""
    def console_for_help(stderr: bool = False) -> Console:
        c = make(stderr=stderr)
        if c.width < HELP_MIN_WIDTH:
            c.width = HELP_MIN_WIDTH
        return c

    return console_for_help


def _safe(text: str) -> str:
    """Text from files for the terminal: rich markup escaped, control characters (an ESC sequence
    in a merchant name would reach the terminal) shown as ``\\x1b``, bidi controls (U+202E would
    print a name or an amount reversed) as ``\\u202e``."""
    return escape(show_controls(str(text)).replace("\r", "\\x0d"))


def _fail(msg: str) -> None:
    """Print one error line (text from files is printed as text, never as rich markup) and exit 2."""
    console.print(f"[red]error:[/red] {_safe(' '.join(str(msg).split()))}", soft_wrap=True)
    raise typer.Exit(2)


def _note(msg: str) -> None:
    console.print(f"[yellow]note:[/yellow] {_safe(msg)}", soft_wrap=True)


def _writable(path: Path | None, option: str, example: str) -> None:
    """Fail before any work when an output path is a directory (or its parent is a file)."""
    if path is None:
        return
    if path.is_dir():
        _fail(f"{option} {path} is a directory; give a file name, e.g. {path / example}")
    parent = next((q for q in path.parents if q.exists()), None)
    if parent is not None and not parent.is_dir():
        _fail(f"{option} {path}: {parent} is a file, not a directory")


def _table_out(path: Path | None, option: str, example: str) -> None:
    """:func:`_writable`, and the name must say CSV or Parquet (:func:`engine.data.io.table_format`):
    ``scores.json`` fails here, before any work, instead of becoming a Parquet file."""
    if path is None:
        return
    _writable(path, option, example)
    from engine.data.io import table_format

    try:
        table_format(path)
    except ValueError as e:
        _fail(f"{option} {e}")


def _write(fn, path: Path, option: str, exists: str | None = None):
    """Run the writer ``fn``; an OSError (permission, disk full, ...) becomes one error line.
    ``exists``: the line for a FileExistsError (a writer that refuses to overwrite: the command
    names its own option for that)."""
    try:
        return fn()
    except FileExistsError as e:
        _fail(exists or f"cannot write {option} {path}: {e.strerror or e}")
    except OSError as e:
        _fail(f"cannot write {option} {path}: {e.strerror or e}")


def _load_model(model: Path | None):
    """The checkpoint at ``model`` (None: the demo model), or exit 2 with a one-line message naming
    the file and the cause (see :func:`engine.model.checkpoint.load_checkpoint`)."""
    from engine.model.checkpoint import load_checkpoint

    try:
        return load_checkpoint(model)
    except (FileNotFoundError, ValueError) as e:
        _fail(f"checkpoint refused: {e}")


#: appended when a file lacks the demo spec's columns and no --model was given
DEMO_MODEL_HINT = ("without --model, the demo model in assets/ is used, and it reads TabFormer-format files only "
                   "(the columns of demo_data/transactions.csv); for another layout run `fraudlens inspect` and "
                   "`fraudlens train` and pass --model DIR")


def _read(data: Path, spec, max_rows: int | None = None, reader=None, demo_model: bool = False,
          label_required: bool = True):
    """Read ``data`` with ``spec`` (a built-in name, a TOML path, or a DatasetSpec); print the
    accounting and notes (detected delimiter, columns not read). A file without data rows, or
    without one accepted row, is an error (exit 2). ``reader(data, spec, label_required=)``: instead of read_transactions.
    ``demo_model``: the spec is the demo model's because no --model was given; a file that lacks its
    columns then says so (:data:`DEMO_MODEL_HINT`). ``label_required=False`` (score, explain): a file
    without the spec's label column is read without labels (engine.data.io.read_transactions)."""
    from engine.data.io import read_transactions
    from engine.data.spec import DatasetSpec, load_spec

    try:
        spec = spec if isinstance(spec, DatasetSpec) else load_spec(spec)
        res = (reader(data, spec, label_required=label_required) if reader else
               read_transactions(data, spec, max_rows=max_rows, label_required=label_required))
    except (FileNotFoundError, ValueError) as e:
        missing = "columns required by spec" in str(e) or "column required by spec" in str(e)
        _fail(f"{e}. Note: {DEMO_MODEL_HINT}" if demo_model and missing else str(e))
    for n in res.notes:
        _note(n)
    console.print(res.summary())
    if res.unused_columns:
        u = res.unused_columns
        shown = ", ".join(repr(c if len(c) <= 60 else c[:59] + "…") for c in u[:10])
        _note(f"{len(u)} column{'s' if len(u) > 1 else ''} of {data} not in spec {spec.name!r}, not read: {shown}"
              + (f" and {len(u) - 10} more" if len(u) > 10 else ""))
    if res.rows_read == 0:
        _fail(f"{data}: no transactions (the file has a header line and no data rows)")
    return spec, res


def _require_accepted(res, data: Path, spec=None, written: Path | None = None, option: str | None = None) -> None:
    """Exit 2 when no row of ``data`` was accepted, with the most common reason and, where the
    rejected values show it, the spec change that reads them (:func:`all_rejected_hint`); then
    where every row's reason is: the file ``written``, else the command's ``option`` that writes it."""
    if len(res.frame) == 0:
        rj = res.rejected
        top = rj["reason"].value_counts().index[0] if len(rj) else ""
        col = rj.loc[rj["reason"] == top, "column"].iloc[0] if len(rj) else ""
        hint = all_rejected_hint(rj, spec)
        where = f"column {col!r}" if col else "the whole record"
        _fail(f"{data}: no transaction accepted (all {res.rows_read:,} rows rejected; most common reason: "
              f"{where}: {top})" + (f". Hint: {hint}" if hint else "")
              + (f". Every row's reason is in {written}" if written else
                 f". {option} FILE writes every row's reason" if option else ""))


#: a number with a comma: "17,23", "$1.234,50", "-0,5", but also "1,234" (a thousands comma)
_COMMA_NUMBER = r"^\D{0,3}-?\d{1,3}(\.\d{3})*,\d{1,4}\D{0,3}$|^\D{0,3}-?\d+,\d{1,4}\D{0,3}$"
#: what only a decimal comma writes: 1, 2 or 4 digits after the comma, or a dot thousands group before it
_ONLY_DECIMAL_COMMA = r",\d{1,2}\D{0,3}$|,\d{4}\D{0,3}$|\.\d{3},"


def all_rejected_hint(rejected, spec=None) -> str | None:
    """A likely fix when every row was rejected, read from the rejected values: numbers with a
    comma -> ``decimal = ","`` when some value can only be a decimal comma ("17,23"); when every
    one has exactly 3 digits after it ("1,234") it may be a thousands comma, and both fixes are
    named. None when nothing is recognised."""
    if rejected is None or not len(rejected):
        return None
    nan = rejected[rejected["reason"].astype(str).str.contains("not a number", regex=False)]
    if len(nan) < 0.5 * len(rejected):
        return None
    vals = nan["value"].astype(str).head(200)
    if not len(vals) or vals.str.match(_COMMA_NUMBER).mean() < 0.8:
        return None
    col = str(nan["column"].iloc[0])
    amount_col = spec.amount.column if spec is not None else None
    where = "under [amount]" if amount_col in (None, col) else f"on the field reading {col!r}"
    eg = _shown_value(vals.iloc[0])  # printed on the console: masked and cut as the reject table's values
    if not vals.str.contains(_ONLY_DECIMAL_COMMA).any():
        thousands = ("add ',' to strip under [amount]" if amount_col in (None, col)
                     else "a numeric field reads no grouping: write the numbers without it")
        return (f"the values of {col!r} have a comma with 3 digits after it (e.g. {eg!r}): a thousands "
                f"comma ({thousands}) or a decimal comma (set decimal = \",\" {where}); check the file")
    return (f"the values of {col!r} look like decimal commas (e.g. {eg!r}): set decimal = \",\" {where} "
            "in the spec (`fraudlens inspect` proposes it from the file)")


def _unseen_notes(bundle, frame) -> None:
    """Warn about field values the model never saw in training (encoded as 'unseen' / 'other')."""
    _print_unseen(bundle.encoder.unseen_values(frame))


def _print_unseen(found: list[dict]) -> None:
    for u in found:
        ex = u["example"] if len(u["example"]) <= 40 else u["example"][:39] + "…"
        _note(f"field {u['field']!r}: {u['rows']:,} transaction{'s' if u['rows'] != 1 else ''} with "
              f"{u['distinct']:,} value{'s' if u['distinct'] != 1 else ''} not seen in training "
              f"(e.g. {ex!r}), encoded as {u['encoded_as']!r}")


#: the most characters of a rejected value printed on the console (the rejected file keeps it whole)
SHOWN_VALUE_CHARS = 60


def _shown_value(value):
    """A rejected ``value`` as the console shows it: card-number-like runs of 12-19 digits masked
    (:func:`engine.cases.redact.mask_card_number`: first 6 / last 4 digits), control characters as
    ``\\xNN``, line breaks as ``\\n`` / ``\\x0d``, then cut to :data:`SHOWN_VALUE_CHARS` characters
    ending in "…". A malformed record's value is its whole raw line (name, street, card number):
    the terminal and its scrollback, a CI log or a screen share are no place for it. Masking comes
    before the cut, so a cut never leaves a card number's digits too few to be recognised.
    Non-strings (NaN, None) are returned unchanged."""
    from engine.cases.redact import mask_card_number

    if not isinstance(value, str):
        return value
    v = show_controls(mask_card_number(value)).replace("\r", "\\x0d").replace("\n", "\\n")
    return v if len(v) <= SHOWN_VALUE_CHARS else v[:SHOWN_VALUE_CHARS - 1] + "…"


def _reject_report(res, rejected_out: Path | None) -> None:
    """Print the first rejection reasons (each value masked and cut: :func:`_shown_value`); write
    every rejected row, its raw value kept for fixing the row, to ``rejected_out`` when given,
    always (a header-only file when nothing was rejected, so a pipeline can rely on it)."""
    if len(res.rejected):
        console.print(f"[yellow]{len(res.rejected):,} rejected rows[/yellow]; first reasons:")
        shown = res.rejected.drop(columns="file").head(5)
        if "value" in shown.columns:
            shown = shown.assign(value=shown["value"].map(_shown_value))
        from engine.cases.redact import mask_card_number

        # the reason (a label reason quotes the cell), the entity (a card number in a Sparkov-style file)
        # and the transaction id: masked like the value; the rejected file keeps them raw
        for c in ("reason", "entity_id", "transaction_id"):
            if c in shown.columns:
                shown = shown.assign(**{c: shown[c].map(lambda v: v if v is None or v != v else mask_card_number(str(v)))})
        # the file is the one just named; one line per row (soft_wrap: never folded at the terminal width)
        console.print(_safe(shown.to_string(index=False)), highlight=False, soft_wrap=True)
    if rejected_out:
        _write(lambda: res.write_rejected(rejected_out), rejected_out, "--rejected")
        console.print(f"{len(res.rejected):,} rejected rows written to {escape(str(rejected_out))}")


#: rows of the file that ``inspect`` reads with the guessed spec, to show what it would reject: the
#: whole file up to this many (the Handbook's 1.75M rows read in about 2 s here), else the first ones
TRIAL_ROWS = 2_000_000


def _trial_read(file: Path, spec) -> None:
    """Read the file (at most :data:`TRIAL_ROWS` rows, from the start) with the guessed spec and
    warn, by reason, about the rows it would reject (a wrong guess shows here, before a long train)."""
    from engine.data.io import read_transactions

    try:
        res = read_transactions(file, spec, max_rows=TRIAL_ROWS, label_required=False)
    except (FileNotFoundError, ValueError) as e:
        console.print(f"warning: the guessed spec does not read {escape(str(file))}: {escape(str(e))}")
        return
    from engine.model.split_checks import date_outliers

    far = date_outliers(res.frame, hint="fix or remove them, or give train --train-end / --val-end") if len(res.frame) else None
    if far:
        console.print(f"[yellow]warning[/yellow]: {_safe(far)}")
    rj = res.rejected
    which = (f"the first {res.rows_read:,} rows (the most it reads)" if res.rows_read >= TRIAL_ROWS
             else f"all {res.rows_read:,} rows")
    if not len(rj):
        console.print(f"read check: {which} are accepted with this spec")
        return
    console.print(f"[yellow]warning[/yellow]: of {which}, {len(rj):,} would be rejected "
                  "with this spec; by reason (column: reason, rows, first row):")
    by = rj.groupby(["column", "reason"], sort=False)["row_number"].agg(["size", "min"])
    for (col, why), r in by.sort_values("size", ascending=False).head(8).iterrows():
        n = int(r["size"])
        console.print(f"  {_safe(str(col) or '(whole record)')}: {_safe(str(why))}: {n:,} row{'s' if n != 1 else ''}, first row "
                      f"{int(r['min']):,}",
                      markup=False, highlight=False)
    hint = all_rejected_hint(rj, spec)
    if hint and len(res.frame) == 0:
        console.print(f"  hint: {hint}", markup=False)


# ------------------------------------------------------------------ fraudlens train's result tables
def _print_calibration(cal: dict, op: dict) -> None:
    """Calibration (test ECE, sum of probabilities vs frauds) and the operating point: the
    target, the validation figures and the test figures with their bootstrap intervals."""
    from engine.cases.fmt import format_threshold

    def f(v, spec=".4f"):
        return "—" if v is None else format(v, spec)

    t = Table("test period", "ECE (10 equal-width bins)", "Brier", "sum of values", "frauds", "sum / frauds",
              title=f"calibration: {cal.get('method') or 'none (' + str(cal.get('reason')) + ')'}")
    for kind in ("score", "probability"):
        m = cal.get("test", {}).get(kind)
        if m:
            t.add_row("uncalibrated score" if kind == "score" else "calibrated probability", f(m["ece"]), f(m["brier"]),
                      f(m["sum_probability"], ",.1f"), f"{m['n_fraud']:,}", f(m["sum_over_frauds"], ".2f"))
    console.print(t)
    tgt = op.get("target") or {}
    t = Table("review threshold", "precision", "recall", "alerts / day",
              title=f"operating point ({escape(str(op.get('units', '')))}): target {tgt.get('kind', '—')} "
                    f"{tgt.get('value', '')}{'' if op.get('met', True) else ' (not met)'}")
    v = op.get("validation", {})
    t.add_row(f"validation {format_threshold(op.get('review'))}", f(v.get("precision"), ".3f"),
              f(v.get("recall"), ".3f"), f(v.get("alerts_per_day"), ".1f"))
    te = op.get("test")
    if te:
        iv = te.get("interval") or {}

        def ci(k, spec):
            return f"{f(te.get(k), spec)} [{f((iv.get(k) or [None])[0], spec)}, {f((iv.get(k) or [None, None])[1], spec)}]"

        t.add_row(f"test ({te['level']:.0%} interval, {te['n_boot']} draws over {te['n_entities']:,} entities)",
                  ci("precision", ".3f"), ci("recall", ".3f"), ci("alerts_per_day", ".1f"))
    console.print(t)
    if op.get("decline") is not None and op.get("review") is not None:
        from engine.model.operating_point import DECLINE_PRECISION

        console.print(f"decline threshold {format_threshold(op['decline'])}: the lowest with validation precision >= "
                      f"{DECLINE_PRECISION:g}, raised to the highest with the same recall, never below review (the "
                      "review threshold when no threshold reaches that precision)")
        if float(op["decline"]) <= float(op["review"]):
            console.print("warning: the decline threshold equals the review threshold: no review band, every alert "
                          "would be declined; a supervisor sets other thresholds on the Work queue page", markup=False)
    for w in (op.get("warning"), op.get("precision_warning")):
        if w:
            console.print(f"warning: {w}", markup=False)


def _ranked(m: dict, key: str) -> str:
    """A ranking metric to 4 decimals, or "n/a (one class)" when the rows hold no fraud or only
    fraud (``binary_metrics`` leaves it out: it was printed as "nan")."""
    v = m.get(key)
    return "n/a (one class)" if v is None or v != v else f"{v:.4f}"


def _print_baseline(test: dict, base: dict) -> None:
    """The transformer and the LightGBM baseline on the same test rows, with the bootstrap."""
    t = Table("test rows", "AUC ROC", "average precision", title="transformer vs LightGBM baseline (same test rows)")
    b = base["test"]
    t.add_row("transformer", _ranked(test, "auc_roc"), _ranked(test, "average_precision"))
    t.add_row("LightGBM baseline", _ranked(b, "auc_roc"), _ranked(b, "average_precision"))
    boot = base.get("bootstrap")
    if boot:
        ap, auc = boot["average_precision"], boot["auc_roc"]
        t.add_row(f"difference ({ap['level']:.0%} interval, {ap['n_boot']} draws over {ap['n_entities']} entities)",
                  f"{auc['diff']:+.4f} [{auc['ci_low']:+.4f}, {auc['ci_high']:+.4f}]",
                  f"{ap['diff']:+.4f} [{ap['ci_low']:+.4f}, {ap['ci_high']:+.4f}]")
    console.print(t)
    if not boot:
        console.print("no comparison: the test rows hold one class only (no fraud, or only fraud)")
    elif boot["average_precision"]["ci_high"] < 0:
        console.print("warning: the LightGBM baseline beats the transformer on test average precision "
                      "(the whole interval is below 0)")
