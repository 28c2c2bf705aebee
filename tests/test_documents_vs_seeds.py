"""The recipient's comparison of a release's documents with its own seeds (tasks/evaluation/evaluation.py), per
class too."""
from __future__ import annotations

import pandas as pd
import pytest

from privseed.tasks.evaluation.evaluation import documents_and_seeds_predictions, documents_vs_seeds, recall_by_class


def test_recall_by_class_is_each_true_class_share_predicted_right():
    assert recall_by_class([0, 0, 1, 1, 1, 2], [0, 1, 1, 1, 0, 0]) == pytest.approx({"0": 0.5, "1": 2 / 3, "2": 0.0})


def test_the_per_class_figures_come_from_the_same_two_classifiers_as_the_accuracies():
    rows = pd.DataFrame({
        "label": ["a"] * 4 + ["b"] * 4,
        "keyphrases": [["album", "studio"]] * 4 + [["painter", "canvas"]] * 4,
        "text": ["an album recorded in a studio"] * 4 + ["a painter who works on canvas"] * 4})
    test = pd.DataFrame({"label": ["a", "a", "b", "b"],
                         "text": ["the album studio", "a studio album", "the painter canvas", "a studio painter"]})
    docs, seeds = documents_and_seeds_predictions(rows, test)
    docs_accuracy, seeds_accuracy = documents_vs_seeds(rows, test)
    for predicted, accuracy in ((docs, docs_accuracy), (seeds, seeds_accuracy)):
        recall = recall_by_class(test["label"], predicted)
        assert set(recall) == {"a", "b"}
        assert (recall["a"] + recall["b"]) / 2 == pytest.approx(accuracy)  # two test documents a class
    assert recall_by_class(test["label"], seeds)["a"] == 1.0
