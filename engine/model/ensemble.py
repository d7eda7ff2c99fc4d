"""A seed ensemble: ``K`` transformers of one configuration, trained from different seeds on the
same inputs, scored as one model by their **mean logit**.

Why: on the small labelled files the seed-to-seed spread of one training run is the largest term
of the test AP (demo validation AP 0.911-0.974 over 5 seeds); the mean logit of 5 seeds was
+0.02-0.03 validation AP above its members' mean (bench/results/recipe_probe.md). Averaging
independently trained networks is the classical variance reduction (Hansen & Salamon 1990,
"Neural network ensembles", IEEE TPAMI 12(10); Lakshminarayanan et al. 2017, "Simple and
Scalable Predictive Uncertainty Estimation using Deep Ensembles", arXiv:1612.01474).

:class:`SeedEnsemble` has :class:`~engine.model.transformer.FraudTransformer`'s interface, so
every scorer and explainer runs on it unchanged:

* ``forward`` / ``logits_from`` / ``query_logits``: the mean of the members' logits ``[B, T]``.
* ``embed``: the members' per-field embeddings **concatenated along the width**,
  ``[B, T, F, K*D]`` (member ``k`` owns columns ``k*D .. (k+1)*D - 1``); ``forward_from_embeddings``
  and ``query_logits(field_embeddings=...)`` split it back. Integrated Gradients over this joint
  input is the mean of the members' IG (IG is linear in the function, Sundararajan et al. 2017,
  arXiv:1703.01365, "linearity" axiom; the path interpolates every member's embedding at once),
  and its completeness holds for the mean logit.
* ``output_attentions``: per layer the members' mean attention ``[B, H, T, T]`` (each row still
  sums to 1), so attention rollout reads the ensemble's average mixing.

Dimensions: ``B`` batch, ``T`` transactions, ``F`` fields, ``D`` width of one member, ``K`` members.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from engine.model.sequences import TransactionBatch
from engine.model.transformer import FraudTransformer, ModelConfig, ScoreOutput


def member_config(cfg: ModelConfig) -> ModelConfig:
    """The configuration of one member of ``cfg``'s ensemble (``n_members`` 1)."""
    return replace(cfg, n_members=1)


def member_seed(seed: int, k: int, n_members: int) -> int:
    """Initialisation and sampling seed of member ``k`` of an ensemble trained with ``seed``:
    ``seed * n_members + k`` (member 0 of a one-member run is ``seed`` itself, and the members of
    runs with different seeds never share a seed)."""
    return seed * n_members + k


class SeedEnsemble(nn.Module):
    """``K`` :class:`FraudTransformer` members scored by their mean logit (module docstring).

    Args:
        cfg: the ensemble's config (``cfg.n_members = K >= 2``); every member is built from
            :func:`member_config` of it.
        members: optional ``K`` trained members (their configs must equal ``member_config(cfg)``).
    Raises:
        ValueError: ``n_members < 2``, or ``members`` of the wrong count or configuration.
    """

    def __init__(self, cfg: ModelConfig, members: list[FraudTransformer] | None = None):
        super().__init__()
        if cfg.n_members < 2:
            raise ValueError(f"n_members: expected >= 2 for a SeedEnsemble, got {cfg.n_members}")
        one = member_config(cfg)
        if members is None:
            members = [FraudTransformer(one) for _ in range(cfg.n_members)]
        if len(members) != cfg.n_members:
            raise ValueError(f"members: expected {cfg.n_members}, got {len(members)}")
        for k, m in enumerate(members):
            if m.cfg != one:
                raise ValueError(f"members[{k}]: expected the ensemble's member configuration, got a different one")
        self.cfg = cfg
        self.members = nn.ModuleList(members)

    # ------------------------------------------------------------------ scoring
    def forward(
        self, batch: TransactionBatch, output_attentions: bool = False, output_field_embeddings: bool = False
    ) -> ScoreOutput:
        """Mean logit ``[B, T]`` of the members (+ mean attentions ``L x [B, H, T, T]`` and the
        joint field embeddings ``[B, T, F, K*D]`` when asked)."""
        outs = [m(batch, output_attentions=output_attentions, output_field_embeddings=output_field_embeddings)
                for m in self.members]
        logits = torch.stack([o.logits for o in outs]).mean(0)  # [K, B, T] -> [B, T]
        att = self._mean_attentions([o.attentions for o in outs]) if output_attentions else None
        fe = torch.cat([o.field_embeddings for o in outs], dim=-1) if output_field_embeddings else None
        return ScoreOutput(logits=logits, attentions=att, field_embeddings=fe)

    def embed(self, batch: TransactionBatch) -> torch.Tensor:
        """Joint per-field input embeddings ``[B, T, F, K*D]`` float32 (what IG attributes to)."""
        return torch.cat([m.embed(batch) for m in self.members], dim=-1)

    def split_embeddings(self, field_embeddings: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``[..., K*D]`` joint embeddings -> ``K`` views ``[..., D]``, one per member.

        Raises:
            ValueError: the last dimension is not ``K * D``."""
        K, D = self.cfg.n_members, self.cfg.d_model
        if field_embeddings.shape[-1] != K * D:
            raise ValueError(f"field_embeddings: expected last dimension {K} x {D} = {K * D}, "
                             f"got {field_embeddings.shape[-1]}")
        return field_embeddings.split(D, dim=-1)

    def forward_from_embeddings(self, field_embeddings: torch.Tensor, batch: TransactionBatch,
                                output_attentions: bool = False):
        """``(mean logits [B, T], mean attentions | None)`` from joint embeddings ``[B, T, F, K*D]``
        (``B`` may be a multiple of ``batch``'s, as :meth:`FraudTransformer.forward_from_embeddings`)."""
        outs = [m.forward_from_embeddings(x, batch, output_attentions=output_attentions)
                for m, x in zip(self.members, self.split_embeddings(field_embeddings))]
        logits = torch.stack([lg for lg, _ in outs]).mean(0)
        return logits, (self._mean_attentions([a for _, a in outs]) if output_attentions else None)

    def logits_from(self, batch: TransactionBatch, start: int) -> torch.Tensor:
        """Mean logits ``[B, T - start]`` of positions ``start..T-1`` (:meth:`FraudTransformer.logits_from`)."""
        return torch.stack([m.logits_from(batch, start) for m in self.members]).mean(0)

    def query_logits(self, batch: TransactionBatch, present: torch.Tensor | None = None,
                     field_embeddings: torch.Tensor | None = None) -> torch.Tensor:
        """Mean logit ``[n]`` of the last position (:meth:`FraudTransformer.query_logits`);
        ``field_embeddings`` are joint ``[n, T, F, K*D]``."""
        if field_embeddings is None:
            return torch.stack([m.query_logits(batch, present) for m in self.members]).mean(0)
        parts = self.split_embeddings(field_embeddings)
        return torch.stack([m.query_logits(batch, present, field_embeddings=x)
                            for m, x in zip(self.members, parts)]).mean(0)

    @staticmethod
    def _mean_attentions(per_member: list[tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
        """``K`` tuples of ``L x [B, H, T, T]`` -> one tuple of the per-layer means."""
        return tuple(torch.stack(layer).mean(0) for layer in zip(*per_member))

    attention_mask = staticmethod(FraudTransformer.attention_mask)

    def n_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def model_from_config(cfg: ModelConfig) -> FraudTransformer | SeedEnsemble:
    """An untrained model of ``cfg``: a :class:`SeedEnsemble` when ``cfg.n_members > 1``, else a
    :class:`FraudTransformer` (sizes are those the config's checks bound)."""
    return SeedEnsemble(cfg) if cfg.n_members > 1 else FraudTransformer(cfg)


def members_of(model) -> list[FraudTransformer]:
    """The member transformers of ``model`` (itself alone when it is not an ensemble)."""
    return list(model.members) if isinstance(model, SeedEnsemble) else [model]
