"""fraudlens engine: data, model, training, scoring and explanations (never imports streamlit)."""

__version__ = "0.1.0"
