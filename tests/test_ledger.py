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


def test_another_corpus_cannot_use_the_run(tmp_path):
    PrivacyLedger(str(tmp_path), "id-a", "r1").charge("c", mechanism="laplace", params={}, epsilon=1.0)
    with pytest.raises(LedgerMismatchError, match="another corpus") as refused:
        PrivacyLedger(str(tmp_path), "id-b", "r1")
    assert "id-a" not in str(refused.value) and "id-b" not in str(refused.value)  # no identity in messages


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

    monkeypatch.setattr(ledger, "_commit_entry", crash)
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
    with pytest.raises(LedgerMismatchError, match="another corpus"):
        PrivacyLedger(str(tmp_path / "c"), "other", "r1").load_state_dict(state)
    with pytest.raises(LedgerMismatchError, match="format"):
        fresh.load_state_dict({**state, "format": "opacus-rdp"})
    with pytest.raises(LedgerMismatchError, match="belongs to run"):
        PrivacyLedger(str(tmp_path / "d"), "fp", "r2").load_state_dict(state)


def test_recipient_json_has_the_run_only_and_no_identity(tmp_path):
    PrivacyLedger(str(tmp_path), "id-secret", "old").charge("c", mechanism="laplace", params={}, epsilon=2.0)
    ledger = PrivacyLedger(str(tmp_path), "id-secret", "new")
    ledger.draw_once("v", mechanism="laplace", params={"S": 10}, epsilon=1.0, stage="vocabulary",
                     draw=counter_draw([]))
    text = ledger.to_json()
    document = json.loads(text)
    assert document["total"]["epsilon"] == 1.0 and document["run_id"] == "new"
    assert "id-secret" not in text and "previous_runs" not in document and "old" not in text
    assert set(document["entries"][0]) >= {"name", "mechanism", "params", "epsilon", "delta", "sensitivity"}
    assert not {"data_identity", "value", "created_at"} & set(document["entries"][0])
    owner = json.loads(ledger.owner_json())  # the owner's view keeps everything, in the private state
    assert owner["data_identity"] == "id-secret" and owner["cumulative"]["epsilon"] == pytest.approx(3.0)


def _identity(rows):
    from tasks.identity import DataIdentity

    return DataIdentity(f"id-{min(rows)}-{max(rows)}", np.array(sorted(rows), dtype=np.uint64))


def test_cumulative_total_composes_overlapping_runs_and_parallelises_disjoint_ones(tmp_path):
    def run(run_id, rows, epsilon):
        ledger = PrivacyLedger(str(tmp_path), _identity(rows), run_id)
        ledger.charge("c", mechanism="laplace", params={}, epsilon=epsilon)
        return ledger

    run("a", [1, 2, 3], 1.0)
    run("b", [10, 11], 2.0)  # disjoint from a: parallel
    assert PrivacyLedger(str(tmp_path), "x", "view").cumulative_total()["epsilon"] == pytest.approx(2.0)
    last = run("c", [3, 4, 10], 0.5)  # D plus new rows shares a row with a and with b: everything composes
    cumulative = last.cumulative_total()
    assert cumulative["epsilon"] == pytest.approx(3.5) and sorted(cumulative["groups"][0]) == ["a", "b", "c"]
    run("d", [7], 5.0)  # a plain identity string (no rows) would be taken to overlap everything
    assert last.cumulative_total()["epsilon"] == pytest.approx(5.0)
    PrivacyLedger(str(tmp_path), "no-rows", "e").charge("c", mechanism="laplace", params={}, epsilon=0.25)
    assert last.cumulative_total()["epsilon"] == pytest.approx(3.5 + 5.0 + 0.25)


def test_a_value_stored_for_another_corpus_is_refused(tmp_path):
    """A value drawn for corpus A before a crash is never recorded as corpus B's under the same run id."""
    ledger = PrivacyLedger(str(tmp_path), "id-a", "r1")
    ledger.draw_once("h", mechanism="laplace", params={"a": 1}, epsilon=1.0, draw=counter_draw([]))
    run = tmp_path / "runs" / "r1"
    (run / "entries" / "h.json").unlink()  # crashed before recording
    (run / "run.json").unlink()  # and nothing else tells the corpora apart but the value itself
    calls = []
    with pytest.raises(LedgerMismatchError, match="another corpus"):
        PrivacyLedger(str(tmp_path), "id-b", "r1").draw_once("h", mechanism="laplace", params={"a": 1}, epsilon=1.0,
                                                              draw=counter_draw(calls))
    assert calls == []


def _race(state: str, barrier_file: str, out_file: str) -> None:
    """One racing process: wait for the start signal, then draw once and write what it got."""
    import os
    import time

    while not os.path.exists(barrier_file):
        time.sleep(0.001)
    ledger = PrivacyLedger(state, "id", "shared-run")
    value = ledger.draw_once("h", mechanism="laplace", params={"a": 1}, epsilon=1.0,
                             draw=lambda: {"noisy": np.random.default_rng().normal(size=4)})
    np.save(out_file, value["noisy"])


def test_draw_once_is_exclusive_across_processes(tmp_path):
    """Two processes with one run id race for the same release: one value is stored, both return it, and the
    ledger records one charge."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    for attempt in range(5):
        state, barrier = str(tmp_path / f"state{attempt}"), str(tmp_path / f"go{attempt}")
        outs = [str(tmp_path / f"out{attempt}-{i}.npy") for i in range(2)]
        procs = [context.Process(target=_race, args=(state, barrier, out)) for out in outs]
        for p in procs:
            p.start()
        (tmp_path / f"go{attempt}").touch()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        a, b = (np.load(out) for out in outs)
        assert np.array_equal(a, b)
        stored = PrivacyLedger(state, "id", "shared-run")
        assert stored.total() == (1.0, 0.0) and len(stored.entries()) == 1
        assert np.array_equal(stored.draw_once("h", mechanism="laplace", params={"a": 1}, epsilon=1.0,
                                               draw=lambda: {"noisy": np.zeros(4)})["noisy"], a)


def test_the_loser_of_a_race_returns_the_winners_value(tmp_path):
    """Deterministic interleaving of the race above: the second process stores its value only after the first
    one stored its own, between its existence check and its write. It must discard its draw and return the
    stored one (a plain overwrite would release two values for one name)."""
    winner = PrivacyLedger(str(tmp_path), "id", "r1")
    loser = PrivacyLedger(str(tmp_path), "id", "r1")
    won = {}

    def draw_while_the_other_process_wins():
        won.update(winner.draw_once("h", mechanism="laplace", params={"a": 1}, epsilon=1.0,
                                    draw=lambda: {"noisy": np.full(3, 1.0)}))
        return {"noisy": np.full(3, 2.0)}

    got = loser.draw_once("h", mechanism="laplace", params={"a": 1}, epsilon=1.0, draw=draw_while_the_other_process_wins)
    assert np.array_equal(got["noisy"], won["noisy"]) and np.array_equal(got["noisy"], np.full(3, 1.0))
    assert PrivacyLedger(str(tmp_path), "id", "r1").total() == (1.0, 0.0)


def test_create_exclusive_keeps_the_first_object(tmp_path):
    from tasks import storage

    uri = str(tmp_path / "sub" / "x.bin")
    assert storage.create_exclusive(uri, b"first") is True
    assert storage.create_exclusive(uri, b"second") is False
    assert storage.read_bytes(uri) == b"first"
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["x.bin"]  # no temporary file left behind


def test_create_exclusive_on_s3_is_a_conditional_put(s3_bucket):
    """On S3 the create-if-absent is one PUT with If-None-Match: * (s3fs mode="create"); the moto server
    refuses the second one, so the first object stays and the ledger's race logic holds on object storage."""
    from tasks import storage

    uri = f"{s3_bucket.url}/state/x.bin"
    assert storage.create_exclusive(uri, b"first") is True
    assert storage.create_exclusive(uri, b"second") is False
    assert s3_bucket.get("state/x.bin") == b"first"
    ledger = PrivacyLedger(f"{s3_bucket.url}/state", "id", "r1")
    value = ledger.draw_once("h", mechanism="laplace", params={}, epsilon=1.0, draw=lambda: {"v": np.ones(2)})
    again = PrivacyLedger(f"{s3_bucket.url}/state", "id", "r1").draw_once(
        "h", mechanism="laplace", params={}, epsilon=1.0, draw=lambda: {"v": np.zeros(2)})
    assert np.array_equal(value["v"], again["v"])
