"""Feature statistics fitted once on the training period, stored with the model.

:class:`FeatureEncoder` turns the canonical transaction frame (see :mod:`engine.data.io`) into
per-row arrays for the model, and maps encoded values back to raw values for display.

Fields (``F`` of them, in this order) — each becomes one ``D``-vector in the row encoder, so
attributions can be reported per (transaction, field):

* ``amount``: sign (refund / zero / purchase) + log-magnitude quantile bin (16 quantile bins plus
  tail bins at the 97 / 99 / 99.5 / 99.75 / 99.8 / 99.85 / 99.9 / 99.95 % quantiles) + standardised ``log1p(|amount|)``
  + its piecewise-linear encoding over the same bin edges.
* ``amount`` also gets, per embedded categorical field (merchant, MCC, category, ...), the amount's
  z-score against the training amounts *of that field's value* ("a large amount for this
  merchant"): the standardised log amount minus the value's mean, over its standard deviation,
  both shrunk towards the whole training period's (``AMOUNT_BY_VALUE_PRIOR_ROWS`` pseudo-rows),
  with a piecewise-linear code at ``AMOUNT_BY_VALUE_EDGES``. Statistics of the training period
  only, stored here (``state["amount_by_value"]``; checkpoints without it have no such column).
* ``amount_vs_history``: the standardised log amount minus its mean over the earlier *present*
  transactions of the window, computed inside the model (so removing a transaction updates it).
* ``time_since_prev``: seconds since the entity's previous (present) transaction, computed
  inside the model from timestamps so that removing a transaction re-computes it.
* ``hour`` and ``weekday`` of the timestamp (UTC).
* every categorical model-input field of the spec (``model_input = false`` fields are skipped):
  a vocabulary of the most frequent training values (index 0 = unseen, 1 = missing) or, with ``hashed_buckets``, a stable hash bucket
  (blake2b, so buckets do not change between processes).
* every numeric field: standardised with training mean/std (missing -> 0 + a missing flag bin).
* every multi-valued field: multi-hot over the training vocabulary (+ one "other" slot).
* every delayed-label aggregate of the spec (e.g. ``terminal_risk``): its counts (log1p), rates,
  recent-label shares and fraud run columns standardised, all in one field (see :mod:`engine.data.aggregates`).
  Each also gets up to ``AGGREGATE_PLE_BINS + 1`` piecewise-linear bins: minimum -> first value above it,
  then quantiles of its training values above the minimum (edges stored here,
  :meth:`FeatureEncoder.num_ple_edges`; the model expands them), so the model can learn thresholds
  such as "the terminal's fraud run began 28 days ago".
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from engine.data.spec import DatasetSpec, FieldKind

N_AMOUNT_BINS = 16
TAIL_QUANTILES = [0.97, 0.99, 0.995, 0.9975, 0.998, 0.9985, 0.999, 0.9995]
#: Quantile bins per delayed-label aggregate column over its values above the minimum (most
#: transactions sit at the minimum, e.g. a fraud rate of 0); with the bin from the minimum to the
#: first value above it, a column gets up to ``AGGREGATE_PLE_BINS + 1`` piecewise-linear bins.
AGGREGATE_PLE_BINS = 16
#: Boundaries (seconds) of the time-since-previous-transaction bins used by the model.
TIME_GAP_BOUNDARIES_S = [
    60, 300, 900, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 4 * 86400,
    7 * 86400, 14 * 86400, 30 * 86400, 90 * 86400,
]
UNSEEN, MISSING = 0, 1
#: Pseudo-rows at the whole training period's log-amount mean and variance that each value's own
#: training rows are pooled with (empirical-Bayes shrinkage): a value seen 5 times sits mostly at
#: the overall statistics, one seen 500 times at its own.
AMOUNT_BY_VALUE_PRIOR_ROWS = 20.0
#: The per-code statistics are stored in the checkpoint's JSON (about 51 bytes a code): fields are
#: given amount-by-value columns in spec order while their codes sum to at most this many (the
#: checkpoint JSON stays under 4 MB of them); a field that would pass it gets none.
AMOUNT_BY_VALUE_MAX_CODES = 65_538
#: The smallest per-code standard deviation a checkpoint may hold (training gives >= 0.01).
AMOUNT_BY_VALUE_MIN_STD = 1e-3
#: Edges (standard deviations of the value's log amount) of the amount-by-value piecewise-linear code.
AMOUNT_BY_VALUE_EDGES = [-3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0]
#: The amount-by-value z-score is clipped to this magnitude.
AMOUNT_BY_VALUE_CLIP = 8.0


@dataclass
class EncodedFrame:
    """Per-row model inputs aligned with the rows of a canonical frame (``N`` rows).

    Attributes:
        cat: ``[N, Fc]`` int64 category indices, column ``j`` indexes ``cat_cardinalities[j]``.
        num: ``[N, Fn]`` float32 standardised numeric values.
        multi: ``[N, Vm]`` float32 multi-hot of all multi-valued fields, concatenated.
        time_s: ``[N]`` float64 seconds since 1970-01-01 UTC.
    """

    cat: np.ndarray
    num: np.ndarray
    multi: np.ndarray
    time_s: np.ndarray

    def __len__(self) -> int:
        return len(self.time_s)


class FeatureEncoder:
    """Feature statistics (vocabularies, quantiles, means) fitted on training rows only.

    ``state_dict()`` / ``from_state_dict()`` give a JSON-serialisable form stored in the checkpoint.
    """

    def __init__(self, spec: DatasetSpec, state: dict[str, Any]):
        self.spec = spec
        self.state = state

    # ------------------------------------------------------------------ fitting
    @classmethod
    def fit(cls, frame: pd.DataFrame, spec: DatasetSpec, amount_by_value: bool = False) -> "FeatureEncoder":
        """Fit statistics on ``frame`` (the training period only, to avoid leakage).

        ``amount_by_value``: also fit the per-value amount statistics of every embedded
        categorical field (module docstring; False = no such columns, the layout of checkpoints
        written before it existed; training turns it on, ``TrainConfig.amount_by_value``).

        Raises:
            ValueError: ``frame`` is empty or lacks a field column named in ``spec``.
        """
        if len(frame) == 0:
            raise ValueError("cannot fit feature statistics on an empty frame")
        for f in spec.fields:
            if f.name not in frame.columns:
                raise ValueError(f"frame lacks field column {f.name!r} (from spec column {f.column!r})")
        logabs = np.log1p(np.abs(frame["amount"].to_numpy(np.float64)))
        # 16 quantile bins plus finer bins in the tail, where fraud rules often live (e.g. > 220)
        levels = np.concatenate([np.linspace(0, 1, N_AMOUNT_BINS + 1)[1:-1], TAIL_QUANTILES])
        qs = np.unique(np.quantile(logabs, levels)).tolist()
        state: dict[str, Any] = {
            "amount_log_mean": float(logabs.mean()),
            "amount_log_std": float(logabs.std() + 1e-6),
            "amount_bin_edges": qs,
            "categorical": {},
            "numeric": {},
            "multi_valued": {},
        }
        for f in spec.fields_of(FieldKind.CATEGORICAL, model_inputs_only=True):
            if not f.embed:  # novelty only (ModelConfig.novelty_only_cols): codes for equality, no embedding
                state["categorical"][f.name] = {"hashed_buckets": NOVELTY_HASH_BUCKETS, "embed": False}
            elif f.hashed_buckets:
                state["categorical"][f.name] = {"hashed_buckets": f.hashed_buckets}
            else:
                vc = frame[f.name].astype(str).value_counts()
                vocab = [v for v in vc.index[: f.max_vocab] if v != f.missing]
                state["categorical"][f.name] = {"vocab": [str(v) for v in vocab]}
        if amount_by_value:
            z = (logabs - state["amount_log_mean"]) / state["amount_log_std"]
            state["amount_by_value"] = _amount_by_value_stats(cls(spec, state), frame, z)
        for f in spec.fields_of(FieldKind.NUMERIC, model_inputs_only=True):
            x = frame[f.name].to_numpy(np.float64)
            state["numeric"][f.name] = {"mean": float(np.nanmean(x)), "std": float(np.nanstd(x) + 1e-6)}
        state["aggregates"] = {}
        for a in spec.aggregates:
            cols = {}
            for c in a.columns():
                x = frame[c].to_numpy(np.float64)
                x = np.log1p(x) if a.is_count(c) else x
                cols[c] = {"mean": float(np.nanmean(x)), "std": float(np.nanstd(x) + 1e-6), "log": a.is_count(c),
                           "ple_edges": _aggregate_edges(x, AGGREGATE_PLE_BINS)}
            state["aggregates"][a.name] = cols
        for f in spec.fields_of(FieldKind.MULTI_VALUED, model_inputs_only=True):
            vals = frame[f.name].astype(str).str.split("|").explode()
            vc = vals[vals != ""].value_counts()
            state["multi_valued"][f.name] = {"vocab": [str(v) for v in vc.index[: f.max_vocab]]}
        return cls(spec, state)

    def state_dict(self) -> dict[str, Any]:
        return self.state

    @classmethod
    def from_state_dict(cls, spec: DatasetSpec, state: dict[str, Any]) -> "FeatureEncoder":
        return cls(spec, state)

    # ------------------------------------------------------------------ layout
    def cat_columns(self) -> list[tuple[str, str, int]]:
        """``[(column name, field name, cardinality)]`` of the ``cat`` array, in order."""
        cols = [
            ("amount_sign", "amount", 3),
            ("amount_bin", "amount", len(self.state["amount_bin_edges"]) + 1),
            ("hour", "hour", 24),
            ("weekday", "weekday", 7),
        ]
        for name, st in self.state["categorical"].items():
            cols.append((name, name, n_codes(st)))
        for name in self.state["numeric"]:
            cols.append((f"{name}_missing", name, 2))
        return cols

    def num_columns(self) -> list[tuple[str, str]]:
        """``[(column name, field name)]`` of the ``num`` array, in order."""
        n_ple = max(0, len(self.state["amount_bin_edges"]) - 1)
        out = [("amount_log", "amount")] + [(f"amount_ple_{k}", "amount") for k in range(n_ple)]
        out += [(n, n) for n in self.state["numeric"]]
        for name, cols in self.state.get("aggregates", {}).items():
            out += [(c, name) for c in cols]
        out += [(f"amount_z_in_{name}", "amount") for name in self._abv_arrays()]
        return out

    def _abv_arrays(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Field -> ``(mean [codes], 1 / std [codes])`` float64 of ``state["amount_by_value"]``,
        checked once (:func:`checked_amount_by_value`; raises its ValueError)."""
        cache = self.__dict__.get("_abv_cache")
        if cache is None:
            abv = checked_amount_by_value(self.state.get("amount_by_value", {}), self.state["categorical"])
            cache = self.__dict__["_abv_cache"] = {
                n: (np.asarray(st["mean"], np.float64), 1.0 / np.asarray(st["std"], np.float64)) for n, st in abv.items()}
        return cache

    def num_ple_edges(self) -> list[list[float]]:
        """Per ``num`` column (same order as :meth:`num_columns`), the edges of the piecewise-linear
        code the model computes from it, in the column's *standardised* units; ``[]`` = none.
        The delayed-label aggregates and the amount-by-value z-scores have them (the amount's own
        code is precomputed in ``num``).
        The model expands them itself, so the encoded frame stays one float per column (memory)."""
        agg = {(name, c): st for name, cols in self.state.get("aggregates", {}).items() for c, st in cols.items()}
        out: list[list[float]] = []
        for col, field_name in self.num_columns():  # looked up by (field, column) name, not position
            st = agg.get((field_name, col), {})
            e = st.get("ple_edges", [])
            std = [float(np.float32((v - st["mean"]) / st["std"])) for v in e] if len(e) > 1 else []
            out.append(sorted(set(std)) if len(set(std)) > 1 else [])  # distinct once in float32
        abv = {f"amount_z_in_{n}" for n in self._abv_arrays()}
        return [list(AMOUNT_BY_VALUE_EDGES) if col in abv else e for (col, _), e in zip(self.num_columns(), out)]

    def multi_slots(self) -> list[tuple[str, int]]:
        """``[(field name, width)]`` of the multi-hot blocks in ``multi`` (vocab + 1 "other")."""
        return [(n, len(st["vocab"]) + 1) for n, st in self.state["multi_valued"].items()]

    def field_names(self) -> list[str]:
        """The ``F`` field names, in the order of the field axis of every ``[.., F, ..]`` tensor."""
        names = ["amount", "time_since_prev", "amount_vs_history", "hour", "weekday"]
        names += list(self.state["categorical"]) + list(self.state["numeric"]) + list(self.state["multi_valued"])
        return names + list(self.state.get("aggregates", {}))

    # ------------------------------------------------------------------ transform
    def transform(self, frame: pd.DataFrame) -> EncodedFrame:
        """Encode a canonical frame (any period) with the fitted statistics. Vectorised."""
        n = len(frame)
        amount = frame["amount"].to_numpy(np.float64)
        logabs = np.log1p(np.abs(amount))
        ts = pd.to_datetime(frame["timestamp"])
        cat_cols: list[np.ndarray] = [
            (np.sign(amount) + 1).astype(np.int64),
            np.searchsorted(np.asarray(self.state["amount_bin_edges"]), logabs, side="right").astype(np.int64),
            ts.dt.hour.to_numpy(np.int64),
            ts.dt.day_of_week.to_numpy(np.int64),
        ]
        num_cols: list[np.ndarray] = [
            ((logabs - self.state["amount_log_mean"]) / self.state["amount_log_std"]).astype(np.float32)
        ]
        num_cols += list(piecewise_linear(logabs, self.state["amount_bin_edges"]).T)
        codes = categorical_codes(self, frame)
        cat_cols += list(codes.values())
        miss_cols = []
        for name, st in self.state["numeric"].items():
            x = frame[name].to_numpy(np.float64)
            miss = np.isnan(x)
            num_cols.append(np.where(miss, 0.0, (x - st["mean"]) / st["std"]).astype(np.float32))
            miss_cols.append(miss.astype(np.int64))
        cat_cols += miss_cols
        for name, cols in self.state.get("aggregates", {}).items():
            for c, st in cols.items():
                x = frame[c].to_numpy(np.float64) if c in frame else np.full(n, np.nan)
                x = np.log1p(x) if st["log"] else x
                num_cols.append(np.nan_to_num((x - st["mean"]) / st["std"], nan=0.0).astype(np.float32))
        z = (logabs - self.state["amount_log_mean"]) / self.state["amount_log_std"]
        for name, (mu, inv) in self._abv_arrays().items():
            c = codes[name]
            num_cols.append(np.clip((z - mu[c]) * inv[c], -AMOUNT_BY_VALUE_CLIP, AMOUNT_BY_VALUE_CLIP).astype(np.float32))
        multi_blocks = []
        for name, st in self.state["multi_valued"].items():
            lut = {v: i for i, v in enumerate(st["vocab"])}
            width = len(st["vocab"]) + 1
            block = np.zeros((n, width), np.float32)
            s = frame[name].astype(str).reset_index(drop=True)
            nonempty = s[s != ""]
            if len(nonempty):
                ex = nonempty.str.split("|").explode()
                pos = ex.map(lut).fillna(width - 1).to_numpy(np.int64)
                block[ex.index.to_numpy(), pos] = 1.0
            multi_blocks.append(block)
        return EncodedFrame(
            cat=np.stack(cat_cols, axis=1) if cat_cols else np.zeros((n, 0), np.int64),
            num=np.stack(num_cols, axis=1),
            multi=np.concatenate(multi_blocks, axis=1) if multi_blocks else np.zeros((n, 0), np.float32),
            time_s=_to_seconds(ts),
        )

    def transform_row(self, row) -> EncodedFrame:
        """Encode one canonical row (dict or Series) without pandas: the incremental scorer's
        fast path (tested equal to :meth:`transform`). Returns an ``EncodedFrame`` of length 1."""
        luts = self.__dict__.setdefault("_luts", {})
        fast = self.__dict__.get("_row_consts")
        if fast is None:  # per-encoder constants of this path, computed once
            e = [float(x) for x in self.state["amount_bin_edges"]]
            fast = self.__dict__["_row_consts"] = (
                e, [max(b - a, 1e-9) for a, b in zip(e, e[1:])], {f.name: f for f in self.spec.fields})
        edges, widths, fspec = fast
        amount = float(row["amount"])
        logabs = float(np.log1p(abs(amount)))
        # nanoseconds since the epoch of the naive timestamp; hour and weekday by integer arithmetic
        # (1970-01-01 was a Thursday: weekday 3 with Monday = 0, as pandas' day_of_week)
        ns = int(row["ts_ns"]) if "ts_ns" in row else int(pd.Timestamp(row["timestamp"]).value)
        cat = [int(np.sign(amount) + 1), bisect.bisect_right(edges, logabs),
               (ns // 3_600_000_000_000) % 24, (ns // 86_400_000_000_000 + 3) % 7]
        num = [(logabs - self.state["amount_log_mean"]) / self.state["amount_log_std"]]
        num += [min(max((logabs - a) / w, 0.0), 1.0) for a, w in zip(edges, widths)]  # as piecewise_linear
        codes = {}
        for name, st in self.state["categorical"].items():
            v = str(row[name])
            if v == fspec[name].missing:
                cat.append(MISSING)
            elif "hashed_buckets" in st:
                cat.append(int.from_bytes(hashlib.blake2b(v.encode(), digest_size=8).digest(), "little") % st["hashed_buckets"] + 2)
            else:
                lut = luts.get(name)
                if lut is None:  # built once (a setdefault would build the dict on every call)
                    lut = luts[name] = {u: i + 2 for i, u in enumerate(st["vocab"])}
                cat.append(lut.get(v, UNSEEN))
            codes[name] = cat[-1]
        for name, st in self.state["numeric"].items():
            x = float(row[name]) if row[name] is not None else float("nan")
            num.append(0.0 if np.isnan(x) else (x - st["mean"]) / st["std"])
            cat.append(int(np.isnan(x)))
        for name, cols in self.state.get("aggregates", {}).items():
            for c, st in cols.items():
                x = float(row[c]) if c in row and row[c] is not None else float("nan")
                x = np.log1p(x) if st["log"] else x
                num.append(0.0 if np.isnan(x) else (x - st["mean"]) / st["std"])
        for name, (mu, inv) in self._abv_arrays().items():  # as transform
            c = codes[name]
            num.append(min(max((num[0] - mu[c]) * inv[c], -AMOUNT_BY_VALUE_CLIP), AMOUNT_BY_VALUE_CLIP))
        multi = []
        for name, st in self.state["multi_valued"].items():
            lut = luts.get("multi:" + name)
            if lut is None:
                lut = luts["multi:" + name] = {u: i for i, u in enumerate(st["vocab"])}
            block = np.zeros(len(st["vocab"]) + 1, np.float32)
            v = str(row[name])
            for item in (v.split("|") if v else []):
                block[lut.get(item, len(st["vocab"]))] = 1.0
            multi.append(block)
        return EncodedFrame(
            cat=np.asarray([cat], np.int64),
            num=np.asarray([num], np.float32),
            multi=(np.concatenate(multi)[None, :] if multi else np.zeros((1, 0), np.float32)),
            time_s=np.asarray([ns / 1e9]),
        )

    def unseen_values(self, frame: pd.DataFrame) -> list[dict[str, Any]]:
        """Values of ``frame`` the fitted vocabularies do not know, per field, so that a caller
        can warn that they are encoded as "unseen" (categoricals, index 0) or "other"
        (multi-valued). Hashed fields have no vocabulary and are never listed; missing cells
        are not unseen.

        Returns:
            One dict per field with unseen values, in field order: ``field`` (name), ``rows``
            (transactions with an unseen value), ``distinct`` (how many distinct unseen values),
            ``example`` (the most frequent one, text), ``encoded_as`` (``"unseen"``/``"other"``).
        """
        out: list[dict[str, Any]] = []
        fspec = {f.name: f for f in self.spec.fields}
        for name, st in self.state["categorical"].items():
            if "hashed_buckets" in st or name not in frame:
                continue
            vals = frame[name].astype(str)
            bad = vals[~vals.isin(set(st["vocab"])) & (vals != fspec[name].missing)]
            if len(bad):
                vc = bad.value_counts()
                out.append(dict(field=name, rows=int(len(bad)), distinct=int(len(vc)), example=str(vc.index[0]),
                                encoded_as="unseen"))
        for name, st in self.state["multi_valued"].items():
            if name not in frame:
                continue
            s = frame[name].astype(str).reset_index(drop=True)
            ex = s[s != ""].str.split("|").explode()
            bad = ex[~ex.isin(set(st["vocab"]))]
            if len(bad):
                vc = bad.value_counts()
                out.append(dict(field=name, rows=int(bad.index.nunique()), distinct=int(len(vc)),
                                example=str(vc.index[0]), encoded_as="other"))
        return out

    # ------------------------------------------------------------------ display
    def describe_value(self, field: str, row: pd.Series) -> str:
        """Raw value of ``field`` for one canonical-frame row, as text for display."""
        if field == "amount":
            return f"{row['amount']:.2f} {self.spec.amount.currency}"
        if field in ("hour", "weekday", "time_since_prev"):
            ts = pd.Timestamp(row["timestamp"])
            return {"hour": f"{ts.hour:02d}h", "weekday": ts.day_name()[:3], "time_since_prev": str(ts)}[field]
        return str(row.get(field, ""))


def piecewise_linear(x: np.ndarray, edges) -> np.ndarray:
    """Piecewise-linear encoding ``[n, K-1]`` float32 of ``x [n]`` over ``K`` sorted edges: column
    ``k`` is ``clip((x - e_k) / (e_{k+1} - e_k), 0, 1)`` (Gorishniy et al. 2022, "On Embeddings for
    Numerical Features in Tabular Deep Learning", arXiv:2203.05556). Lets the model place sharp
    thresholds (e.g. "amount above 220") inside any bin."""
    e = np.asarray(edges, dtype=np.float64)
    if len(e) < 2:
        return np.zeros((len(x), 0), np.float32)
    width = np.maximum(np.diff(e), 1e-9)
    return np.clip((np.asarray(x, np.float64)[:, None] - e[None, :-1]) / width[None, :], 0.0, 1.0).astype(np.float32)


def _aggregate_edges(x: np.ndarray, bins: int) -> list[float]:
    """Piecewise-linear bin edges for one aggregate column ``x [n]`` (training rows; NaN ignored):
    its minimum, then ``bins`` quantile bins over the values above the minimum (duplicates
    dropped). Returns ``[]`` when there is nothing above the minimum or ``bins`` is 0."""
    x = x[~np.isnan(x)]
    if bins <= 0 or len(x) == 0:
        return []
    lo = float(x.min())
    above = x[x > lo]
    if len(above) == 0:
        return []
    return np.unique(np.concatenate([[lo], np.quantile(above, np.linspace(0, 1, bins + 1))])).tolist()


def _to_seconds(ts: pd.Series) -> np.ndarray:
    """Datetime series (any unit) -> float64 seconds since the epoch."""
    return ts.dt.as_unit("ns").astype("int64").to_numpy().astype(np.float64) / 1e9


#: hash space of a novelty-only categorical (spec ``embed = false``): its codes are only compared for
#: equality ("first time at this merchant"), never embedded, so they need no table and a space this
#: large keeps two distinct values of one entity's history from colliding (about 5e-7 for 1,000 values)
NOVELTY_HASH_BUCKETS = 1 << 40


def stable_hash(values: np.ndarray, buckets: int) -> np.ndarray:
    """Stable (process-independent) hash of text values into ``[0, buckets)``; blake2b, 8 bytes.

    Each distinct value is hashed once. Works on an object array of ``str`` without making a
    fixed-width unicode copy (one long cell would otherwise size every row: 19,963 rows x a
    1,000,000-character cell asked for 74 GiB).
    """
    inv, uniq = pd.factorize(pd.Series(values, dtype=object).map(str), sort=False)
    uniq = np.asarray(uniq, dtype=object)
    h = np.fromiter(
        (int.from_bytes(hashlib.blake2b(u.encode(), digest_size=8).digest(), "little") % buckets for u in uniq),
        dtype=np.int64,
        count=len(uniq),
    )
    return h[inv]


def _amount_by_value_stats(enc: "FeatureEncoder", frame: pd.DataFrame, z: np.ndarray) -> dict[str, dict[str, list[float]]]:
    """Per embedded categorical field of ``enc`` (spec order, while the codes so far sum to at most
    :data:`AMOUNT_BY_VALUE_MAX_CODES`),
    the shrunk mean and standard deviation of the standardised log amount ``z`` ``[N]`` float64
    over ``frame``'s rows of each code (index = the field's code in ``TransactionBatch.cat``),
    pooled with :data:`AMOUNT_BY_VALUE_PRIOR_ROWS` pseudo-rows at the whole frame's mean and
    variance (Efron & Morris 1975 style shrinkage): ``mean_k = (sum_k + m * mu) / (n_k + m)``,
    ``var_k = (sumsq_k + m * (var + mu^2)) / (n_k + m) - mean_k^2``. A code no training row has
    gets the overall statistics; the unseen code 0 pools the training values outside a truncated
    vocabulary (``max_vocab``), the missing code 1 the missing ones."""
    cat = categorical_codes(enc, frame)
    m = AMOUNT_BY_VALUE_PRIOR_ROWS
    mu, var = float(z.mean()), float(z.var())
    out: dict[str, dict[str, list[float]]] = {}
    total = 0
    for name, st in enc.state["categorical"].items():
        if st.get("embed", True) is False:
            continue
        card = n_codes(st)
        if total + card > AMOUNT_BY_VALUE_MAX_CODES:
            continue
        total += card
        c = cat[name]
        n = np.bincount(c, minlength=card).astype(np.float64)
        s1 = np.bincount(c, weights=z, minlength=card)
        s2 = np.bincount(c, weights=z * z, minlength=card)
        mean = (s1 + m * mu) / (n + m)
        sd = np.sqrt(np.maximum((s2 + m * (var + mu * mu)) / (n + m) - mean * mean, 0.0) + 1e-4)
        out[name] = {"mean": [float(np.float32(x)) for x in mean], "std": [float(np.float32(x)) for x in sd]}
    return out


def checked_amount_by_value(abv: Any, categorical: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """``abv`` (an encoder state's ``amount_by_value``) if well formed: each entry names an
    embedded categorical field of ``categorical`` (the state's ``categorical``) and holds ``mean``
    / ``std`` lists of one finite number per code of that field (std >= :data:`AMOUNT_BY_VALUE_MIN_STD`,
    |mean| <= 1e6), at most :data:`AMOUNT_BY_VALUE_MAX_CODES` codes in all (a checkpoint's
    statistics are untrusted input).

    Raises:
        ValueError: names the field and what was expected.
    """
    if not isinstance(abv, dict):
        raise ValueError("amount_by_value: expected an object")
    for name, st in abv.items():
        cs = categorical.get(name)
        if cs is None or cs.get("embed", True) is False:
            raise ValueError(f"amount_by_value.{name}: expected an embedded categorical field")
        card = n_codes(cs)
        for k in ("mean", "std"):
            v = st.get(k) if isinstance(st, dict) else None
            if not isinstance(v, list) or len(v) != card or not all(
                    isinstance(x, float) or (isinstance(x, int) and not isinstance(x, bool) and abs(x) <= 1e6)
                    for x in v) or not all(np.isfinite(x) for x in v):
                raise ValueError(f"amount_by_value.{name}.{k}: expected {card} finite numbers (one per code)")
        if min(st["std"]) < AMOUNT_BY_VALUE_MIN_STD or max(map(abs, st["mean"])) > 1e6:
            raise ValueError(f"amount_by_value.{name}: expected std >= {AMOUNT_BY_VALUE_MIN_STD} and |mean| <= 1e6")
    total = sum(len(st["mean"]) for st in abv.values())
    if total > AMOUNT_BY_VALUE_MAX_CODES:
        raise ValueError(f"amount_by_value: expected at most {AMOUNT_BY_VALUE_MAX_CODES:,} codes in all, got {total:,}")
    return abv


def n_codes(st: dict[str, Any]) -> int:
    """Codes of a categorical field from its encoder state ``st``: hash buckets or vocabulary
    entries, plus ``UNSEEN`` and ``MISSING``."""
    return st["hashed_buckets"] + 2 if "hashed_buckets" in st else len(st["vocab"]) + 2


def categorical_codes(enc: "FeatureEncoder", frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """Field -> ``[N]`` int64 codes of every categorical model-input field (the ``cat``
    columns of :meth:`FeatureEncoder.transform`: vocabulary index + 2 or hash bucket + 2, ``UNSEEN`` 0,
    ``MISSING`` 1)."""
    fspec = {f.name: f for f in enc.spec.fields}
    codes: dict[str, np.ndarray] = {}
    for name, st in enc.state["categorical"].items():
        vals = frame[name].astype(str).to_numpy()
        missing = vals == fspec[name].missing
        if "hashed_buckets" in st:
            idx = stable_hash(vals, st["hashed_buckets"]) + 2
        else:
            lut = {v: i + 2 for i, v in enumerate(st["vocab"])}
            idx = pd.Series(vals).map(lut).fillna(UNSEEN).to_numpy(np.int64, copy=True)
        idx[missing] = MISSING
        codes[name] = idx.astype(np.int64)
    return codes


def amount_by_value_layout(enc: "FeatureEncoder") -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    """Per amount-by-value column: ``(num column, cat column of its field, mean [codes],
    1 / std [codes])`` (float64), so code that replaces the amount or the field's value in an
    encoded batch (the explainers' reference cells) can recompute the column from both:
    ``clip((num[..., 0] - mean[cat[..., c]]) / std[...], -CLIP, CLIP)``."""
    num = {c: j for j, (c, _) in enumerate(enc.num_columns())}
    cat = {c: j for j, (c, _, _) in enumerate(enc.cat_columns())}
    return [(num[f"amount_z_in_{n}"], cat[n], mu, inv) for n, (mu, inv) in enc._abv_arrays().items()]
