"""One case's report from the case store, the scored source and the explanations: the one path
the dashboard's "Prepare the exports" and ``fraudlens report`` both take (same inputs, same report).

:func:`case_report` gathers what :func:`engine.cases.report.build_report` needs from a
:class:`~engine.cases.store.CaseStore` (the case, its disposition history, notes and narrative,
the thresholds in force, the test-period threshold quality) and the scored source; the caller
supplies the explanations (the dashboard's cached ones, or the CLI's, read from the same
explanation cache when the dashboard already computed them).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from engine.cases.report.model import build_report, threshold_metrics


def case_report(store: Any, case: dict, *, entity_id: str, source: Any, bundle: Any, scores: pd.DataFrame,
                expls: dict, thresholds: dict, exported_by: str | None, file_label: str,
                max_rows: int | None = None, scored_at: str | None = None, trust: dict | None = None,
                fields: dict | None = None) -> dict[str, Any]:
    """The report model of ``case`` explained at the query of ``expls``.

    Args:
        store: the case store holding ``case`` (its history, notes and narrative are read now).
        case: the case row (``CaseStore.get_case``).
        entity_id: the case's raw entity id (only its pseudonym is written).
        source: the scored source (``engine.cases.view.Source``: ``frame``, ``spec``,
            ``file_sha256``, ``currency``).
        bundle: the model bundle (``meta``, ``sha256``, ``probability``).
        scores: ``engine.cases.view.score_source`` output for ``source`` (``entity_id``,
            ``transaction_id``, ``probability``; the model's output per transaction).
        expls: method -> Explanation of the query (``engine.cases.view.explain_query``).
        thresholds: ``review``, ``decline``, ``source`` in force
            (:func:`engine.cases.thresholds.thresholds_in_force`).
        exported_by: the signed-in user exporting (never a typed name).
        file_label: the data file's name as shown (only its base name is written).
        max_rows, scored_at, trust, fields: as :func:`engine.cases.report.build_report`.

    Raises:
        ValueError: ``expls`` has no explanation (from ``build_report``).
    """
    from engine.cases import view as cv
    from engine.cases.report.model import later_activity
    from engine.data.spec import source_spec_key

    ctx = cv.context_rows({k: v for k, v in expls.items() if hasattr(v, "transaction_ids")}, source.frame)
    mine = scores[scores["entity_id"].astype(str) == str(entity_id)]
    ids = mine["transaction_id"].astype(str)
    query = str(next(iter(v for v in expls.values() if hasattr(v, "query_transaction_id"))).query_transaction_id)
    anchor = store.audit_anchor()  # the log's head as the report is made: each report handed out is a copy
    rows = mine
    if "amount" not in rows and "amount" in source.frame:  # scores may not carry the amount
        amounts = source.frame.set_index(source.frame["transaction_id"].astype(str))["amount"]
        rows = rows.assign(amount=ids.map(amounts))
    return build_report(
        case=case, entity_id=entity_id, model=bundle,
        dataset={"spec": source_spec_key(source.spec), "file_name": str(file_label),
                 "file_sha256": source.file_sha256 or None, "max_rows": max_rows, "currency": source.currency},
        expls=expls, context=ctx, thresholds=thresholds,
        history=store.history(case["id"]), notes=store.notes(case["id"]), scored_at=scored_at,
        narrative=store.narrative(case["id"]),
        probabilities=dict(zip(ids, mine["probability"])),
        trust=trust, exported_by=exported_by, fields=fields,
        audit_anchor=None if anchor is None else anchor.as_dict(),
        later=later_activity(rows, query, float(thresholds["review"])) if (ids == query).any() else None,
        threshold_quality=threshold_metrics(scores, {"review": thresholds["review"],
                                                     "decline": thresholds["decline"]}, bundle.meta),
    )
