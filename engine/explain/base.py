"""The one result type every explainer returns, and the small interface explainers implement.

Vocabulary: the *query* is the transaction being explained; its *context* is the window of the
entity's history the scorer used for it, in time order, query last: ``T`` transactions,
``F`` input fields. Scores are probabilities; attributions are in logits.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import pandas as pd

ATTENTION_CAVEAT = (
    "Attention weights show where the model looked, not how much each transaction changed the "
    "score; they are not attributions (Jain & Wallace 2019, 'Attention is not Explanation')."
)


@dataclass
class Explanation:
    """One explanation of one query transaction by one method.

    Attributes:
        method: ``"attention"``, ``"attention_rollout"``, ``"integrated_gradients"``, ``"shap"``
            or ``"occlusion"``.
        entity_id: the entity whose history is explained.
        transaction_ids: ``[T]`` ids of the context transactions, time order, query last.
        query_transaction_id: id of the query (== ``transaction_ids[-1]``).
        values: ``[T]`` float64, one value per context transaction (the query's own value last).
            Units in ``units``. For attribution methods, positive = pushed towards fraud.
        field_values: ``[T, F]`` float64 per (transaction, field) or ``None`` if the method
            has no field resolution.
        field_names: ``[F]`` names of the fields of ``field_values``.
        units: ``"logit"`` for attributions, ``"attention weight"`` for attention.
        signed: whether values can be negative.
        baseline: plain description of the reference input / masking rule.
        params: method parameters (steps, samples, seed, layer, head, ...), JSON-serialisable.
        score_logit: model logit of the query on the unmodified context.
        score_probability: ``sigmoid(score_logit)``.
        reference_logit: logit at the baseline (IG: f(baseline); SHAP: base value E[f];
            occlusion: ``None``).
        convergence_delta: IG: ``sum(attributions) - (f(x) - f(baseline))`` (a check of the
            quadrature); ``None`` for the others (SHAP's additivity is imposed by its estimator,
            so it is no check: see ``standard_errors``). Logits.
        extras: method-specific arrays, e.g. attention per layer and head ``[L, H, T]``.
        elapsed_s: wall time of the computation in seconds.
        standard_errors: ``[T]`` float64 standard error of each entry of ``values`` (same order
            and units; 0 where a value is exact), or ``None`` for methods without sampling error
            estimates. SHAP: see :mod:`engine.explain.shap_values`.
    """

    method: str
    entity_id: str
    transaction_ids: list[str]
    query_transaction_id: str
    values: np.ndarray
    units: str
    signed: bool
    baseline: str
    params: dict[str, Any]
    score_logit: float
    field_values: np.ndarray | None = None
    field_names: list[str] | None = None
    reference_logit: float | None = None
    convergence_delta: float | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    standard_errors: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.values = np.asarray(self.values, dtype=np.float64)
        T = len(self.transaction_ids)
        if self.values.shape != (T,):
            raise ValueError(f"values: expected shape ({T},), got {self.values.shape}")
        if self.standard_errors is not None:
            self.standard_errors = np.asarray(self.standard_errors, dtype=np.float64)
            if self.standard_errors.shape != (T,):
                raise ValueError(f"standard_errors: expected shape ({T},) like values, got {self.standard_errors.shape}")
        if self.transaction_ids and self.transaction_ids[-1] != self.query_transaction_id:
            raise ValueError(
                f"transaction_ids: expected the query {self.query_transaction_id!r} last, "
                f"got {self.transaction_ids[-1]!r}"
            )
        if self.field_values is not None:
            self.field_values = np.asarray(self.field_values, dtype=np.float64)
            F = len(self.field_names or [])
            if self.field_values.shape != (T, F):
                raise ValueError(f"field_values: expected shape ({T}, {F}), got {self.field_values.shape}")

    @property
    def score_probability(self) -> float:
        return 1.0 / (1.0 + math.exp(-self.score_logit))

    def to_frame(self) -> pd.DataFrame:
        """One row per context transaction: transaction_id, position, value (+ standard_error when
        the method has one, + one column per field)."""
        df = pd.DataFrame(
            {"transaction_id": self.transaction_ids, "position": np.arange(len(self.values)), "value": self.values}
        )
        if self.standard_errors is not None:
            df["standard_error"] = self.standard_errors
        if self.field_values is not None:
            for j, name in enumerate(self.field_names or []):
                df[f"field:{name}"] = self.field_values[:, j]
        return df

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict (numpy arrays -> nested lists; ``standard_errors`` aligned with
        ``values`` or ``None``)."""
        d = asdict(self)
        d["score_probability"] = self.score_probability
        return _jsonable(d)

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Explanation":
        d = dict(d)
        d.pop("score_probability", None)
        if d.get("field_values") is not None:
            d["field_values"] = np.asarray(d["field_values"], dtype=np.float64)
        return cls(**d)


class Explainer(Protocol):
    """Small interface every explainer implements (cf. LIT interpreters).

    ``name`` is the method name; ``cost`` a plain-language cost estimate
    (e.g. "steps forward+backward passes"); ``explain(context) -> Explanation``.
    """

    name: ClassVar[str]
    cost: ClassVar[str]


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return v if math.isfinite(v) else None
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x
