"""Serving the dashboard safely (no Streamlit here): who may sign in and what each role may do
(:mod:`engine.serve.access`), which server files the page may read and where uploads go
(:mod:`engine.serve.paths`), and the bind-address rule (:func:`engine.serve.access.check_bind`)."""
