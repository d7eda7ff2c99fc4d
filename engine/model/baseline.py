"""A practitioner's baseline: LightGBM over causal per-entity features derived from any spec.

The comparison the transformer has to win (issue: "an equally informed GBT in every
comparison"). Inputs, per transaction:

* every column of :func:`engine.data.entity_features.causal_entity_features` (entity windows,
  amount z-score, amount vs the entity's past mean per categorical value, first-seen flags, time
  since the previous two transactions, hour, weekday);
* the amount itself (currency of the file) and ``log1p(|amount|)``;
* every model-input field of the spec: numeric fields as they are, categorical fields as
  LightGBM categories over the ``max_categories`` most frequent training values (others and
  unseen values are missing), multi-valued fields as 0/1 columns of the ``max_multi`` most
  frequent training items;
* every delayed-label aggregate column of the spec (e.g. the Handbook's terminal risk and fraud
  run), exactly the columns the transformer reads.

So it sees at least everything the transformer's row encoder sees (the transformer's
``amount_vs_history`` and ``time_since_prev`` are covered by ``ef_amount_z`` /
``ef_amount_vs_mean_*`` and ``ef_dt_prev_s``), plus per-entity window statistics the transformer
has to learn from the sequence.

Training: binary log-loss, ``scale_pos_weight = min(sqrt(n_neg / n_pos), 30)`` (the transformer's
``pos_weight``), early stopping on validation average precision. Ke et al., "LightGBM: A Highly
Efficient Gradient Boosting Decision Tree", NeurIPS 2017.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd

from engine.data.entity_features import causal_entity_features
from engine.data.spec import DatasetSpec, FieldKind


@dataclass
class BaselineConfig:
    """LightGBM settings of :class:`TabularBaseline` (stored with its results).

    Attributes:
        num_leaves / learning_rate / min_child_samples / feature_fraction: LightGBM parameters.
        n_estimators: maximum boosting rounds; ``early_stopping_rounds``: rounds without a
            validation-AP gain before stopping (0 = no early stopping).
        max_categories: categories kept per categorical field (most frequent in training).
        max_multi: items kept per multi-valued field (most frequent in training).
        seed: LightGBM seed. threads: LightGBM threads (None = LightGBM's default, the
            process's OpenMP thread count). Fixed at 2 by default: with ``deterministic`` on,
            LightGBM's model still depends on its thread count (histogram sums in another
            order), and the OpenMP count moves when torch sets its threads in the same process,
            so with None one seed gave TabFormer test AUC ROC 0.567 or 0.629 depending on what
            ran before it.
    """

    num_leaves: int = 31
    learning_rate: float = 0.05
    min_child_samples: int = 50
    feature_fraction: float = 0.8
    n_estimators: int = 1000
    early_stopping_rounds: int = 50
    max_categories: int = 256
    max_multi: int = 32
    seed: int = 0
    threads: int | None = 2


def _positional(x: pd.DataFrame) -> pd.DataFrame:
    """``x`` with its columns named ``f0, f1, ...`` for LightGBM, which refuses feature names with
    JSON characters (``, : " [ ] { }``): the names hold field values (a merchant "Uber, Trip:
    NYC"), and a name LightGBM refuses ended a whole ``train`` run in a traceback. The real names
    stay in :attr:`TabularBaseline.feature_names`, in the same order."""
    return x.set_axis([f"f{i}" for i in range(x.shape[1])], axis=1)


@dataclass
class TabularBaseline:
    """A fitted baseline: the vocabularies of its inputs and the booster.

    Use :meth:`fit` to build one and :meth:`predict` to score a canonical frame.

    Attributes:
        spec: the dataset spec the inputs were derived from.
        config: the LightGBM settings.
        categories: categorical field -> kept values (code = position).
        multi_items: multi-valued field -> kept items.
        feature_names: input columns in booster order.
        booster: the trained LightGBM booster; ``best_iteration`` its chosen round count.
    """

    spec: DatasetSpec
    config: BaselineConfig
    categories: dict[str, list[str]] = field(default_factory=dict)
    multi_items: dict[str, list[str]] = field(default_factory=dict)
    feature_names: list[str] = field(default_factory=list)
    booster: lgb.Booster | None = None
    best_iteration: int = 0

    # -- inputs ------------------------------------------------------------------------------
    def _inputs(self, frame: pd.DataFrame, entity_features: pd.DataFrame | None = None) -> pd.DataFrame:
        """The ``[N, features]`` input frame (float64 and category columns), same index as ``frame``."""
        ef = causal_entity_features(frame, self.spec) if entity_features is None else entity_features
        cols: dict[str, Any] = {c: ef[c].to_numpy() for c in ef.columns}
        amount = frame["amount"].to_numpy(np.float64)
        cols["amount"] = amount
        cols["log_abs_amount"] = np.log1p(np.abs(amount))
        for f in self.spec.fields_of(FieldKind.NUMERIC, model_inputs_only=True):
            cols[f"num_{f.name}"] = pd.to_numeric(frame[f.name], errors="coerce").to_numpy(np.float64)
        for f in self.spec.fields_of(FieldKind.CATEGORICAL, model_inputs_only=True):
            kept = self.categories[f.name]
            text = frame[f.name].astype(str)
            cols[f"cat_{f.name}"] = pd.Categorical(text.where(text.isin(kept)), categories=kept)
        for f in self.spec.fields_of(FieldKind.MULTI_VALUED, model_inputs_only=True):
            padded = "|" + frame[f.name].astype(str) + "|"  # items never hold "|" (engine.data.io)
            for it in self.multi_items[f.name]:
                cols[f"multi_{f.name}={it}"] = padded.str.contains(f"|{it}|", regex=False).to_numpy(np.float64)
        for agg in self.spec.aggregates:
            for c in agg.columns():
                cols[f"agg_{c}"] = frame[c].to_numpy(np.float64)
        return pd.DataFrame(cols, index=frame.index)

    def _fit_vocabularies(self, train: pd.DataFrame) -> None:
        cfg = self.config
        for f in self.spec.fields_of(FieldKind.CATEGORICAL, model_inputs_only=True):
            counts = train[f.name].astype(str).value_counts()
            self.categories[f.name] = sorted(counts.index[: cfg.max_categories].tolist())
        for f in self.spec.fields_of(FieldKind.MULTI_VALUED, model_inputs_only=True):
            items = train[f.name].astype(str).str.split("|").explode()
            items = items[items != ""]
            self.multi_items[f.name] = sorted(items.value_counts().index[: cfg.max_multi].tolist())

    # -- fit / predict -----------------------------------------------------------------------
    @classmethod
    def fit(
        cls,
        frame: pd.DataFrame,
        spec: DatasetSpec,
        split: np.ndarray,
        config: BaselineConfig | None = None,
    ) -> TabularBaseline:
        """Fit on the labelled rows with ``split == 0``, early-stop on those with ``split == 1``.
        Arguments and errors as :meth:`fit_predict`."""
        return cls._fit(frame, spec, split, config)[0]

    @classmethod
    def fit_predict(
        cls,
        frame: pd.DataFrame,
        spec: DatasetSpec,
        split: np.ndarray,
        rows: np.ndarray,
        config: BaselineConfig | None = None,
    ) -> tuple[TabularBaseline, np.ndarray]:
        """:meth:`fit`, then the fraud probabilities ``[len(rows)]`` float64 of the row positions
        ``rows``, from the inputs the fit already computed (the per-entity features are computed
        once, not again as :meth:`predict` would).

        Args:
            frame: canonical frame of the whole file (earlier periods are every row's history),
                with a ``label`` column (Int8: 1 fraud, 0 legit, <NA> unknown).
            spec: its dataset spec.
            split: ``[N]`` int8 per row: 0 train, 1 validation, other = history only (as in
                :func:`engine.model.train.time_split`).
            rows: positions in ``frame`` to score (e.g. the labelled test rows).
            config: LightGBM settings.

        Raises:
            ValueError: no label column, or no fraud among the labelled training rows.
        """
        model, x = cls._fit(frame, spec, split, config)
        return model, model._predict_inputs(x.iloc[np.asarray(rows)])

    @classmethod
    def _fit(
        cls,
        frame: pd.DataFrame,
        spec: DatasetSpec,
        split: np.ndarray,
        config: BaselineConfig | None = None,
    ) -> tuple[TabularBaseline, pd.DataFrame]:
        """The fitted model and its ``[N, features]`` input frame (see :meth:`fit_predict`)."""
        if "label" not in frame:
            raise ValueError("the baseline needs a label column (spec [label])")
        cfg = config or BaselineConfig()
        model = cls(spec=spec, config=cfg)
        label = frame["label"].to_numpy(dtype="float64", na_value=np.nan)
        known = ~np.isnan(label)
        tr = (np.asarray(split) == 0) & known
        va = (np.asarray(split) == 1) & known
        n_pos, n_neg = int((label[tr] == 1).sum()), int((label[tr] == 0).sum())
        if n_pos == 0:
            raise ValueError("baseline: the training period has no fraud-labelled transaction")
        model._fit_vocabularies(frame.loc[tr])
        x = model._inputs(frame)
        model.feature_names = list(x.columns)
        params = {
            "objective": "binary", "learning_rate": cfg.learning_rate, "num_leaves": cfg.num_leaves,
            "min_child_samples": cfg.min_child_samples, "feature_fraction": cfg.feature_fraction,
            "feature_fraction_seed": cfg.seed, "seed": cfg.seed, "deterministic": True,
            # LightGBM otherwise times row-wise against col-wise histograms at each fit and keeps
            # the faster: on a loaded machine the choice, and so the model, changed between runs
            "force_col_wise": True,
            "scale_pos_weight": min(math.sqrt(n_neg / n_pos), 30.0), "verbose": -1,
            "metric": "average_precision",
        }
        if cfg.threads:
            params["num_threads"] = cfg.threads
        dtrain = lgb.Dataset(_positional(x[tr]), label=label[tr])
        callbacks = []
        valid_sets = []
        if va.any() and 0 < label[va].sum() < va.sum() and cfg.early_stopping_rounds:
            valid_sets = [lgb.Dataset(_positional(x[va]), label=label[va], reference=dtrain)]
            callbacks.append(lgb.early_stopping(cfg.early_stopping_rounds, verbose=False))
        model.booster = lgb.train(params, dtrain, num_boost_round=cfg.n_estimators, valid_sets=valid_sets,
                                  callbacks=callbacks)
        model.best_iteration = int(model.booster.best_iteration or model.booster.current_iteration())
        return model, x

    def _predict_inputs(self, x: pd.DataFrame) -> np.ndarray:
        return self.booster.predict(_positional(x[self.feature_names]),
                                    num_iteration=self.best_iteration).astype(np.float64)

    def predict(self, frame: pd.DataFrame, rows: np.ndarray | None = None) -> np.ndarray:
        """Fraud probabilities ``[N]`` float64 (or ``[len(rows)]`` for the given row positions).

        ``frame`` must hold each row's history (the whole file): the features are computed on it
        and then selected.
        """
        if self.booster is None:
            raise ValueError("baseline: not fitted")
        x = self._inputs(frame)
        return self._predict_inputs(x if rows is None else x.iloc[np.asarray(rows)])

    def describe(self) -> dict[str, Any]:
        """JSON-able summary: config, rounds, number of inputs, the 10 inputs with most gain."""
        gain = {}
        if self.booster is not None:
            imp = self.booster.feature_importance("gain", iteration=self.best_iteration)
            gain = dict(sorted(zip(self.feature_names, map(float, imp)), key=lambda kv: -kv[1])[:10])
        return {"config": asdict(self.config), "best_iteration": self.best_iteration,
                "n_features": len(self.feature_names), "top_gain": gain}
