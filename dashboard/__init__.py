"""fraudlens dashboard (Streamlit). Pages call engine.case_view / engine.explain / engine.figures;
nothing here imports torch."""
