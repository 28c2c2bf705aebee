"""The tables of a run's Prefect artifacts (tasks/stages/artifacts.py): scores in percent, clickable links (the
ledger's table is the report's, tested in tests/test_report.py)."""

from __future__ import annotations

from privseed.tasks.stages.artifacts import _link, score_rows


def test_score_rows_are_percent_per_classifier():
    rows = score_rows({"tfidf": {"accuracy": 0.6234, "macro_f1": 0.5, "n_test": 2100}})
    assert rows == [{"classifier": "tfidf", "accuracy %": 62.3, "macro-F1 %": 50.0, "test documents": 2100}]


def test_links_are_clickable(tmp_path):
    assert _link("s3://bucket/releases/x") == "s3://bucket/releases/x"
    assert _link(str(tmp_path / "out")) == (tmp_path / "out").resolve().as_uri()
