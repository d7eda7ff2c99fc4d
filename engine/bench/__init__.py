"""Benchmarks against the Fraud Detection Handbook protocol.

Le Borgne, Siblini, Lebichot, Bontempi, "Reproducible Machine Learning for Credit Card
Fraud Detection - Practical Handbook", Université Libre de Bruxelles, 2022
(https://fraud-detection-handbook.github.io/fraud-detection-handbook/).

- :mod:`engine.bench.handbook_features` -- chapter 3.3 "Baseline feature transformation".
- :mod:`engine.bench.handbook_protocol` -- chapter 3.4 / 5.2 splits (``get_train_test_set``,
  prequential folds) and chapter 4.4 Card Precision@k.
- :mod:`engine.bench.gbt` -- LightGBM baseline tuned on the validation folds, evaluated on
  the test folds; ``evaluate_scores`` for any other model scored on the same folds.
- :mod:`engine.bench.published` -- the handbook's published test results.
"""
