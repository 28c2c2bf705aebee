"""The tables of a run's Prefect artifacts (tasks/stages/artifacts.py): one ledger row per stage, scores in percent."""

from __future__ import annotations

from privseed.tasks.stages.artifacts import _link, ledger_summary, score_rows


def test_ledger_summary_collapses_the_partitions_of_a_stage():
    entries = [{"name": f"kde/class={c}", "stage": "kde", "mechanism": "laplace", "epsilon": 10.0, "delta": 0.0}
               for c in range(14)]
    entries.append({"name": "vocabulary", "stage": "vocabulary", "mechanism": "discrete_laplace", "epsilon": 1.0,
                    "delta": 0.0})
    rows = ledger_summary(entries)
    assert rows == [{"stage": "kde", "mechanism": "laplace", "releases": 14, "epsilon": 10.0, "delta": 0.0},
                    {"stage": "vocabulary", "mechanism": "discrete_laplace", "releases": 1, "epsilon": 1.0,
                     "delta": 0.0}]


def test_ledger_summary_names_a_stage_of_mixed_mechanisms_and_keeps_its_largest_budget():
    rows = ledger_summary([{"name": "a", "stage": "s", "mechanism": "gaussian", "epsilon": 2.0, "delta": 1e-6},
                           {"name": "b", "stage": "s", "mechanism": "laplace", "epsilon": 3.0, "delta": 0.0}])
    assert rows == [{"stage": "s", "mechanism": "mixed", "releases": 2, "epsilon": 3.0, "delta": 1e-6}]


def test_score_rows_are_percent_per_classifier():
    rows = score_rows({"tfidf": {"accuracy": 0.6234, "macro_f1": 0.5, "n_test": 2100}})
    assert rows == [{"classifier": "tfidf", "accuracy %": 62.3, "macro-F1 %": 50.0, "test documents": 2100}]


def test_links_are_clickable(tmp_path):
    assert _link("s3://bucket/releases/x") == "s3://bucket/releases/x"
    assert _link(str(tmp_path / "out")) == (tmp_path / "out").resolve().as_uri()
