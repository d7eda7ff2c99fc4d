"""The PDF's "Does the history matter? Which fields?" section (report keys ``history_effect`` and
``field_attribution``, built by :func:`engine.cases.fields_view.query_fields`). Plain text only."""

from __future__ import annotations

from typing import Any, Callable


def _f(x: Any, spec: str = "{:+.3f}") -> str:
    return "-" if x is None else spec.format(x)


def pdf_fields(report: dict[str, Any], h2: Callable, para: Callable, table: Callable) -> None:
    """Write the section with the PDF writer's ``h2`` / ``para`` / ``table`` helpers; nothing when the
    report has neither key."""
    he, fa = report.get("history_effect"), report.get("field_attribution")
    if not he and not fa:
        return
    if he:
        h2("Does the history matter?")
        para(he["sentence"], 9)
        para(f"Alone (no earlier transaction): {he.get('word', 'score')} {_f(he['alone'], '{:.3f}')} · with its "
             f"history: {_f(he['with_history'], '{:.3f}')} · difference {_f(he['difference'])} · review threshold "
             f"{_f(he['threshold'], '{:.3f}')}.", 7.5)
    if fa:
        labels = {"integrated_gradients": "Integrated gradients", "field_shapley": "Field Shapley values",
                  "field_ablation": "Field ablation"}
        h2(f"The query's own fields ({labels.get(fa['shown'], fa['shown'])}, logits: + towards fraud)")
        para(fa["caption"], 7.5)
        para(f"Reference = a typical transaction on this history: score logit {_f(fa.get('reference_logit'))}, the "
             f"query {_f(fa.get('score_logit'))}. Sources: " + "; ".join(sorted(set((fa.get('reference_sources') or {})
                                                                                 .values()))) + ".", 7.5)
        vals, ref = fa.get("values") or [""] * len(fa["field_names"]), fa.get("reference") or {}
        order = sorted(range(len(fa["field_names"])), key=lambda i: -abs(fa["shown_values"][i] or 0.0))
        table(["Field", "Value", "Typical value", "Shown", "Ablation"],
              [[fa["field_names"][i], vals[i], ref.get(fa["field_names"][i], ""), _f(fa["shown_values"][i]),
                _f(fa["ablation"][i])] for i in order],
              [38, 50, 50, 26, 26])
        c = fa.get("cells")
        if c and c.get("cells"):
            lab, cv = fa.get("cell_labels") or {}, fa.get("cell_values") or {}
            para("Cell-level Shapley values (TimeSHAP cell level): fields of the earlier transactions whose removal "
                 "moves the score most, each cell replaced by its typical value in the input (the model recomputes "
                 "amount versus history), the rest of the history fixed.", 7.5)
            rows = [[lab.get(str(p), str(p)), f, cv.get(f"{p}:{f}", ""), _f(v)] for (p, f), v in zip(c["cells"], c["values"])]
            if c.get("other") is not None:
                rows.append(["", "other fields of these transactions", "", _f(c["other"])])
            table(["Transaction", "Field", "Value", "Shapley"], rows, [60, 45, 55, 30])
