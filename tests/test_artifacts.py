"""The tables of a run's Prefect artifacts (tasks/stages/artifacts.py): scores in percent, clickable links (the
ledger's table is the report's, tested in tests/test_report.py)."""

from __future__ import annotations

from privseed.tasks.stages.artifacts import _link, score_description, score_rows


def test_score_rows_are_percent_per_classifier():
    rows = score_rows({"tfidf": {"accuracy": 0.6234, "macro_f1": 0.5, "n_test": 2100}})
    assert rows == [{"classifier": "tfidf", "accuracy %": 62.3, "macro-F1 %": 50.0, "test documents": 2100}]


def test_links_are_clickable(tmp_path):
    assert _link("s3://bucket/releases/x") == "s3://bucket/releases/x"
    assert _link(str(tmp_path / "out")) == (tmp_path / "out").resolve().as_uri()


def test_the_scores_description_leads_with_the_warnings_and_carries_the_fidelity():
    result = {"n_train": 14, "n_test": 2100, "test_view": "phrases",
              "warnings": [{"classifier": "MLP", "kind": "one-class", "message": "MLP predicts one class (Film)."}],
              "prdc": {"precision": 0.451, "recall": 0.66, "density": 0.2, "coverage": 0.1},
              "privacy": "epsilon = 11, delta = 0"}
    text = score_description(result)
    assert text.startswith("**Warning:** MLP predicts one class (Film).")
    assert "14 documents of the synthetic release only, scored on 2100 real test documents (phrases)" in text
    assert "precision 0.45, recall 0.66, density 0.20, coverage 0.10" in text
    assert "epsilon = 11, delta = 0" in text
    assert "Warning" not in score_description({**result, "warnings": []})
