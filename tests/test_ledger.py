import json

import numpy as np
import pytest

from tasks.errors import LedgerMismatchError
from tasks.ledger import PrivacyLedger, stage_rng


def counter_draw(calls, value=1.0):
    def draw():
        calls.append(1)
        return {"noisy": np.full(3, value) + np.random.default_rng(len(calls)).normal(size=3)}
    return draw


def test_stage_rng_streams_are_reproducible_and_independent():
    a = stage_rng(7, "kde", "noise").normal(size=4)
    assert np.array_equal(a, stage_rng(7, "kde", "noise").normal(size=4))
    assert not np.allclose(a, stage_rng(7, "kde", "features").normal(size=4))
    assert not np.allclose(a, stage_rng(8, "kde", "noise").normal(size=4))


def test_value_is_drawn_once_and_reread_across_ledger_instances(tmp_path):
    calls = []
    params = {"sensitivity": 10, "epsilon": 1.0}
    first = PrivacyLedger(str(tmp_path), "fp", "r1").draw_once(
        "histogram", mechanism="laplace", params=params, epsilon=1.0, stage="vocabulary", draw=counter_draw(calls))
    again = PrivacyLedger(str(tmp_path), "fp", "r1")  # a retry or a resumed run
    second = again.draw_once("histogram", mechanism="laplace", params=params, epsilon=1.0, stage="vocabulary",
                             draw=counter_draw(calls, value=99.0))
    assert len(calls) == 1 and np.array_equal(first["noisy"], second["noisy"])
    assert again.total() == (1.0, 0.0)


def test_same_name_other_parameters_is_refused(tmp_path):
    ledger = PrivacyLedger(str(tmp_path), "fp", "r1")
    ledger.draw_once("sketch", mechanism="laplace", params={"I": 300}, epsilon=1.0, draw=counter_draw([]))
    with pytest.raises(LedgerMismatchError, match="params"):
        ledger.draw_once("sketch", mechanism="laplace", params={"I": 1000}, epsilon=1.0, draw=counter_draw([]))
    with pytest.raises(LedgerMismatchError, match="epsilon"):
        ledger.draw_once("sketch", mechanism="laplace", params={"I": 300}, epsilon=2.0, draw=counter_draw([]))
    with pytest.raises(LedgerMismatchError, match="mechanism"):
        ledger.draw_once("sketch", mechanism="gaussian", params={"I": 300}, epsilon=1.0, draw=counter_draw([]))


def test_another_dataset_cannot_use_the_run(tmp_path):
    PrivacyLedger(str(tmp_path), "fp-a", "r1").charge("c", mechanism="laplace", params={}, epsilon=1.0)
    with pytest.raises(LedgerMismatchError, match="another dataset"):
        PrivacyLedger(str(tmp_path), "fp-b", "r1")


def test_composition_sums_stages_and_takes_max_over_classes(tmp_path):
    ledger = PrivacyLedger(str(tmp_path), "fp", "r1")
    ledger.draw_once("voc", mechanism="laplace", params={}, epsilon=1.0, stage="vocabulary", draw=counter_draw([]))
    for label in ("a", "b", "c"):  # per-class sketches: disjoint documents, parallel composition
        for block in range(4):  # ensemble of 4 sketches per class: basic composition within a class
            ledger.draw_once(f"kde-{label}-{block}", mechanism="laplace", params={}, epsilon=2.5,
                             stage="kde", partition=label, draw=counter_draw([]))
    assert ledger.total() == pytest.approx((11.0, 0.0))
    ledger.charge("pe-schedule", mechanism="gaussian", params={"sigma": 3.0, "T": 10}, epsilon=4.0, delta=1e-5)
    ledger.charge("pe-schedule", mechanism="gaussian", params={"sigma": 3.0, "T": 10}, epsilon=4.0, delta=1e-5)
    assert ledger.total() == pytest.approx((15.0, 1e-5))


def test_crash_between_draw_and_record_reuses_the_value(tmp_path, monkeypatch):
    ledger = PrivacyLedger(str(tmp_path), "fp", "r1")
    calls = []

    def crash(record):
        raise KeyboardInterrupt

    monkeypatch.setattr(ledger, "_write_entry", crash)
    with pytest.raises(KeyboardInterrupt):
        ledger.draw_once("h", mechanism="laplace", params={"a": 1}, epsilon=1.0, draw=counter_draw(calls))
    resumed = PrivacyLedger(str(tmp_path), "fp", "r1")
    resumed.draw_once("h", mechanism="laplace", params={"a": 1}, epsilon=1.0, draw=counter_draw(calls))
    assert len(calls) == 1 and resumed.total() == (1.0, 0.0)


def test_state_dict_round_trip_and_refusals(tmp_path):
    ledger = PrivacyLedger(str(tmp_path / "a"), "fp", "r1")
    ledger.charge("c", mechanism="laplace", params={"x": 1}, epsilon=0.5)
    state = ledger.state_dict()
    fresh = PrivacyLedger(str(tmp_path / "b"), "fp", "r1")
    fresh.load_state_dict(state)
    assert fresh.total() == (0.5, 0.0)
    with pytest.raises(LedgerMismatchError, match="another dataset"):
        PrivacyLedger(str(tmp_path / "c"), "other", "r1").load_state_dict(state)
    with pytest.raises(LedgerMismatchError, match="format"):
        fresh.load_state_dict({**state, "format": "opacus-rdp"})
    with pytest.raises(LedgerMismatchError, match="belongs to run"):
        PrivacyLedger(str(tmp_path / "d"), "fp", "r2").load_state_dict(state)


def test_published_json_lists_entries_total_and_previous_runs(tmp_path):
    PrivacyLedger(str(tmp_path), "fp", "old").charge("c", mechanism="laplace", params={}, epsilon=2.0)
    ledger = PrivacyLedger(str(tmp_path), "fp", "new")
    ledger.charge("c", mechanism="laplace", params={}, epsilon=1.0)
    document = json.loads(ledger.to_json())
    assert document["total"]["epsilon"] == 1.0
    assert document["previous_runs"] == [{"run_id": "old", "epsilon": 2.0, "delta": 0.0}]
    assert document["entries"][0]["dataset_fingerprint"] == "fp"
