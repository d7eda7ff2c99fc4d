"""What-if: edit an entity's history, re-score the query and re-explain it (no retraining).

An analyst asks "would this still be flagged if that purchase had been smaller / at another
merchant / not there at all / if there had been one more purchase?". :func:`what_if` applies
:class:`Edit` s to the canonical frame (:mod:`engine.data.io` contract), **re-encodes** the edited rows
with the model's fitted feature statistics and rebuilds the query's context from the edited
frame (:func:`engine.explain.context.build_context`), so the new score is exactly what whole-file
scoring of the edited file gives (tested against ``score_file`` on an edited raw file). Nothing
of the original encoding is reused.

Edits (JSON-serialisable via :meth:`Edit.to_dict` / :meth:`Edit.from_dict`, for export):

* ``Edit("change", transaction_id, {column: value, ...})`` — change ``amount``, ``timestamp`` or
  any input field of the spec (``merchant``, ``mcc``, ``use_chip``, ``terminal``, ...) of the
  query or of an earlier transaction of the query's entity.
* ``Edit("remove", transaction_id)`` — delete an earlier transaction (never the query).
* ``Edit("add", transaction_id=None, values={...})`` — add a transaction to the query's entity:
  ``timestamp`` and ``amount`` required, other fields default to missing (categorical: the spec's
  ``missing`` category; numeric: NaN; multi-valued: none). Its id is ``transaction_id`` or
  ``"whatif-<n>"``; its ``row_number`` continues after the file's last; label unknown.

Differences from the removal rule of :mod:`engine.explain.removal`: a what-if *edits the file*:
the frame is re-sorted (entity, timestamp, row_number) and the context window is re-cut from the
edited history, as whole-file scoring would; delayed-label aggregates (e.g. Handbook terminal
risk) are recomputed for every row sharing a key with an edited row.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping

import numpy as np
import pandas as pd

from engine.model.checkpoint import ModelBundle
from engine.explain.context import QueryContext, build_context
from engine.explain import DEFAULT_METHODS, explain_all
from engine.explain.base import Explanation
from engine.data.spec import DatasetSpec, FieldKind

Op = Literal["change", "remove", "add"]
SORT_COLUMNS = ["entity_id", "timestamp", "row_number"]


@dataclass
class Edit:
    """One edit of an entity's history (see the module docstring).

    Attributes:
        op: ``"change"``, ``"remove"`` or ``"add"``.
        transaction_id: the transaction changed / removed; for ``add`` the new id (optional).
        values: ``{column: new value}`` for ``change`` and ``add`` (``timestamp`` as a
            ``pd.Timestamp`` or ISO text, naive = UTC).
    """

    op: Op
    transaction_id: str | None = None
    values: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.op not in ("change", "remove", "add"):
            raise ValueError(f"op: expected 'change', 'remove' or 'add', got {self.op!r}")
        if self.op in ("change", "remove") and not self.transaction_id:
            raise ValueError(f"{self.op}: expected a transaction_id")
        if self.op == "change" and not self.values:
            raise ValueError("change: expected at least one value")
        if self.op == "remove" and self.values:
            raise ValueError("remove: expected no values")
        self.values = dict(self.values)
        if self.transaction_id is not None:
            self.transaction_id = str(self.transaction_id)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (timestamps as ISO text, numpy scalars as Python numbers)."""
        return {"op": self.op, "transaction_id": self.transaction_id,
                "values": {k: _jsonable(v) for k, v in self.values.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Edit":
        return cls(op=d["op"], transaction_id=d.get("transaction_id"), values=dict(d.get("values") or {}))


def _jsonable(v: Any) -> Any:
    if isinstance(v, (pd.Timestamp, np.datetime64)):
        return pd.Timestamp(v).isoformat()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (list, tuple, set)):
        return [_jsonable(x) for x in v]
    return v


def _timestamp(v: Any) -> pd.Timestamp:
    t = pd.Timestamp(v)
    if t.tzinfo is not None:
        t = t.tz_convert("UTC").tz_localize(None)
    return t.as_unit("ns")


def _normalise(spec: DatasetSpec, column: str, value: Any) -> Any:
    """A raw value for ``column`` in canonical form (see the engine.data.io contract).

    Raises:
        ValueError: the column cannot be edited or the value is not valid for it.
    """
    if column == "amount":
        x = float(value)
        if not math.isfinite(x):
            raise ValueError(f"amount: expected a finite number, got {value!r}")
        return x
    if column == "timestamp":
        return _timestamp(value)
    fields = {f.name: f for f in spec.fields}
    if column not in fields:
        editable = ["amount", "timestamp"] + list(fields)
        raise ValueError(f"column {column!r}: cannot be edited; expected one of {editable}")
    f = fields[column]
    if f.kind is FieldKind.NUMERIC:
        return float("nan") if value is None or value == "" else float(value)
    if f.kind is FieldKind.MULTI_VALUED:
        items = value if isinstance(value, (list, tuple, set)) else str(value or "").split("|")
        items = sorted({str(i).strip() for i in items if str(i).strip()})
        if any("|" in i for i in items):
            raise ValueError(f"{column}: an item contains '|'")
        return "|".join(items)
    text = "" if value is None else str(value).strip()
    return f.missing if text == "" else text


def _default_row(spec: DatasetSpec, frame: pd.DataFrame) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for f in spec.fields:
        row[f.name] = float("nan") if f.kind is FieldKind.NUMERIC else "" if f.kind is FieldKind.MULTI_VALUED else f.missing
    for c in frame.columns:
        row.setdefault(c, pd.NA)
    return row


def resolve_edits(edits: Iterable[Edit | Mapping[str, Any]]) -> list[Edit]:
    """Edits as :class:`Edit` objects (dicts converted), an ``add`` without id given the id
    ``"whatif-<n>"`` (``n`` = 1-based position in ``edits``)."""
    out = []
    for i, e in enumerate(edits):
        e = e if isinstance(e, Edit) else Edit.from_dict(e)
        if e.op == "add" and not e.transaction_id:
            e = Edit("add", f"whatif-{i + 1}", e.values)
        out.append(e)
    return out


def _one_row(row: dict[str, Any], like: pd.DataFrame) -> pd.DataFrame:
    """One-row frame with ``like``'s columns, cast to ``like``'s dtypes where the value allows
    (e.g. an unknown passthrough value stays NA in an object column)."""
    one = pd.DataFrame([row], columns=like.columns)
    for c, dt in like.dtypes.items():
        try:
            one[c] = one[c].astype(dt)
        except (TypeError, ValueError):
            one[c] = one[c].astype(object)
    return one


def _aggregate_keys(spec: DatasetSpec) -> list[str]:
    return sorted({a.key for a in spec.aggregates})


def apply_edits(
    frame: pd.DataFrame,
    query_transaction_id: str,
    edits: Iterable[Edit | Mapping[str, Any]],
    spec: DatasetSpec,
    *,
    row_number_start: int | None = None,
) -> tuple[pd.DataFrame, list[str]]:
    """Apply edits to a canonical frame (returns a new frame; ``frame`` is not modified).

    Args:
        frame: canonical frame (sorted by entity_id, timestamp, row_number).
        query_transaction_id: the query; every edit targets its entity.
        edits: :class:`Edit` s or their dicts, applied in order.
        spec: the dataset spec (field kinds, missing values, aggregates).
        row_number_start: ``row_number`` of the first added row (default: max + 1 of ``frame``).
    Returns:
        ``(edited frame, edited transaction ids)``: the frame re-sorted, index reset, aggregates
        recomputed for every row sharing a key with an edited row; ids changed, removed or added,
        in edit order without repeats.
    Raises:
        KeyError: the query or an edited transaction id is not in the frame.
        ValueError: an edit targets another entity or a later transaction, removes the query, moves
            a transaction after the query, adds one after the query, reuses an id, or sets a column
            that cannot be edited (see :func:`_normalise`).
    """
    edits = resolve_edits(edits)
    f = frame.reset_index(drop=True).copy()
    tid = f["transaction_id"].astype(str)
    qid = str(query_transaction_id)
    if not (tid == qid).any():
        raise KeyError(f"transaction_id {qid!r} not found")
    qrow = f.loc[(tid == qid).to_numpy()].iloc[0]
    ent, t_q = qrow["entity_id"], pd.Timestamp(qrow["timestamp"])
    agg_keys = _aggregate_keys(spec)
    touched_keys: dict[str, set] = {k: set() for k in agg_keys}
    next_rn = int(f["row_number"].max()) + 1 if row_number_start is None else int(row_number_start)
    edited: list[str] = []
    new_rows = []
    for i, e in enumerate(edits):
        if e.op in ("change", "remove"):
            hit = np.flatnonzero(f["transaction_id"].astype(str).to_numpy() == e.transaction_id)
            if not len(hit):
                raise KeyError(f"edit {i}: transaction_id {e.transaction_id!r} not found")
            r = hit[0]
            if f.at[r, "entity_id"] != ent:
                raise ValueError(f"edit {i}: {e.transaction_id!r} belongs to entity {f.at[r, 'entity_id']!r}, "
                                 f"not to the query's entity {ent!r}")
            is_query = e.transaction_id == qid
            t_r = pd.Timestamp(f.at[r, "timestamp"])
            if not is_query and (t_r > t_q or (t_r == t_q and f.at[r, "row_number"] > qrow["row_number"])):
                raise ValueError(f"edit {i}: {e.transaction_id!r} is after the query; it cannot change its score")
            for k in agg_keys:
                touched_keys[k].add(str(f.at[r, k]))
            if e.op == "remove":
                if is_query:
                    raise ValueError(f"edit {i}: the query itself cannot be removed")
                f = f.drop(index=f.index[r]).reset_index(drop=True)
            else:
                for c, v in e.values.items():
                    nv = _normalise(spec, c, v)
                    if c == "timestamp" and not is_query and nv > t_q:
                        raise ValueError(f"edit {i}: new timestamp {nv} is after the query ({t_q})")
                    if c == "timestamp" and is_query:
                        t_q = nv
                    if c in agg_keys:
                        touched_keys[c].add(str(nv))
                    f.loc[f.index[r], c] = nv
        else:
            vals = dict(e.values)
            for req in ("timestamp", "amount"):
                if req not in vals:
                    raise ValueError(f"edit {i}: add needs {req!r}")
            new_id = e.transaction_id
            if (f["transaction_id"].astype(str) == new_id).any() or any(r["transaction_id"] == new_id for r in new_rows):
                raise ValueError(f"edit {i}: transaction_id {new_id!r} already exists")
            row = _default_row(spec, f)
            row.update({c: _normalise(spec, c, v) for c, v in vals.items()})
            if row["timestamp"] > t_q:
                raise ValueError(f"edit {i}: the added transaction ({row['timestamp']}) is after the query ({t_q})")
            row.update({"transaction_id": new_id, "entity_id": ent, "row_number": next_rn})
            if "label" in f:
                row["label"] = pd.NA
            next_rn += 1
            for k in agg_keys:
                touched_keys[k].add(str(row[k]))
            f = pd.concat([f, _one_row(row, f)], ignore_index=True)
        if e.transaction_id not in edited:
            edited.append(e.transaction_id)
    f = f.sort_values(SORT_COLUMNS, kind="stable").reset_index(drop=True)
    if spec.aggregates:
        f = _recompute_aggregates(f, spec, touched_keys)
    return f, edited


def _recompute_aggregates(f: pd.DataFrame, spec: DatasetSpec, touched: dict[str, set]) -> pd.DataFrame:
    """Recompute every aggregate for the rows whose key is among the touched values (an
    aggregate of a row depends only on rows with the same key: exact)."""
    from engine.data.aggregates import delayed_aggregates

    for agg in spec.aggregates:
        keys = touched.get(agg.key, set())
        if not keys:
            continue
        sel = f[agg.key].astype(str).isin(keys).to_numpy()
        if not sel.any():
            continue
        sub = f.loc[sel]
        vals = delayed_aggregates(sub, agg)
        for c in agg.columns():
            if c not in f:
                f[c] = np.nan
            f.loc[sel, c] = vals[c].to_numpy()
    return f


@dataclass
class WhatIfResult:
    """Result of :func:`what_if`.

    Attributes:
        query_transaction_id: the query.
        original_logit / original_probability: score before the edits.
        logit / probability: score after the edits (same model, re-encoded edited rows).
        explanations: ``{method: Explanation}`` of the edited context.
        edited_transaction_ids: ids changed, removed or added.
        edits: the edits as dicts (:meth:`Edit.to_dict`), JSON-serialisable.
        context: the edited :class:`QueryContext`.
        frame: the edited rows the re-score needs: the query's entity and, with delayed-label
            aggregates, every row sharing an aggregate key with it (use :func:`apply_edits` on the
            whole file for an export of the whole edited file).
    """

    query_transaction_id: str
    original_logit: float
    logit: float
    explanations: dict[str, Explanation]
    edited_transaction_ids: list[str]
    edits: list[dict[str, Any]]
    context: QueryContext
    frame: pd.DataFrame

    @property
    def original_probability(self) -> float:
        return 1.0 / (1.0 + math.exp(-self.original_logit))

    @property
    def probability(self) -> float:
        return 1.0 / (1.0 + math.exp(-self.logit))

    def to_dict(self, include_explanations: bool = True) -> dict[str, Any]:
        """JSON-serialisable export: scores, edits, edited ids, context ids, (explanations)."""
        d = {
            "query_transaction_id": self.query_transaction_id,
            "original_logit": self.original_logit, "original_probability": self.original_probability,
            "logit": self.logit, "probability": self.probability,
            "edited_transaction_ids": list(self.edited_transaction_ids), "edits": list(self.edits),
            "context_transaction_ids": list(self.context.transaction_ids),
        }
        if include_explanations:
            d["explanations"] = {m: e.to_dict() for m, e in self.explanations.items()}
        return d

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)


def _relevant_rows(frame: pd.DataFrame, ent: str, spec: DatasetSpec, edits: list[Edit]) -> pd.DataFrame:
    """The entity's rows plus, with aggregates, every row sharing a key with them or with an edit."""
    is_ent = frame["entity_id"].to_numpy() == ent
    keep = is_ent.copy()
    for k in _aggregate_keys(spec):
        keys = set(frame.loc[is_ent, k].astype(str))
        keys |= {str(e.values[k]) for e in edits if k in e.values}
        keep |= frame[k].astype(str).isin(keys).to_numpy()
    return frame.loc[keep].reset_index(drop=True)


def what_if(
    bundle: ModelBundle,
    frame: pd.DataFrame,
    query_transaction_id: str,
    edits: Iterable[Edit | Mapping[str, Any]],
    *,
    methods: Iterable[str] = DEFAULT_METHODS,
    **explain_kw,
) -> WhatIfResult:
    """Apply ``edits``, re-score the query and re-explain it (no retraining).

    Args:
        bundle: the model bundle (its spec gives field kinds and aggregates).
        frame: the canonical frame the query was scored in.
        query_transaction_id: the query.
        edits: :class:`Edit` s or their dicts (see module doc), applied in order.
        methods: explanation methods for the edited context (``()`` = score only).
        explain_kw: forwarded to :func:`engine.explain.explain_all` (``seed``, ``ig_steps``, ...).
    Returns:
        :class:`WhatIfResult` (logits; probabilities as properties).
    Raises:
        KeyError / ValueError: see :func:`apply_edits`.
    """
    edits = resolve_edits(edits)
    qid = str(query_transaction_id)
    hit = np.flatnonzero(frame["transaction_id"].astype(str).to_numpy() == qid)
    if not len(hit):
        raise KeyError(f"transaction_id {qid!r} not found")
    ent = frame["entity_id"].iloc[int(hit[0])]
    targets = {e.transaction_id for e in edits if e.op != "add"}
    if targets:  # unknown ids / other entities are reported before the frame is cut to the entity
        tids = frame["transaction_id"].astype(str)
        found = frame.loc[tids.isin(targets).to_numpy(), ["transaction_id", "entity_id"]]
        missing = targets - set(found["transaction_id"].astype(str))
        if missing:
            raise KeyError(f"edits: transaction_id(s) {sorted(missing)} not found")
        other = found[found["entity_id"] != ent]
        if len(other):
            raise ValueError(f"edits: {other['transaction_id'].tolist()} belong to another entity than the "
                             f"query's entity {ent!r}")
    sub = _relevant_rows(frame, ent, bundle.spec, edits)
    original = build_context(bundle, sub, qid).score_logit()
    edited, ids = apply_edits(sub, qid, edits, bundle.spec, row_number_start=int(frame["row_number"].max()) + 1)
    ctx = build_context(bundle, edited, qid)  # re-encodes the edited rows from scratch
    expl = explain_all(ctx, methods, **explain_kw) if list(methods) else {}
    return WhatIfResult(
        query_transaction_id=qid, original_logit=float(original), logit=ctx.score_logit(), explanations=expl,
        edited_transaction_ids=ids, edits=[e.to_dict() for e in edits], context=ctx, frame=edited,
    )


__all__ = ["Edit", "WhatIfResult", "apply_edits", "resolve_edits", "what_if"]
