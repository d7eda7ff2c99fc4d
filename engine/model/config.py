"""The model's configuration: every hyper-parameter the transformer is built from, each field
documented and range-checked (a checkpoint's config is untrusted input)."""

from __future__ import annotations

import math
import numbers
from dataclasses import MISSING, asdict, dataclass, field, fields

from engine.model.activity import ACTIVITY_FIELDS

#: Default ``ModelConfig.history_edges``: log amount minus the customer's earlier mean, in standard
#: deviations of the training log amount (x5 the usual amount is about +1.7 on the Handbook data).
DEFAULT_HISTORY_EDGES = (-3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0)

#: ``ModelConfig`` integer fields -> inclusive (min, max). A checkpoint's config is checked against
#: these before any tensor is allocated; the parameter count is bounded separately
#: (``engine.model.checkpoint.MAX_PARAMETERS``).
CONFIG_LIMITS = {
    "d_model": (1, 1024), "n_heads": (1, 64), "n_layers": (1, 32), "d_ff": (1, 8192),
    "context_length": (2, 1024), "min_history": (0, 1023), "row_ff": (0, 8192), "n_members": (1, 16),
}
MAX_LIST_LEN = 100_000  # entries of any list field (fields, cat columns, num columns)
MAX_EMBEDDING_ROWS = 1 << 22  # sum of the categorical cardinalities (embedding table rows)
MAX_NOVELTY_CODES = (1 << 40) + 2  # codes of a novelty-only column (features.NOVELTY_HASH_BUCKETS + 2)
MAX_MULTI_WIDTH = 100_000  # width of one multi-hot block
MAX_EDGES = 1024  # edges of one piecewise-linear code


def _short(v, n: int = 80) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 1] + "…"


def _check_int(name: str, v, lo: int, hi: int) -> None:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not lo <= v <= hi:
        raise ValueError(f"{name}: expected an integer in [{lo:,}, {hi:,}], got {_short(v)}")


@dataclass
class ModelConfig:
    """Every hyper-parameter the model is built from (stored in the checkpoint).

    Attributes:
        cat_cardinalities: cardinality of each column of ``TransactionBatch.cat`` (``Fc`` entries).
        cat_field_index: field index (into ``field_names``) of each ``cat`` column.
        num_field_index: field index of each ``num`` column (``Fn`` entries).
        multi_slots: ``[(field index, width)]`` of the multi-hot blocks of ``multi``.
        field_names: the ``F`` field names; ``time_since_prev`` must be one of them.
        d_model: width ``D`` of every per-field and per-transaction vector.
        n_heads: attention heads ``H`` (``D`` must be divisible by ``H``).
        n_layers: transformer blocks ``L``.
        d_ff: hidden width of each block's feed-forward layer.
        dropout: dropout probability in training (0 in eval).
        context_length: ``T`` of a scoring window (transactions).
        min_history: in windowed scoring, every transaction after the first window is scored with
            at least this many earlier transactions in its window (stride = T - min_history).
        history_edges: edges (in standard deviations of the training log amount) of a
            piecewise-linear encoding of ``amount_vs_history`` (Gorishniy et al. 2022,
            arXiv:2203.05556), so the model can place sharp thresholds such as "five times the
            customer's usual amount"; ``[]`` = the deviation enters linearly only (checkpoints
            written before this field existed load with ``[]``).
        num_ple_edges: per ``num`` column (``Fn`` lists, or ``[]`` for none at all), edges in the
            column's standardised units of a piecewise-linear code the row encoder adds to that
            column's embedding (``FeatureEncoder.num_ple_edges``: the delayed-label aggregates).
        activity_windows_s: window lengths (seconds) of the ``recent_activity`` field computed
            inside the row encoder (:mod:`engine.model.activity`); ``[]`` = no activity fields
            (checkpoints written before they existed). When set, ``field_names`` ends with
            :data:`~engine.model.activity.ACTIVITY_FIELDS`.
        first_seen_cols: ``cat`` column indices checked by the ``first_seen`` field.
        novelty_only_cols: ``cat`` column indices whose value gets no identity embedding (spec
            ``embed = false``): every value of such a column maps to one learned vector, so the
            model reads the column only through ``first_seen`` ("new merchant"). Each must be in
            ``first_seen_cols`` when the activity fields are on. ``[]`` for checkpoints written
            before the option existed.
        row_ff: hidden width of a residual feed-forward layer applied to each transaction's
            normalised row vector before the first block (``x + W2 GELU(W1 x)``), so interactions
            between one transaction's fields (MCC x amount x chip use) are formed before
            attention mixes transactions; 0 = none (checkpoints written before it existed).
        activity_ple: with the activity fields, also embed a piecewise-linear code of each
            ``recent_activity`` input (fixed edges, :func:`engine.model.activity.activity_ple_edges`);
            False for checkpoints written before the option existed.
        n_members: members ``K`` of a seed ensemble (:class:`engine.model.ensemble.SeedEnsemble`):
            ``K`` transformers of this configuration, trained from different seeds on the same
            inputs, whose mean logit is the score; 1 = one :class:`FraudTransformer` (checkpoints
            written before the option existed).
    """

    cat_cardinalities: list[int]
    cat_field_index: list[int]
    num_field_index: list[int]
    multi_slots: list[tuple[int, int]]
    field_names: list[str]
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 128
    dropout: float = 0.1
    context_length: int = 128
    min_history: int = 32
    history_edges: list[float] = field(default_factory=lambda: list(DEFAULT_HISTORY_EDGES))
    num_ple_edges: list[list[float]] = field(default_factory=list)
    activity_windows_s: list[float] = field(default_factory=list)
    first_seen_cols: list[int] = field(default_factory=list)
    novelty_only_cols: list[int] = field(default_factory=list)
    activity_ple: bool = False
    row_ff: int = 0
    n_members: int = 1

    @property
    def embedding_cardinalities(self) -> list[int]:
        """Rows of each ``cat`` column's block of the embedding table: its cardinality, or 1 for a
        novelty-only column (:attr:`novelty_only_cols`)."""
        skip = set(self.novelty_only_cols)
        return [1 if j in skip else c for j, c in enumerate(self.cat_cardinalities)]

    def __post_init__(self) -> None:
        self._check_ranges()
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model: expected a multiple of n_heads={self.n_heads}, got {self.d_model}")
        if len(self.cat_cardinalities) != len(self.cat_field_index):
            raise ValueError(
                f"cat_field_index: expected {len(self.cat_cardinalities)} entries, got {len(self.cat_field_index)}"
            )
        if "time_since_prev" not in self.field_names:
            raise ValueError("field_names: expected a 'time_since_prev' field")
        if not 0 <= self.min_history < self.context_length:
            raise ValueError(
                f"min_history: expected 0 <= min_history < context_length={self.context_length}, got {self.min_history}"
            )
        self.multi_slots = [tuple(x) for x in self.multi_slots]  # JSON gives lists
        if self.num_ple_edges and len(self.num_ple_edges) != len(self.num_field_index):
            raise ValueError(
                f"num_ple_edges: expected {len(self.num_field_index)} lists (one per num column), got {len(self.num_ple_edges)}"
            )
        for name, lists in (("history_edges", [self.history_edges]), ("num_ple_edges", self.num_ple_edges)):
            for j, e in enumerate(lists):
                if len(e) > 1 and not all(b > a for a, b in zip(e[:-1], e[1:])):
                    raise ValueError(f"{name}: expected strictly increasing edges (list {j}), got {list(e)}")
        self._check_activity()

    def _check_activity(self) -> None:
        """``activity_windows_s`` / ``first_seen_cols`` in range, and the activity fields last.

        Raises:
            ValueError: names the field, the expectation and the value.
        """
        w, cols = self.activity_windows_s, self.first_seen_cols
        if not isinstance(w, (list, tuple)) or len(w) > 16 or not all(
                not isinstance(x, bool) and isinstance(x, numbers.Real) and math.isfinite(x) and 0 < x <= 3.2e8
                for x in w):
            raise ValueError(f"activity_windows_s: expected at most 16 numbers of seconds in (0, 3.2e8], got {_short(w)}")
        if not isinstance(cols, (list, tuple)) or len(cols) > 64:
            raise ValueError(f"first_seen_cols: expected a list of at most 64 column indices, got {_short(cols)}")
        for j, c in enumerate(cols):
            _check_int(f"first_seen_cols[{j}]", c, 0, max(0, len(self.cat_cardinalities) - 1))
        if w and tuple(self.field_names[-len(ACTIVITY_FIELDS):]) != ACTIVITY_FIELDS:
            raise ValueError(f"field_names: expected to end with {list(ACTIVITY_FIELDS)} when activity_windows_s is set, "
                             f"got {_short(self.field_names)}")
        if cols and not w:
            raise ValueError("first_seen_cols: expected [] when activity_windows_s is []")
        if not isinstance(self.activity_ple, bool) or (self.activity_ple and not w):
            raise ValueError(f"activity_ple: expected false, or true with activity_windows_s set, got "
                             f"{_short(self.activity_ple)}")
        for j, c in enumerate(self.novelty_only_cols):  # types and range checked in _check_ranges
            if w and c not in cols:
                raise ValueError(f"novelty_only_cols[{j}]: expected a column of first_seen_cols {_short(list(cols))}, got {c}")

    def _check_ranges(self) -> None:
        """Types and ranges of every field (:data:`CONFIG_LIMITS`), checked before anything is
        allocated from them (a checkpoint's config is untrusted input).

        Raises:
            ValueError: names the field, the expected range and the value.
        """
        for name, (lo, hi) in CONFIG_LIMITS.items():
            _check_int(name, getattr(self, name), lo, hi)
        d = self.dropout
        if isinstance(d, bool) or not isinstance(d, numbers.Real) or not (math.isfinite(d) and 0 <= d < 1):
            raise ValueError(f"dropout: expected a number in [0, 1), got {d!r}")
        for name in ("cat_cardinalities", "cat_field_index", "num_field_index", "multi_slots", "field_names",
                     "history_edges", "num_ple_edges"):
            v = getattr(self, name)
            if not isinstance(v, (list, tuple)) or len(v) > MAX_LIST_LEN:
                raise ValueError(f"{name}: expected a list of at most {MAX_LIST_LEN:,} entries, got {_short(v)}")
        names = self.field_names
        if not all(isinstance(n, str) and 0 < len(n) <= 200 for n in names) or len(set(names)) != len(names):
            raise ValueError(f"field_names: expected distinct non-empty names, got {_short(names)}")
        F = len(names)
        nov = self.novelty_only_cols
        bad = f"novelty_only_cols: expected a list of at most 64 distinct column indices, got {_short(nov)}"
        if not isinstance(nov, (list, tuple)) or len(nov) > 64:
            raise ValueError(bad)
        for j, c in enumerate(nov):  # integers first: a list or dict entry must not reach set() below
            _check_int(f"novelty_only_cols[{j}]", c, 0, max(0, len(self.cat_cardinalities) - 1))
        if len(set(nov)) != len(nov):
            raise ValueError(bad)
        for j, c in enumerate(self.cat_cardinalities):  # a novelty-only column's codes index no table
            _check_int(f"cat_cardinalities[{j}]", c, 1, MAX_NOVELTY_CODES if j in set(nov) else MAX_EMBEDDING_ROWS)
        if sum(self.embedding_cardinalities) > MAX_EMBEDDING_ROWS:
            raise ValueError(f"cat_cardinalities: expected embedding rows summing to at most {MAX_EMBEDDING_ROWS:,}, "
                             f"got {sum(self.embedding_cardinalities):,}")
        for name in ("cat_field_index", "num_field_index"):
            for j, i in enumerate(getattr(self, name)):
                _check_int(f"{name}[{j}]", i, 0, F - 1)
        for j, slot in enumerate(self.multi_slots):
            if not isinstance(slot, (list, tuple)) or len(slot) != 2:
                raise ValueError(f"multi_slots[{j}]: expected [field index, width], got {_short(slot)}")
            _check_int(f"multi_slots[{j}] field index", slot[0], 0, F - 1)
            _check_int(f"multi_slots[{j}] width", slot[1], 1, MAX_MULTI_WIDTH)
        for name, lists in (("history_edges", [self.history_edges]), ("num_ple_edges", self.num_ple_edges)):
            for j, e in enumerate(lists):
                ok = isinstance(e, (list, tuple)) and len(e) <= MAX_EDGES
                if not ok or not all(not isinstance(x, bool) and isinstance(x, numbers.Real) and math.isfinite(x)
                                     for x in e):
                    raise ValueError(f"{name}: expected lists of at most {MAX_EDGES} finite numbers "
                                     f"(list {j}), got {_short(e)}")

    @property
    def n_fields(self) -> int:
        return len(self.field_names)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """The config stored by :meth:`to_dict` (unknown keys ignored; a legacy config without
        ``history_edges`` gets ``[]``).

        Raises:
            ValueError: ``d`` is not a mapping, lacks a required field, or a value is out of range.
        """
        if not isinstance(d, dict):
            raise ValueError(f"expected a mapping of config fields, got {type(d).__name__}")
        fs = fields(cls)
        missing = [f.name for f in fs if f.name not in d and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise ValueError(f"missing field(s) {missing}")
        known = {f.name for f in fs}
        d = {"history_edges": [], **d}  # legacy checkpoints: linear amount_vs_history only
        return cls(**{k: v for k, v in d.items() if k in known})
