import json

import numpy as np
import pytest

from privseed.tasks.errors import LedgerMismatchError, PrivseedError
from privseed.tasks.dp.ledger import PrivacyLedger, public_rng
from privseed.tasks.dp.mechanisms import (INSECURE_STAMP, GaussianMechanism, LaplaceMechanism, insecure_noise,
                                          secure_noise)
from tests.noise_checks import assert_noise_is

LAPLACE = LaplaceMechanism(sensitivity=10.0, epsilon=1.0)
SECURE = secure_noise()


def counted(calls, value=None):
    """An ``exact`` callable that counts how often the ledger asks for the private value."""
    def exact():
        calls.append(1)
        return np.zeros(50) if value is None else value
    return exact


def test_public_rng_streams_are_reproducible_and_independent():
    a = public_rng(7, "kde", "features").normal(size=4)
    assert np.array_equal(a, public_rng(7, "kde", "features").normal(size=4))
    assert not np.allclose(a, public_rng(7, "kde", "sample").normal(size=4))
    assert not np.allclose(a, public_rng(8, "kde", "features").normal(size=4))


def test_public_randomness_cannot_be_a_mechanisms_noise(tmp_path):
    ledger = PrivacyLedger(str(tmp_path), "fp", "r1")
    with pytest.raises(TypeError, match="public randomness"):
        ledger.draw_once("h", mechanism=LAPLACE, noise=public_rng(0, "noise"), params={}, exact=counted([]))
    with pytest.raises(TypeError, match="public randomness"):
        LAPLACE.release(np.zeros(3), np.random.default_rng(0))
    with pytest.raises(TypeError, match="mechanism object"):
        ledger.draw_once("h", mechanism="laplace", noise=SECURE, params={}, exact=counted([]))
    assert ledger.entries() == []


def test_the_ledger_applies_the_mechanism_and_records_what_it_reports(tmp_path):
    ledger = PrivacyLedger(str(tmp_path), "fp", "r1")
    exact = np.arange(2000, dtype=np.int64) % 7
    released = ledger.draw_once("histogram", mechanism=LaplaceMechanism(sensitivity=10, epsilon=2.0), noise=SECURE,
                                params={"S": 10}, exact=lambda: exact, stage="vocabulary",
                                postprocess=lambda noisy: {"top": np.argsort(-noisy)[:5]})
    noise = released["noisy"] - exact
    assert released["noisy"].dtype == np.int64 and np.count_nonzero(noise) > 1500  # noise on every coordinate
    assert_noise_is(noise, "discrete-laplace", 5.0)  # b = S / eps = 5
    np.testing.assert_array_equal(released["top"], np.argsort(-released["noisy"])[:5])
    entry = ledger.entries()[0]
    assert (entry["mechanism"], entry["epsilon"], entry["delta"], entry["sensitivity"], entry["scale"]) == \
        ("laplace", 2.0, 0.0, 10.0, 5.0)
    assert entry["secure"] is True and entry["noise_source"] == "opendp" and entry["charged"] is True
    assert entry["guarantee"]["input_metric"] == "l1_distance"
    assert "seed" not in entry and ledger.noise_report() == {"secure": True, "insecure_entries": [],
                                                             "unverified_entries": []}


def test_value_is_drawn_once_and_reread_across_ledger_instances(tmp_path):
    calls = []
    first = PrivacyLedger(str(tmp_path), "fp", "r1").draw_once(
        "histogram", mechanism=LAPLACE, noise=SECURE, params={"S": 10}, stage="vocabulary", exact=counted(calls))
    again = PrivacyLedger(str(tmp_path), "fp", "r1")  # a retry or a resumed run
    second = again.draw_once("histogram", mechanism=LAPLACE, noise=SECURE, params={"S": 10}, stage="vocabulary",
                             exact=counted(calls))
    assert len(calls) == 1 and np.array_equal(first["noisy"], second["noisy"])
    assert again.total() == (1.0, 0.0)


def test_two_runs_with_the_same_parameters_draw_different_noise(tmp_path):
    values = [PrivacyLedger(str(tmp_path), "fp", run).draw_once(
        "histogram", mechanism=LAPLACE, noise=SECURE, params={"S": 10}, exact=counted([]))["noisy"]
        for run in ("r1", "r2")]
    assert not np.array_equal(values[0], values[1])


def test_insecure_noise_repeats_and_stamps_the_ledger(tmp_path):
    noise = insecure_noise(0, "vocabulary")
    values = []
    for run in ("r1", "r2"):
        ledger = PrivacyLedger(str(tmp_path), "fp", run)
        drawn = ledger.draw_once("histogram", mechanism=LAPLACE, noise=noise, params={}, exact=counted([]))
        values.append(drawn["noisy"])
    np.testing.assert_array_equal(values[0], values[1])
    assert not ledger.is_secure()
    document = json.loads(ledger.to_json())
    assert document["stamp"] == INSECURE_STAMP and document["total"]["secure"] is False
    assert document["noise"]["insecure_entries"] == ["histogram"]
    # re-reading an insecure value as if it were secure is refused: the record would lie
    with pytest.raises(LedgerMismatchError, match="secure"):
        ledger.draw_once("histogram", mechanism=LAPLACE, noise=SECURE, params={}, exact=counted([]))


def test_same_name_other_parameters_is_refused(tmp_path):
    ledger = PrivacyLedger(str(tmp_path), "fp", "r1")
    ledger.draw_once("sketch", mechanism=LAPLACE, noise=SECURE, params={"I": 300}, exact=counted([]))
    with pytest.raises(LedgerMismatchError, match="params"):
        ledger.draw_once("sketch", mechanism=LAPLACE, noise=SECURE, params={"I": 1000}, exact=counted([]))
    with pytest.raises(LedgerMismatchError, match="epsilon"):
        ledger.draw_once("sketch", mechanism=LaplaceMechanism(10.0, 2.0), noise=SECURE, params={"I": 300},
                         exact=counted([]))
    with pytest.raises(LedgerMismatchError, match="sensitivity"):
        ledger.draw_once("sketch", mechanism=LaplaceMechanism(5.0, 1.0), noise=SECURE, params={"I": 300},
                         exact=counted([]))
    with pytest.raises(LedgerMismatchError, match="mechanism"):
        ledger.draw_once("sketch", mechanism=GaussianMechanism(10.0, 3.0, 1.0, 1e-5), noise=SECURE, params={"I": 300},
                         exact=counted([]))


def test_a_release_drawn_before_the_gaussian_lattice_is_reread_and_another_sigma_is_refused(tmp_path):
    """A calibrated Gaussian's sigma rose by 2^-30 of itself with OpenDP's coarser lattice (GAUSSIAN_LATTICE_SLACK):
    a run drawn at the old sigma resumes on its draws; a sigma that differs by more is another configuration."""
    from privseed.tasks.dp.mechanisms import GAUSSIAN_LATTICE_SLACK

    calls = []
    before = GaussianMechanism(sensitivity=1.0, sigma=0.56, epsilon=10.0, delta=1e-7)
    drawn = PrivacyLedger(str(tmp_path), "fp", "r1").draw_once(
        "histogram-class0", mechanism=before, noise=SECURE, params={}, exact=counted(calls))
    now = GaussianMechanism(sensitivity=1.0, sigma=0.56 * (1 + GAUSSIAN_LATTICE_SLACK), epsilon=10.0, delta=1e-7,
                            lattice_slack=GAUSSIAN_LATTICE_SLACK)
    again = PrivacyLedger(str(tmp_path), "fp", "r1").draw_once(
        "histogram-class0", mechanism=now, noise=SECURE, params={}, exact=counted(calls))
    assert len(calls) == 1 and np.array_equal(drawn["noisy"], again["noisy"])
    with pytest.raises(LedgerMismatchError, match="scale"):
        PrivacyLedger(str(tmp_path), "fp", "r1").draw_once(
            "histogram-class0", mechanism=GaussianMechanism(1.0, 0.56 * (1 + 1e-6), 10.0, 1e-7), noise=SECURE,
            params={}, exact=counted(calls))


def test_another_corpus_cannot_use_the_run(tmp_path):
    PrivacyLedger(str(tmp_path), "id-a", "r1").draw_once("c", mechanism=LAPLACE, noise=SECURE, params={},
                                                          exact=counted([]))
    with pytest.raises(LedgerMismatchError, match="another corpus") as refused:
        PrivacyLedger(str(tmp_path), "id-b", "r1")
    assert "id-a" not in str(refused.value) and "id-b" not in str(refused.value)  # no identity in messages


def test_composition_sums_stages_and_takes_max_over_classes(tmp_path):
    ledger = PrivacyLedger(str(tmp_path), "fp", "r1")
    ledger.draw_once("voc", mechanism=LAPLACE, noise=SECURE, params={}, stage="vocabulary", exact=counted([]))
    for label in ("a", "b", "c"):  # per-class sketches: disjoint documents, parallel composition
        for block in range(4):  # ensemble of 4 sketches per class: basic composition within a class
            ledger.draw_once(f"kde-{label}-{block}", mechanism=LaplaceMechanism(1.0, 2.5), noise=SECURE, params={},
                             stage="kde", partition=label, exact=counted([]))
    assert ledger.total() == pytest.approx((11.0, 0.0))


def test_a_schedule_pays_for_its_number_of_rounds_and_no_more(tmp_path):
    # Issue 30, item 5: an Aug-PE schedule charged for T = 1 and then drawn for 10 rounds kept the total at the
    # one-round (2.0, 1e-5).
    from privseed.tasks.stages.pe import augpe_round_mechanism, augpe_schedule
    from privseed.tasks.config.commands import AugPeConfig

    cfg = AugPeConfig.model_validate({"data": "d", "out": str(tmp_path / "out"), "llm": "local", "labels": ["0"],
                                      "epsilon": 2.0, "delta": 1e-5, "iterations": 1})
    schedule = augpe_schedule(cfg)
    ledger = PrivacyLedger(str(tmp_path / "state"), "fp", "r1")
    mechanism = augpe_round_mechanism(schedule)
    ledger.charge("augpe.schedule", mechanism=mechanism, noise=SECURE, params=schedule, releases=1)
    draw = dict(mechanism=mechanism, noise=SECURE, exact=counted([1, 2]), accounted_in="augpe.schedule")
    ledger.draw_once("augpe.round-001.histogram", params={"round": 1}, **draw)
    ledger.draw_once("augpe.round-001.histogram", params={"round": 1}, **draw)  # a re-read is no new release
    with pytest.raises(LedgerMismatchError, match="release 2 of schedule 'augpe.schedule', which was charged for 1"):
        ledger.draw_once("augpe.round-002.histogram", params={"round": 2}, **draw)
    assert ledger.total() == pytest.approx((2.0, 1e-5)) and len(ledger.entries()) == 2
    # per partition: each class of a schedule charged for T = 2 gets two rounds
    ledger.charge("per-class", mechanism=mechanism, noise=SECURE, params={}, releases=2, stage="s")
    for t in (1, 2):
        for label in ("a", "b"):
            ledger.draw_once(f"pc.round-{t}.{label}", params={}, partition=label, stage="s", mechanism=mechanism,
                             noise=SECURE, exact=counted([1]), accounted_in="per-class")
    with pytest.raises(LedgerMismatchError, match="partition a"):
        ledger.draw_once("pc.round-3.a", params={}, partition="a", stage="s", mechanism=mechanism, noise=SECURE,
                         exact=counted([1]), accounted_in="per-class")


def test_a_schedule_is_charged_once_and_its_rounds_are_recorded_not_charged(tmp_path):
    ledger = PrivacyLedger(str(tmp_path), "fp", "r1")
    round_mechanism = GaussianMechanism(sensitivity=1.0, sigma=3.0, epsilon=4.0, delta=1e-5)  # eps of all T rounds
    with pytest.raises(PrivseedError, match="never charged"):
        ledger.draw_once("round-1", mechanism=round_mechanism, noise=SECURE, params={}, exact=counted([]),
                         accounted_in="pe-schedule")
    for _ in range(2):  # idempotent
        ledger.charge("pe-schedule", mechanism=round_mechanism, noise=SECURE, params={"T": 10}, releases=10)
    for t in range(1, 4):
        ledger.draw_once(f"round-{t}", mechanism=round_mechanism, noise=SECURE, params={"round": t},
                         exact=counted([]), accounted_in="pe-schedule")
    assert ledger.total() == pytest.approx((4.0, 1e-5))
    with pytest.raises(LedgerMismatchError, match="scale"):  # a round drawn with another sigma than was charged
        ledger.draw_once("round-4", mechanism=GaussianMechanism(1.0, 1.5, 4.0, 1e-5), noise=SECURE,
                         params={"round": 4}, exact=counted([]), accounted_in="pe-schedule")
    schedule = next(e for e in ledger.entries() if e["name"] == "pe-schedule")
    assert schedule["releases"] == 10 and schedule["guarantee"]["rho"] == pytest.approx(1 / 18)
    with pytest.raises(LedgerMismatchError, match="releases"):
        ledger.charge("pe-schedule", mechanism=round_mechanism, noise=SECURE, params={"T": 10}, releases=5)
    # Laplace releases of a schedule compose by basic composition
    ledger.charge("laplace-schedule", mechanism=LaplaceMechanism(1.0, 0.5), noise=SECURE, params={}, releases=3)
    assert ledger.total() == pytest.approx((5.5, 1e-5))


def test_unverified_entries_are_listed_as_such(tmp_path):
    ledger = PrivacyLedger(str(tmp_path), "fp", "r1")
    ledger.draw_once_unverified("secpe", mechanism="secret-clustering", params={}, epsilon=1.0,
                                draw=lambda: {"x": np.zeros(2)})
    report = json.loads(ledger.to_json())["noise"]
    assert report == {"secure": True, "insecure_entries": [], "unverified_entries": ["secpe"]}


def test_crash_between_draw_and_record_reuses_the_value(tmp_path, monkeypatch):
    ledger = PrivacyLedger(str(tmp_path), "fp", "r1")
    calls = []

    def crash(record):
        raise KeyboardInterrupt

    monkeypatch.setattr(ledger, "_commit_entry", crash)
    with pytest.raises(KeyboardInterrupt):
        ledger.draw_once("h", mechanism=LAPLACE, noise=SECURE, params={"a": 1}, exact=counted(calls))
    resumed = PrivacyLedger(str(tmp_path), "fp", "r1")
    resumed.draw_once("h", mechanism=LAPLACE, noise=SECURE, params={"a": 1}, exact=counted(calls))
    assert len(calls) == 1 and resumed.total() == (1.0, 0.0)


def test_state_dict_round_trip_and_refusals(tmp_path):
    ledger = PrivacyLedger(str(tmp_path / "a"), "fp", "r1")
    ledger.charge("c", mechanism=LaplaceMechanism(1.0, 0.5), noise=SECURE, params={"x": 1})
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


def charge(ledger, epsilon, name="c"):
    ledger.charge(name, mechanism=LaplaceMechanism(1.0, epsilon), noise=SECURE, params={})
    return ledger


def test_recipient_json_has_the_run_only_and_no_identity(tmp_path):
    charge(PrivacyLedger(str(tmp_path), "id-secret", "old"), 2.0)
    ledger = PrivacyLedger(str(tmp_path), "id-secret", "new")
    ledger.draw_once("v", mechanism=LAPLACE, noise=SECURE, params={"S": 10}, stage="vocabulary", exact=counted([]))
    text = ledger.to_json()
    document = json.loads(text)
    assert document["total"]["epsilon"] == 1.0 and document["run_id"] == "new"
    assert document["total"]["secure"] is True and "stamp" not in document
    assert "id-secret" not in text and "previous_runs" not in document and "old" not in text
    assert set(document["entries"][0]) >= {"name", "mechanism", "params", "epsilon", "delta", "sensitivity", "scale"}
    assert not {"data_identity", "value", "created_at"} & set(document["entries"][0])
    owner = json.loads(ledger.owner_json())  # the owner's view keeps everything, in the private state
    assert owner["data_identity"] == "id-secret" and owner["cumulative"]["epsilon"] == pytest.approx(3.0)


def _identity(rows):
    from privseed.tasks.dp.identity import DataIdentity

    return DataIdentity(f"id-{min(rows)}-{max(rows)}", np.array(sorted(rows), dtype=np.uint64))


def test_cumulative_total_composes_overlapping_runs_and_parallelises_disjoint_ones(tmp_path):
    def run(run_id, rows, epsilon):
        return charge(PrivacyLedger(str(tmp_path), _identity(rows), run_id), epsilon)

    run("a", [1, 2, 3], 1.0)
    run("b", [10, 11], 2.0)  # disjoint from a: parallel
    assert PrivacyLedger(str(tmp_path), "x", "view").cumulative_total()["epsilon"] == pytest.approx(2.0)
    last = run("c", [3, 4, 10], 0.5)  # D plus new rows shares a row with a and with b: everything composes
    cumulative = last.cumulative_total()
    assert cumulative["epsilon"] == pytest.approx(3.5) and sorted(cumulative["groups"][0]) == ["a", "b", "c"]
    run("d", [7], 5.0)  # disjoint from all: its own group
    assert last.cumulative_total()["epsilon"] == pytest.approx(5.0)
    charge(PrivacyLedger(str(tmp_path), "no-rows", "e"), 0.25)  # no row identities: taken to overlap everything
    assert last.cumulative_total()["epsilon"] == pytest.approx(3.5 + 5.0 + 0.25)


def test_a_value_stored_for_another_corpus_is_refused(tmp_path):
    """A value drawn for corpus A before a crash is never recorded as corpus B's under the same run id."""
    ledger = PrivacyLedger(str(tmp_path), "id-a", "r1")
    ledger.draw_once("h", mechanism=LAPLACE, noise=SECURE, params={"a": 1}, exact=counted([]))
    run = tmp_path / "runs" / "r1"
    (run / "entries" / "h.json").unlink()  # crashed before recording
    (run / "run.json").unlink()  # and nothing else tells the corpora apart but the value itself
    calls = []
    with pytest.raises(LedgerMismatchError, match="another corpus"):
        PrivacyLedger(str(tmp_path), "id-b", "r1").draw_once("h", mechanism=LAPLACE, noise=SECURE, params={"a": 1},
                                                              exact=counted(calls))
    assert calls == []


def _race(state: str, barrier_file: str, out_file: str) -> None:
    """One racing process: wait for the start signal, then draw once and write what it got."""
    import os
    import time

    while not os.path.exists(barrier_file):
        time.sleep(0.001)
    ledger = PrivacyLedger(state, "id", "shared-run")
    value = ledger.draw_once("h", mechanism=LAPLACE, noise=secure_noise(), params={"a": 1}, exact=lambda: np.zeros(4))
    np.save(out_file, value["noisy"])


def test_draw_once_is_exclusive_across_processes(tmp_path):
    """Two processes with one run id race for the same release: one value is stored, both return it, and the
    ledger records one charge."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    for attempt in range(3):
        state, barrier = str(tmp_path / f"state{attempt}"), str(tmp_path / f"go{attempt}")
        outs = [str(tmp_path / f"out{attempt}-{i}.npy") for i in range(2)]
        procs = [context.Process(target=_race, args=(state, barrier, out)) for out in outs]
        for p in procs:
            p.start()
        (tmp_path / f"go{attempt}").touch()
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
        a, b = (np.load(out) for out in outs)
        assert np.array_equal(a, b)
        stored = PrivacyLedger(state, "id", "shared-run")
        assert stored.total() == (1.0, 0.0) and len(stored.entries()) == 1
        again = stored.draw_once("h", mechanism=LAPLACE, noise=SECURE, params={"a": 1}, exact=lambda: np.zeros(4))
        assert np.array_equal(again["noisy"], a)


def test_the_loser_of_a_race_returns_the_winners_value(tmp_path):
    """Deterministic interleaving of the race above: the second process stores its value only after the first
    one stored its own, between its existence check and its write. It must discard its draw and return the
    stored one (a plain overwrite would release two values for one name)."""
    winner = PrivacyLedger(str(tmp_path), "id", "r1")
    loser = PrivacyLedger(str(tmp_path), "id", "r1")
    won = {}

    def exact_while_the_other_process_wins():
        won.update(winner.draw_once("h", mechanism=LAPLACE, noise=SECURE, params={"a": 1},
                                    exact=lambda: np.zeros(20)))
        return np.zeros(20)

    got = loser.draw_once("h", mechanism=LAPLACE, noise=SECURE, params={"a": 1},
                          exact=exact_while_the_other_process_wins)
    assert np.array_equal(got["noisy"], won["noisy"])
    assert PrivacyLedger(str(tmp_path), "id", "r1").total() == (1.0, 0.0)


def test_create_exclusive_keeps_the_first_object(tmp_path):
    from privseed.tasks import storage

    uri = str(tmp_path / "sub" / "x.bin")
    assert storage.create_exclusive(uri, b"first") is True
    assert storage.create_exclusive(uri, b"second") is False
    assert storage.read_bytes(uri) == b"first"
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["x.bin"]  # no temporary file left behind


def test_create_exclusive_on_s3_is_a_conditional_put(s3_bucket):
    """On S3 the create-if-absent is one PUT with If-None-Match: * (s3fs mode="create"); the moto server
    refuses the second one, so the first object stays and the ledger's race logic holds on object storage."""
    from privseed.tasks import storage

    uri = f"{s3_bucket.url}/state/x.bin"
    assert storage.create_exclusive(uri, b"first") is True
    assert storage.create_exclusive(uri, b"second") is False
    assert s3_bucket.get("state/x.bin") == b"first"
    ledger = PrivacyLedger(f"{s3_bucket.url}/state", "id", "r1")
    value = ledger.draw_once("h", mechanism=LAPLACE, noise=SECURE, params={}, exact=lambda: np.zeros(3))
    again = PrivacyLedger(f"{s3_bucket.url}/state", "id", "r1").draw_once(
        "h", mechanism=LAPLACE, noise=SECURE, params={}, exact=lambda: np.zeros(3))
    assert np.array_equal(value["noisy"], again["noisy"])


def test_the_ledger_asks_the_mechanisms_kind_how_a_schedule_composes(tmp_path):
    """A new kind brings its own composition rule: the ledger charges what the kind's ``compose`` says, whatever
    the kind is called (before kinds, any kind not named "laplace" was charged as a Gaussian schedule)."""
    from dataclasses import dataclass

    from privseed.tasks.dp.mechanisms import LaplaceKind

    @dataclass(frozen=True)
    class PureKind(LaplaceKind):
        name: str = "pure-test"

    pure = PureKind()

    @dataclass(frozen=True)
    class PureMechanism(LaplaceMechanism):
        @property
        def kind(self):
            return pure

        def describe(self, noise=None):
            return {**super().describe(noise), "mechanism": pure.name}

    ledger = PrivacyLedger(str(tmp_path), "fp", "r1")
    ledger.charge("pure-schedule", mechanism=PureMechanism(1.0, 0.5), noise=SECURE, params={}, releases=4)
    assert ledger.total() == pytest.approx((2.0, 0.0))
    entry = next(e for e in ledger.entries() if e["name"] == "pure-schedule")
    assert entry["mechanism"] == "pure-test" and entry["epsilon"] == pytest.approx(2.0)
