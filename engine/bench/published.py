"""The Fraud Detection Handbook's published test results on its simulated data.

Source: Y.-A. Le Borgne, W. Siblini, B. Lebichot, G. Bontempi, "Reproducible Machine Learning
for Credit Card Fraud Detection - Practical Handbook", Université Libre de Bruxelles, 2022,
Chapter 7 "Deep learning", Section 7.4 "Sequential models and representation learning",
subsection "Benchmark summary", table ``summary_test_performances`` (notebook
``Chapter_7_DeepLearning/SequentialModeling.ipynb``). It gathers the model-selection results of
Chapter 5, Section 5.3 (decision tree, logistic regression, random forest, XGBoost), Chapter 7,
Section 7.2 (feed-forward network) and Section 7.4 (CNN, LSTM, LSTM with attention).

Each value is the mean over the 4 prequential test folds (training starts 2018-08-15, -08-08,
-08-01, -07-25) of the model whose hyper-parameters were best *on the validation folds for that
metric* (the handbook's ``get_summary_performances``, row "Test performance"), so the three
metrics of one model may come from different hyper-parameters. The +/- is the std over folds as
printed by the handbook (rounded to 2 decimals there).
"""

from __future__ import annotations

from dataclasses import dataclass

SOURCE = (
    "Le Borgne, Siblini, Lebichot, Bontempi, 'Reproducible Machine Learning for Credit Card "
    "Fraud Detection - Practical Handbook' (ULB, 2022), Chapter 7, Section 7.4 'Sequential "
    "models and representation learning', 'Benchmark summary' table (summary_test_performances)"
)
URL = (
    "https://fraud-detection-handbook.github.io/fraud-detection-handbook/"
    "Chapter_7_DeepLearning/SequentialModeling.html"
)


@dataclass(frozen=True)
class PublishedResult:
    """Mean (and std) over the handbook's 4 test folds for one model."""

    model: str
    chapter: str
    auc_roc: float
    auc_roc_std: float
    average_precision: float
    average_precision_std: float
    card_precision_100: float
    card_precision_100_std: float

    def as_dict(self) -> dict[str, float]:
        return {
            "AUC ROC": self.auc_roc,
            "Average precision": self.average_precision,
            "Card Precision@100": self.card_precision_100,
        }


DECISION_TREE = PublishedResult("Decision tree", "5.3", 0.797, 0.01, 0.579, 0.01, 0.284, 0.0)
LOGISTIC_REGRESSION = PublishedResult(
    "Logistic regression", "5.3", 0.868, 0.02, 0.623, 0.02, 0.297, 0.01
)
RANDOM_FOREST = PublishedResult("Random forest", "5.3", 0.870, 0.02, 0.678, 0.01, 0.299, 0.01)
XGBOOST = PublishedResult("XGBoost", "5.3", 0.869, 0.01, 0.687, 0.01, 0.303, 0.01)
FEED_FORWARD_NN = PublishedResult(
    "Feed-forward neural network", "7.2", 0.876, 0.01, 0.675, 0.01, 0.303, 0.02
)
CNN = PublishedResult("1D-CNN", "7.4", 0.872, 0.01, 0.599, 0.01, 0.288, 0.01)
LSTM = PublishedResult("LSTM", "7.4", 0.876, 0.02, 0.665, 0.02, 0.297, 0.01)
LSTM_ATTENTION = PublishedResult("LSTM with attention", "7.4", 0.874, 0.02, 0.667, 0.01, 0.295, 0.01)

#: The baselines the fraudlens benches compare with (strongest classical and deep models).
PUBLISHED_TEST_RESULTS: tuple[PublishedResult, ...] = (
    XGBOOST,
    RANDOM_FOREST,
    FEED_FORWARD_NN,
    LSTM,
    LSTM_ATTENTION,
)

#: Every column of the handbook's table.
ALL_PUBLISHED_TEST_RESULTS: tuple[PublishedResult, ...] = (
    DECISION_TREE,
    LOGISTIC_REGRESSION,
    RANDOM_FOREST,
    XGBOOST,
    FEED_FORWARD_NN,
    CNN,
    LSTM,
    LSTM_ATTENTION,
)
