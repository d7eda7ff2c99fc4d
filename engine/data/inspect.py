"""Guess a dataset spec from a raw file (``fraudlens inspect``).

:func:`guess_spec` reads a sample of rows spread over a CSV or Parquet file and guesses each column's
role (:class:`engine.data.spec.ColumnRole`) from its name and values:

* label: a fraud/label/target-named column whose values are one binary pair (0/1, Yes/No,
  true/false, Y/N, fraud/legit); other fraud-named columns (scenario, episode) become
  passthrough, since they would leak the answer into the model;
* timestamp: Year/Month/Day(/Time/Hour/Minute) parts, else a datetime column (Parquet
  timestamp, ISO 8601 or a common day-first/month-first text format), else a numeric time
  counter (``step``, ``seconds``, unix time) with a guessed unit and origin;
* entity: customer/card/user/account/client/member-named columns (all of them, in file order);
* id: a transaction-id-named column whose sampled values are all distinct;
* amount: an amount/amt/value/price/total-named column, or one with currency symbols;
* other columns: zip/postal codes -> categorical ``zip5``; cells with a comma-separated list of
  values that also occur alone -> multi_valued; integer codes and text -> categorical
  (hashed when more than 100 distinct values); other numbers -> numeric. Other time-like
  columns (``TX_TIME_DAYS``) and unnamed index columns are ignored.

The guess is a starting point: :func:`write_spec` writes it as TOML with a header telling the
user to check it. What the guess was unsure about is listed in ``spec.description``.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from engine.data.currency_guess import guess_currency
from engine.data.io import read_raw
from engine.data.sniff import probe
from engine.data.spec import DatasetSpec, spec_from_dict
from engine.data.validate import _numbers, _text

__all__ = ["guess_spec", "write_spec", "SAMPLE_ROWS"]

SAMPLE_ROWS = 5000
_LOW_CARDINALITY = 100

_LABEL_TOKENS = {"fraud", "fraudulent", "label", "target", "class", "isfraud", "chargeback"}
_LEAK_TOKENS = {"fraud", "fraudulent", "scenario", "chargeback", "label", "target"}
#: name tokens of a two-valued column that may be an outcome under another name: without a label
#: column it is proposed as passthrough, never a model input (it may be the answer)
_LABEL_HINT_TOKENS = {"suspicious", "suspect", "flagged", "alerted", "scam", "dispute", "disputed", "cbk",
                      "outcome", "compromised"}  # not "flag" / "bad": card_present_flag, bad_pin are inputs
_ENTITY_TOKENS = {"customer", "cust", "client", "user", "card", "account", "acct", "cardholder",
                  "member", "holder", "pan", "ccnum", "cc"}
_ENTITY_BLOCKERS = {"type", "kind", "brand", "category", "present", "chip", "country", "state", "city",
                    "zip", "age", "gender", "sex", "limit", "expires", "expiry", "expiration", "since",
                    "open", "score", "dob", "birth", "pin", "cvv", "on", "error", "errors"}
_ID_TOKENS = {"transaction", "trans", "tx", "txn", "trx", "trn"}
_AMOUNT_TOKENS = {"amount", "amt", "value", "price", "total", "sum"}
_TIME_TOKENS = {"time", "date", "datetime", "timestamp", "ts", "dt", "seconds", "secs", "days", "day",
                "step", "hour", "hours", "minute", "minutes", "unix", "epoch"}
_ZIP_TOKENS = {"zip", "zipcode", "postal", "postcode", "plz"}
#: column-name tokens of the cardholder's personal data (proposed as passthrough unless allowed)
_PERSONAL_TOKENS = {"gender", "sex", "dob", "birth", "birthdate", "birthday", "age", "job", "occupation",
                    "profession", "first", "last", "firstname", "lastname", "surname", "name", "street",
                    "address", "addr", "city", "state", "zip", "zipcode", "postal", "postcode", "lat",
                    "long", "latitude", "longitude", "phone", "email", "mail", "ssn"}
#: tokens that make such a column describe the merchant side, not the person
_NOT_PERSONAL = {"merchant", "merch", "terminal", "store", "shop", "branch", "atm", "device", "mcc"}
_CODE_TOKENS = {"id", "code", "mcc", "name", "number", "no", "num", "nr", "terminal", "merchant", "device",
                "ip", "category", "type", "zip", "store", "shop", "branch", "atm"}
#: share of a label-named column's sampled cells that may be outside its value pair (stray values)
LABEL_STRAY_SHARE = 0.01
_BINARY_PAIRS = [
    ("1", "0"), ("1.0", "0.0"), ("Yes", "No"), ("yes", "no"), ("YES", "NO"), ("True", "False"),
    ("true", "false"), ("TRUE", "FALSE"), ("Y", "N"), ("y", "n"), ("T", "F"), ("fraud", "legit"),
    ("ja", "nein"), ("Ja", "Nein"), ("JA", "NEIN"), ("oui", "non"), ("Oui", "Non"), ("sí", "no"), ("Sí", "No"),
    ("si", "no"), ("Si", "No"), ("sim", "não"), ("Sim", "Não"),
]
#: a cell whose commas can only be read as thousands grouping ("2,000", "-1,234,567")
_GROUPING_ONLY = re.compile(r"[-+]?[$€£]?\d{1,3}(,\d{3})+")
_DATE_FORMATS = ["%m/%d/%Y %H:%M:%S", "%m/%d/%Y %H:%M", "%d/%m/%Y %H:%M:%S", "%d/%m/%Y %H:%M",
                 "%d.%m.%Y %H:%M:%S", "%d.%m.%Y %H:%M", "%m/%d/%Y", "%d/%m/%Y", "%d.%m.%Y", "%Y%m%d%H%M%S"]


#: column-name words of German, French, Spanish, Portuguese, Italian and Dutch exports (accents
#: folded: "Händler" -> "handler") -> the English role tokens above; a German compound names its
#: parts ("Kundennummer" -> customer, number). Only names: the cells decide every role as in English.
_FOREIGN_TOKENS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("betrag", "umsatz", "summe", "montant", "somme", "importe", "monto", "valor",
                     "quantia", "importo", "bedrag", "waarde"), ("amount",)),
    **dict.fromkeys(("datum", "zeit", "uhrzeit", "zeitpunkt", "zeitstempel", "heure", "horodatage", "fecha", "hora",
                     "data", "ora", "tijd", "tijdstip"), ("date",)),
    **dict.fromkeys(("buchungsdatum", "transaktionsdatum", "buchungszeit"), ("transaction", "date")),
    **dict.fromkeys(("kunde", "kunden", "kundin", "cliente", "klant", "titulaire", "titular", "inhaber"),
                    ("customer",)),
    **dict.fromkeys(("kundennummer", "kundennr", "kundenid"), ("customer", "number")),
    **dict.fromkeys(("karte", "carte", "tarjeta", "cartao", "carta", "kaart", "kreditkarte"), ("card",)),
    **dict.fromkeys(("kartennummer", "kartennr"), ("card", "number")),
    **dict.fromkeys(("konto", "compte", "cuenta", "conta", "rekening"), ("account",)),
    **dict.fromkeys(("kontonummer", "kontonr"), ("account", "number")),
    **dict.fromkeys(("transaktion", "buchung", "zahlung", "transaccion", "transacao", "transazione",
                     "transactie", "betaling", "pago", "pagamento", "paiement"), ("transaction",)),
    **dict.fromkeys(("transaktionsnummer", "buchungsnummer", "transaktionsid"), ("transaction", "number")),
    **dict.fromkeys(("betrug", "fraude", "frode", "fraudulento", "frauduleux", "fraudulenta", "betrugsfall"),
                    ("fraud",)),
    **dict.fromkeys(("handler", "haendler", "commercant", "comercio", "comerciante", "esercente", "negozio",
                     "winkelier", "handelaar"), ("merchant",)),
    **dict.fromkeys(("nummer", "numero", "nr"), ("number",)),
    **dict.fromkeys(("geschlecht", "sexe", "sexo", "sesso", "geslacht"), ("gender",)),
    **dict.fromkeys(("geburtsdatum", "naissance", "nacimiento", "nascimento", "nascita", "geboortedatum"), ("dob",)),
    **dict.fromkeys(("strasse", "rue", "calle", "rua", "straat", "adresse", "direccion", "endereco",
                     "indirizzo", "adres"), ("street",)),
    **dict.fromkeys(("stadt", "ort", "ville", "ciudad", "cidade", "citta", "stad"), ("city",)),
    **dict.fromkeys(("vorname", "prenom", "nombre", "nome", "voornaam"), ("first",)),
    **dict.fromkeys(("nachname", "apellido", "sobrenome", "cognome", "achternaam"), ("last",)),
    **dict.fromkeys(("beruf", "metier", "profesion", "profissao", "professione", "beroep"), ("job",)),
    **dict.fromkeys(("alter", "edad", "idade", "leeftijd"), ("age",)),
}


def _tokens(name: str) -> list[str]:
    """``"TX_FRAUD_SCENARIO"`` -> [tx, fraud, scenario]; ``"isFraud"`` -> [is, fraud]; accents
    folded (``"Händler"`` -> [handler])."""
    s = "".join(ch for ch in unicodedata.normalize("NFKD", name) if not unicodedata.combining(ch))
    s = s.replace("ß", "ss")
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", s)
    return [t for t in re.split(r"[^A-Za-z0-9]+", s.lower()) if t]


def _role_tokens(name: str) -> set[str]:
    """The tokens of a column name (:func:`_tokens`) with their English role words (:data:`_FOREIGN_TOKENS`)."""
    toks = _tokens(name)
    return set(toks).union(*(_FOREIGN_TOKENS.get(t, ()) for t in toks))


@dataclass
class _Col:
    name: str
    tokens: set[str]
    text: np.ndarray  # stripped cell text
    nonempty: np.ndarray  # the non-empty texts
    distinct: int
    is_text: bool  # stored as text (CSV, or a Parquet string column)
    is_datetime: bool
    numeric_frac: float  # share of non-empty cells that are plain numbers
    integral: bool  # all numeric cells are whole numbers
    currency: bool  # some cells carry a currency symbol
    values: np.ndarray  # parsed numbers (NaN where not a number)


def _describe(name: str, s: pd.Series) -> _Col:
    text = np.asarray([t.strip() for t in _text(s)], dtype=object)
    nonempty = text[text != ""]
    is_dt = pd.api.types.is_datetime64_any_dtype(s)
    v, empty, _ = _numbers(s) if not is_dt else (np.full(len(s), np.nan), np.zeros(len(s), bool), None)
    n_ne = max(1, len(nonempty))
    num = np.isfinite(v) & ~empty
    return _Col(
        name=name,
        tokens=_role_tokens(name),
        text=text,
        nonempty=nonempty,
        distinct=len(set(nonempty.tolist())),
        is_text=pd.api.types.is_string_dtype(s) or pd.api.types.is_object_dtype(s),
        is_datetime=is_dt,
        numeric_frac=float(num.sum()) / n_ne if len(nonempty) else 0.0,
        integral=bool(num.any()) and bool(np.all(v[num] == np.floor(v[num]))),
        currency=any(ch in t for t in nonempty[:2000].tolist() for ch in "$€£¥"),
        values=v,
    )


def _decimal_comma_frac(c: _Col, strip: str = "$€£ ") -> float:
    """Share of the non-empty cells that are numbers with a decimal comma ("11,65", "1.234,50")
    and not plain numbers; 0 when no cell holds a comma, or when every comma could group
    thousands ("2,000", "1,234,567": an English number as well; the decimal point wins)."""
    cells = c.nonempty[:2000].tolist()
    commas = [t for t in cells if "," in t]
    if not len(c.nonempty) or not commas or all(_GROUPING_ONLY.fullmatch(t) for t in commas):
        return 0.0
    v, empty, _ = _numbers(pd.Series(c.nonempty, dtype=object), strip=strip, decimal=",")
    return float((np.isfinite(v) & ~empty).mean())


def _grouped_point_frac(c: _Col) -> float:
    """Share of the non-empty cells that are numbers with a decimal point once the amount's
    default strip characters are removed (``"$1,234.50"``, ``"2,000"``: commas group thousands)."""
    if not len(c.nonempty):
        return 0.0
    v, empty, _ = _numbers(pd.Series(c.nonempty, dtype=object), strip="$€£ ,")
    return float((np.isfinite(v) & ~empty).mean())


def _binary_pair(c: _Col, tolerate: float = 0.0) -> tuple[str, str, dict[str, int]] | None:
    """The binary value pair of :data:`_BINARY_PAIRS` that the column's non-empty cells use:
    ``(positive, negative, other)``, ``other`` the cells outside the pair (value -> count). With
    ``tolerate`` > 0 up to that share of the non-empty cells (at least one) may be other values
    (a label column with a stray ``yes`` is still the label; reading rejects those rows)."""
    vals, counts = np.unique(c.nonempty.astype(str), return_counts=True) if len(c.nonempty) else ([], [])
    seen = {str(v): int(n) for v, n in zip(vals, counts)}
    if not seen:
        return None
    allowed = max(1, int(tolerate * len(c.nonempty))) if tolerate > 0 else 0
    best = None
    for pos, neg in _BINARY_PAIRS:
        if pos not in seen and neg not in seen:
            continue
        other = {v: n for v, n in seen.items() if v not in (pos, neg)}
        if sum(other.values()) <= allowed and (best is None or sum(other.values()) < sum(best[2].values())):
            best = (pos, neg, other)
    return best


def _parses_as_datetime(c: _Col) -> tuple[bool, str | None]:
    """(parses, format) for a text column: ISO 8601 (format None) or one of _DATE_FORMATS."""
    vals = pd.Series(c.nonempty[:2000], dtype=object)
    if not len(vals) or not vals.str.contains(r"[-/.:T ]", regex=True).all():
        return False, None
    if vals.str.fullmatch(r"[+-]?\d+(\.\d+)?").any():
        return False, None
    for fmt in [None, *_DATE_FORMATS]:
        parsed = pd.to_datetime(vals, format=fmt or "ISO8601", errors="coerce", utc=True)
        if parsed.notna().mean() >= 0.99:
            return True, fmt
    return False, None


def _both_orders_parse(c: _Col, fmt: str) -> bool:
    """Whether the sample also reads with day and month swapped in ``fmt`` (no day above 12 seen:
    the order is a guess); a value such as 01/30/2026 settles it, and no note is needed then."""
    other = fmt.replace("%d", "\0").replace("%m", "%d").replace("\0", "%m")
    vals = pd.Series(c.nonempty[:2000], dtype=object)
    return bool(pd.to_datetime(vals, format=other, errors="coerce", utc=True).notna().mean() >= 0.99)


def _is_multi_valued(c: _Col, sep: str = ",", distinct_values: bool = False) -> bool:
    """A list column: some cell's parts each occur alone as a cell (TabFormer "Errors?"); or,
    over rows (never over ``distinct_values``, where one odd cell among 11 merchants is 9 %),
    at least 5 % of the cells hold ``sep`` and the items are at most 32."""
    if not c.is_text or c.numeric_frac > 0.5:
        return False
    cells = set(c.nonempty.tolist())
    multi = [t for t in cells if sep in t]
    if not multi:
        return False
    singles = {t for t in cells if sep not in t}
    items = {x.strip() for t in multi for x in t.split(sep)} - {""}
    if any(all(x.strip() in singles for x in t.split(sep) if x.strip()) for t in multi):
        return True
    if distinct_values:
        return False
    share = sum(1 for t in c.nonempty.tolist() if sep in t) / max(1, len(c.nonempty))
    return len(items | singles) <= 32 and share >= 0.05


def _nested_parquet_columns(p: Path) -> list[str]:
    """The list / struct / map columns of a Parquet file (file order), else []."""
    from engine.data.sniff import probe

    if probe(p).format != "parquet":
        return []
    import pyarrow as pa

    from engine.data.parquet import parquet_file

    return [f.name for f in parquet_file(p).schema_arrow if pa.types.is_nested(f.type)]


def _buckets(distinct: int) -> int:
    b = 1024
    while b < 8 * distinct and b < 65536:
        b *= 2
    return b


def guess_spec(path: str | Path, name: str | None = None, *, sample_rows: int = SAMPLE_ROWS,
               allow_personal: bool = False, notes_out: list[str] | None = None) -> DatasetSpec:
    """Guess a :class:`DatasetSpec` from the column names and a sample of the rows of a file.

    The sample is ``sample_rows`` rows spread evenly over the whole file (first and last row
    included), not its first rows: in a file sorted by entity the first rows are one card, with
    one label value.

    Args:
        path: a CSV or Parquet file.
        name: the spec's name; default: the file name's stem, lowercased, ``[a-z0-9_]`` only.
        sample_rows: how many rows to look at.
        allow_personal: use columns that look like personal data of the cardholder (gender,
            age, date of birth, job, names, street, city, state, zip, coordinates, phone, e-mail;
            a name that also says merchant / terminal / store is not personal) as model inputs.
            Off by default: they are proposed as passthrough (kept for display, never a model
            input) with a note.
        notes_out: if given, the notes (what the guess was unsure about) are appended to it.

    Returns:
        A valid spec. Where no entity, timestamp or amount column could be found, the spec names
        a placeholder column ``"<edit: ... column>"`` (reading then fails with a message naming
        it) and ``description`` says what to edit.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is empty, has no data rows, has duplicate column names, or is not
            a UTF-8 CSV / Parquet file (:func:`engine.data.sniff.probe`).
    """
    p = Path(path)
    bad: list[dict] = []
    raw = read_raw(p, rejected=bad)
    if len(raw) == 0:
        raise ValueError(f"{p}: no transactions (the file has a header line and no data rows): nothing to guess from")
    n_rows = len(raw)
    full = raw
    if n_rows > sample_rows:  # evenly spread over the file, first and last row included
        raw = raw.iloc[np.unique(np.linspace(0, n_rows - 1, sample_rows).round().astype(np.int64))]
        raw = raw.reset_index(drop=True)
    cols = {c: _describe(c, raw[c]) for c in raw.columns}
    left = list(raw.columns)  # unassigned, file order
    notes: list[str] = []
    if bad:  # the record count is the file's, and the user learns at once that reading will reject these
        why = Counter(r["reason"] for r in bad)
        notes.append(f"{len(bad):,} of {n_rows + len(bad):,} records are ill-formed and were not looked at ("
                     + ", ".join(f"{n:,} {r}" for r, n in why.most_common(3)) + f"; first: row {bad[0]['row_number']})"
                     "; reading rejects them")

    def take(c: str) -> None:
        left.remove(c)

    nested = _nested_parquet_columns(p)  # JSON text per cell (engine.data.parquet): never a field
    for c in nested:
        take(c)
        notes.append(f"{c!r} holds a list / struct per cell: passthrough (store one value per cell to use it)")

    # label --------------------------------------------------------------------------------------
    label = None
    cands = []
    for c in left:
        d = cols[c]
        pair = _binary_pair(d, tolerate=LABEL_STRAY_SHARE) if d.tokens & _LABEL_TOKENS else None
        if pair:
            pos, neg, other = pair
            both = pos in d.nonempty and neg in d.nonempty
            named = bool(d.tokens & {"fraud", "fraudulent", "label", "isfraud"})
            cands.append(((not other, both, named, -len(d.tokens)), c, pair))
    if cands:
        cands.sort(key=lambda x: x[0], reverse=True)
        _, c, (pos, neg, other) = cands[0]
        label = {"column": c, "positive": [pos], "negative": [neg]}
        take(c)
        if not cands[0][0][1]:
            notes.append(f"label {c!r}: only one value seen in the sample; check positive/negative")
        if other:
            shown = ", ".join(f"{v!r} ({n:,})" for v, n in sorted(other.items(), key=lambda x: -x[1])[:5])
            notes.append(f"label {c!r}: {sum(other.values()):,} of {len(d.nonempty):,} sampled cells are neither "
                         f"{pos!r} nor {neg!r}: {shown}; reading rejects those rows (fix them in the file, or add "
                         "the values to positive / negative in the spec)")
    else:
        notes.append("no label column found (fine for scoring only)")

    # timestamp ----------------------------------------------------------------------------------
    timestamp = None
    lower = {c.strip().lower(): c for c in left}
    if all(k in lower for k in ("year", "month", "day")):
        parts = {k: lower[k] for k in ("year", "month", "day")}
        if "time" in lower and cols[lower["time"]].is_text and pd.Series(
            cols[lower["time"]].nonempty[:2000], dtype=object
        ).str.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?").all():
            parts["time"] = lower["time"]
        else:
            for k in ("hour", "minute"):
                if k in lower:
                    parts[k] = lower[k]
        timestamp = {"parts": parts}
        for c in parts.values():
            take(c)
    if timestamp is None:
        for c in left:
            if cols[c].is_datetime:
                timestamp = {"column": c}
                break
    if timestamp is None:
        for c in left:
            d = cols[c]
            if d.is_text and len(d.nonempty):
                ok, fmt = _parses_as_datetime(d)
                if ok:
                    timestamp = {"column": c, **({"format": fmt} if fmt else {})}
                    if fmt and fmt.startswith(("%d/", "%m/")) and _both_orders_parse(d, fmt):
                        notes.append(f"timestamp {c!r}: format {fmt!r} guessed; day/month order may be the other way "
                                     "(no value in the sample has a day above 12)")
                    break
    if timestamp is None:
        for c in left:
            d = cols[c]
            if d.tokens & _TIME_TOKENS and d.numeric_frac >= 0.99:
                vmax = np.nanmax(d.values) if np.isfinite(d.values).any() else 0
                if vmax > 1e9 or d.tokens & {"unix", "epoch"}:
                    timestamp = {"column": c, "unit": "s", "origin": "1970-01-01"}
                    notes.append(f"timestamp {c!r}: read as unix seconds")
                else:
                    unit = "h" if d.tokens & {"hour", "hours"} else "s" if d.tokens & {"seconds", "secs"} else "D"
                    timestamp = {"column": c, "unit": unit, "origin": "2000-01-01"}
                    notes.append(
                        f"timestamp {c!r}: a counter; unit {unit!r} and origin 2000-01-01 are guesses "
                        "(only differences between timestamps are meaningful)"
                    )
                break
    if timestamp is None:
        timestamp = {"column": "<edit: timestamp column>"}
        notes.append("no timestamp column found: edit [timestamp]")
    elif "column" in timestamp:
        take(timestamp["column"])

    # entity -------------------------------------------------------------------------------------
    ent = [c for c in left if cols[c].tokens & _ENTITY_TOKENS and not cols[c].tokens & _ENTITY_BLOCKERS
           and not cols[c].tokens & _ID_TOKENS]
    if not ent:
        ent = ["<edit: entity column>"]
        notes.append("no entity column (card, customer, account, ...) found: edit [entity]")
    else:
        for c in ent:
            take(c)

    # id -----------------------------------------------------------------------------------------
    tx_id = None
    passthrough_ids: list[str] = []
    for c in list(left):
        d = cols[c]
        named = (d.tokens & _ID_TOKENS and d.tokens & {"id", "no", "num", "number", "key", "ref"}) or (
            c.strip().lower() in {"id", "trans_num", "transactionid", "txid"}
        )
        if not named or not len(d.nonempty):
            continue
        empty = len(d.text) - len(d.nonempty)
        repeated = len(d.nonempty) - d.distinct
        if d.distinct < 0.5 * len(d.nonempty):  # a code (txn_type_id: 4 values), not an id: left to the fields
            continue
        take(c)
        if tx_id is None and repeated == 0 and empty <= max(1, len(d.text) // 100):
            tx_id = c
            if empty:  # a stray empty cell (a line of separators, an export's blank) is one rejected row
                notes.append(f"id {c!r}: {empty:,} empty cell{'s' if empty != 1 else ''} in the sample: "
                             "such rows are rejected ('transaction id is empty')")
            continue
        # a transaction-id column is never a model input (one value per row: it only memorises)
        passthrough_ids.append(c)
        notes.append(f"{c!r} looks like a transaction id but "
                     + (f"{tx_id!r} is the id" if tx_id is not None and tx_id != c
                        else f"{empty:,} of the sample's cells are empty and {repeated:,} repeat a value")
                     + f": passthrough, not a model input (set id = {c!r} to use it as the id: rows with an "
                     "empty or repeated id are then rejected)")

    # amount -------------------------------------------------------------------------------------
    amount, amount_decimal = None, "."
    for pick in (lambda d: bool(d.tokens & _AMOUNT_TOKENS), lambda d: d.currency):
        for c in left:
            d = cols[c]
            if pick(d) and (d.numeric_frac >= 0.99 or d.currency or _decimal_comma_frac(d) >= 0.99
                            or _grouped_point_frac(d) >= 0.99):
                amount = c
                break
        if amount:
            break
    if (amount is not None and cols[amount].numeric_frac < 0.99 and _decimal_comma_frac(cols[amount]) >= 0.99
            and _grouped_point_frac(cols[amount]) < 0.99):
        amount_decimal = ","
        notes.append(f"amount {amount!r}: read with a decimal comma (e.g. {cols[amount].nonempty[0]!r}); "
                     "check [amount] decimal")
    currency = None
    if amount is None:
        amount = "<edit: amount column>"
        notes.append("no amount column found: edit [amount]")
    else:
        take(amount)
        currency, cnote = guess_currency(amount, _tokens(amount), cols[amount].nonempty[:2000].tolist())
        if cnote:
            notes.append(cnote)

    # leftovers: leaks, redundant time columns, index columns -----------------------------------
    passthrough, ignored = [*nested, *passthrough_ids], []
    for c in list(left):
        d = cols[c]
        if d.tokens & _LEAK_TOKENS:
            passthrough.append(c)
            take(c)
            notes.append(f"{c!r} looks like part of the answer (fraud/label): passthrough, never model input")
        elif label is None and d.tokens & _LABEL_HINT_TOKENS and (pair := _binary_pair(d)):
            passthrough.append(c)
            take(c)
            notes.append(f"{c!r} has two values ({pair[0]!r} / {pair[1]!r}) and a name like an outcome: passthrough, "
                         f"never a model input; if it is the fraud label, set [label] column = {c!r}, positive = "
                         f"[{pair[0]!r}], negative = [{pair[1]!r}]")
        elif c.strip() == "" or c.startswith("Unnamed") or c.lower() in {"index", "level_0"}:
            ignored.append(c)
            take(c)
        elif d.tokens & _TIME_TOKENS and not timestamp.get("column", "").startswith("<edit"):
            ignored.append(c)
            take(c)
            notes.append(f"{c!r} looks like another form of the time: ignored")
        elif not allow_personal and d.tokens & _PERSONAL_TOKENS and not d.tokens & _NOT_PERSONAL:
            passthrough.append(c)
            take(c)
            notes.append(f"{c!r} looks like personal data of the cardholder: passthrough, not a model input "
                         "(inspect --allow-personal to use it)")

    # fields -------------------------------------------------------------------------------------
    fields = []
    used_names = {"row_number", "transaction_id", "entity_id", "timestamp", "amount", "label"}
    # a ';' / tab / '|' export, or a decimal-comma amount: "1,5" is a number there, in a ','-delimited
    # file (where it must be quoted) more likely a list of two codes
    comma_numbers = amount_decimal == "," or (p.suffix.lower() not in (".parquet", ".pq")
                                              and probe(p).delimiter != ",")
    for c in left:
        d = cols[c]
        fname = "_".join(_tokens(c)) or "field"
        while fname in used_names:
            fname += "_"
        used_names.add(fname)
        f: dict = {"name": fname, "column": c}
        if d.tokens & _ZIP_TOKENS:
            f.update(kind="categorical", normalize="zip5")
            if d.distinct > _LOW_CARDINALITY:
                f["hashed_buckets"] = _buckets(d.distinct)
                f["embed"] = False
        elif comma_numbers and d.is_text and _decimal_comma_frac(d, strip="") >= 0.99 and not d.tokens & _CODE_TOKENS:
            f.update(kind="numeric", decimal=",")  # "1,5" in a ';'-delimited export: a number, not a list
            notes.append(f"{c!r}: read as a number with a decimal comma (e.g. {d.nonempty[0]!r}); check its decimal")
        elif _is_multi_valued(d) or (full is not raw and d.is_text
                                     and _is_multi_valued(_describe(c, pd.Series(pd.unique(full[c]))),
                                                          distinct_values=True)):
            # rare list cells (TabFormer "Errors?") may miss the sample: their distinct values decide
            f.update(kind="multi_valued", separator=",")
            example = next((t for t in d.nonempty.tolist() if "," in t), None) or next(
                t for t in pd.unique(full[c].astype(str)) if "," in t)
            notes.append(f"{c!r}: read as a list of values separated by ',' (e.g. {str(example)[:60]!r}); if a "
                         "comma is part of one value, make it categorical")
        elif d.numeric_frac >= 0.99 and len(d.nonempty) and not (
            d.integral and (d.tokens & _CODE_TOKENS or d.distinct <= 32)
        ):
            f.update(kind="numeric")
        else:
            f["kind"] = "categorical"
            if d.distinct > _LOW_CARDINALITY:
                f["hashed_buckets"] = _buckets(d.distinct)
                f["embed"] = False
        if f.get("embed") is False:  # per-value embeddings of an id memorise the training frauds
            notes.append(f"{c!r} has {d.distinct:,}+ distinct values: novelty only (embed = false: the model reads "
                         "whether the value is new to the entity, not the value; embed = true learns one "
                         "vector per hash bucket)")
        fields.append(f)

    data = {
        "name": name or (re.sub(r"[^a-z0-9_]+", "_", p.name.split(".")[0].lower()).strip("_") or "dataset"),
        "description": f"guessed by fraudlens inspect from {p.name} ({len(raw):,} of {n_rows + len(bad):,} rows, spread "
        "over the file); "
        + ("check: " + "; ".join(notes) if notes else "check every role"),
        "entity": {"columns": ent},
        "timestamp": timestamp,
        "amount": {"column": amount, **({"currency": currency} if currency else {}),
                   **({"decimal": ",", "strip": "$€£ "} if amount_decimal == "," else {})},
        "fields": fields,
        "passthrough": passthrough,
        "ignored": ignored,
    }
    if label:
        data["label"] = label
    if tx_id:
        data["id"] = tx_id
    if notes_out is not None:
        notes_out.extend(notes)
    return spec_from_dict(data, source=f"guess for {p}")


def write_spec(spec: DatasetSpec, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write ``spec`` as TOML to ``path``, with a header comment telling the user to check it.

    Returns the path. Raises ``FileExistsError`` if it exists and ``overwrite`` is False.
    The file loads back with :func:`engine.data.spec.load_spec` to an equal spec.
    """
    p = Path(path)
    if p.exists() and not overwrite:
        raise FileExistsError(f"{p}: exists (pass overwrite=True to replace it)")
    header = [
        f"# fraudlens dataset spec {spec.name!r}.",
        "# CHECK AND EDIT THIS FILE before training: the roles were guessed from column names and",
        "# a sample of rows spread over the file, and may be wrong.",
        "#   [entity]      columns whose values identify one history (card, customer)",
        "#   [timestamp]   one datetime column, or parts (year/month/day/time)",
        "#   [amount]      signed amount; negative = refund",
        "#   [label]       known fraud label: never a model input",
        "#   id            transaction id: never a model input",
        "#   [[fields]]    model inputs: kind = categorical | numeric | multi_valued;",
        "#                 hashed_buckets for high-cardinality ids (merchant, terminal)",
        "#   passthrough   kept for display/evaluation, never a model input",
        "#   ignored       not read",
        "# Read it with:  load_spec('" + str(p) + "')",
        "",
    ]
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("\n".join(header) + spec.to_toml())
    return p
