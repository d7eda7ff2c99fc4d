"""fraudlens dashboard (Streamlit). Pages call engine.cases.view / engine.explain / engine.cases.figures;
nothing here imports torch."""
