"""A release written by the generation shards: each shard writes and gate-checks its own part, the driver gathers
descriptors only, the call cache is listed once per generation, and the manifest stays the commit point."""
import json
import os
import pickle

import pytest

from privseed.tasks import storage
from privseed.tasks.data.corpus import publish_release, read_release
from privseed.tasks.errors import GateFailedError, StorageError
from privseed.tasks.generation.drivers import fill_cache, generate_release_parts, generate_seeds, part_size
from privseed.tasks.generation.params import GenerationParams
from privseed.tasks.generation.rounds import candidate_seed
from privseed.tasks.generation.rows import merge_generation_reports, split_documents
from privseed.tasks.dp.ledger import PrivacyLedger
from privseed.tasks.llm import CallCache, ReleasedVocabulary, register_backend
from privseed.tasks.quality import release_gate
from tests.fakes.recording import RecordingBackend

VOCAB = ReleasedVocabulary(["river", "village", "church", "album", "band", "football club"], "test")
# Without class fit: the fixture's two classes share their six terms, and the answers are one text for both
PARAMS = GenerationParams(doc_type="memo", max_tokens=40, max_regenerations=2, rewrite_off_class=False)
SPEC = "local:recording-test"


def seeds(n=30):
    return [VOCAB.seed([i % 6, (i + 1) % 6, (i + 3) % 6], label=i % 2, seed=1000 + i) for i in range(n)]


def answer(req):
    """Seed 1003 never gets a document (its row is dropped); seed 1005 loops first, then writes one."""
    if req.seed in [candidate_seed(1003, j) for j in range(10)]:
        return "I'm an AI assistant designed to help with Wikipedia articles about many topics."
    if req.seed == 1005:
        return "The river, " + "river, " * 20
    return (f"The old church by the river was rebuilt after flood number {req.seed}, and the village grew "
            "around it over the following years.")


@pytest.fixture
def recording():
    b = RecordingBackend(answer=answer)
    register_backend(SPEC, b)
    yield b
    register_backend(SPEC, None)


def ledger(tmp_path):
    return PrivacyLedger(str(tmp_path / "out.private"), "id-of-the-corpus", "run1")


def test_shards_write_checked_parts_and_hand_back_descriptors_only(tmp_path, recording):
    out, cache = str(tmp_path / "out"), str(tmp_path / "cache")
    gate = release_gate(labels=[0, 1], llm_used=True)
    staged = generate_release_parts(seeds(), SPEC, PARAMS, cache, None, out=out, gate=gate, shard_size=8,
                                    progress=False)
    assert [p.path for p in staged.parts] == [f"synthetic/part-{i:05d}-{staged.release_id}.parquet" for i in range(4)]
    assert all(os.path.exists(os.path.join(out, p.path)) and p.check is not None for p in staged.parts)
    assert not os.path.exists(os.path.join(out, "manifest.json"))  # written, named by nothing yet
    sent = len(recording.requests)

    # The same documents as a frame (all from the cache now): what the old path gathered in the driver.
    rows = generate_seeds(seeds(), SPEC, PARAMS, cache, shard_size=8, progress=False)
    kept, report = split_documents(rows, PARAMS.max_regenerations)
    assert len(recording.requests) == sent
    assert staged.rows == len(kept) == 29 and staged.generation_report == report
    assert report["rows_dropped"] == 1 and report["rows_regenerated"] == 2
    # What came back from the shards holds no document text: counts, digests and paths only.
    gathered = pickle.dumps(staged)
    assert not any(text.encode() in gathered for text in kept["text"])

    manifest = publish_release(out, staged, ledger=ledger(tmp_path), config={}, gate=gate,
                               quality_extra={"generation": staged.generation_report})
    got_manifest, frame = read_release(out)
    assert frame["text"].tolist() == kept["text"].tolist() and frame["seed"].tolist() == kept["seed"].tolist()
    assert manifest["rows"] == 29 and manifest["rows_per_label"] == {"0": 15, "1": 14}
    quality = json.loads((tmp_path / "out" / "quality.json").read_text())
    whole = gate(kept)  # the gate over all rows at once
    assert {k: v for k, v in quality.items() if k not in ("parts", "generation")} == \
        {k: v for k, v in json.loads(json.dumps(whole)).items() if k != "parts"}
    assert quality["success"] is True and quality["parts"] == 4 and quality["generation"] == report


def test_the_cache_is_listed_once_and_misses_are_never_read(tmp_path, recording, monkeypatch):
    listings, reads = [], []
    real_list, real_read = CallCache.list_index, CallCache._read
    monkeypatch.setattr(CallCache, "list_index", lambda self: listings.append(1) or real_list(self))
    monkeypatch.setattr(CallCache, "_read", lambda self, key: reads.append(key) or real_read(self, key))
    cache = str(tmp_path / "cache")

    generate_release_parts(seeds(), SPEC, PARAMS, cache, None, out=str(tmp_path / "a"), gate=None, shard_size=8,
                           progress=False)
    calls = len(recording.requests)
    assert calls > 30  # best-of-1 plus the regeneration rounds
    assert listings == [1] and reads == []  # an empty cache: every call a miss, none probed

    staged = generate_release_parts(seeds(), SPEC, PARAMS, cache, None, out=str(tmp_path / "b"), gate=None,
                                    shard_size=8, progress=False)
    assert listings == [1, 1] and len(reads) == calls  # one listing, then exactly the hits
    assert len(recording.requests) == calls and staged.rows == 29


def test_a_batching_run_sends_every_call_first_and_the_shards_find_them_all_cached(tmp_path, recording):
    """fill_cache runs the same rounds as the shards (regeneration included), so the shards that write the parts
    afterwards send nothing."""
    cache = CallCache(str(tmp_path / "cache"))
    index = fill_cache(seeds(), SPEC, PARAMS, cache.root, None, cache.list_index())
    calls = len(recording.requests)
    assert len(index) == calls
    staged = generate_release_parts(seeds(), SPEC, PARAMS, cache.root, None, out=str(tmp_path / "out"), gate=None,
                                    shard_size=8, progress=False)
    assert len(recording.requests) == calls and staged.rows == 29


def test_a_failed_gate_quarantines_the_staged_parts_and_keeps_the_last_release(tmp_path, recording):
    out = str(tmp_path / "out")
    first = publish_release(out, generate_seeds(seeds(4), SPEC, PARAMS, None, progress=False)
                            .drop(columns=["document_reason"]), ledger=ledger(tmp_path), config={})
    strict = release_gate(labels=[0, 1, 2], llm_used=True)  # class 2 is never generated
    staged = generate_release_parts(seeds(), SPEC, PARAMS, str(tmp_path / "cache"), None, out=out, gate=strict,
                                    shard_size=8, progress=False)
    with pytest.raises(GateFailedError, match="label:every class present") as failure:
        publish_release(out, staged, ledger=ledger(tmp_path), config={}, gate=strict)
    manifest, frame = read_release(out)
    assert manifest["release_id"] == first["release_id"] and len(frame) == 4
    assert sorted(os.listdir(os.path.join(out, "synthetic"))) == [f["path"].split("/")[1] for f in first["files"]
                                                                   if f["kind"] == "synthetic"]
    quarantine = failure.value.quarantine
    assert sorted(os.listdir(os.path.join(quarantine, "synthetic"))) == [p.path.split("/")[1] for p in staged.parts]
    assert json.load(open(os.path.join(quarantine, "quality.json")))["failed"] == ["label:every class present"]
    with pytest.raises(GateFailedError):  # a retried publish fails the same way (the parts are already moved)
        publish_release(out, staged, ledger=ledger(tmp_path), config={}, gate=strict)


def test_a_crash_before_the_manifest_keeps_the_last_release_and_the_next_commit_sweeps_the_parts(
        tmp_path, recording, monkeypatch):
    out = str(tmp_path / "out")
    first = publish_release(out, generate_seeds(seeds(4), SPEC, PARAMS, None, progress=False)
                            .drop(columns=["document_reason"]), ledger=ledger(tmp_path), config={})
    gate = release_gate(labels=[0, 1], llm_used=True)
    staged = generate_release_parts(seeds(), SPEC, PARAMS, str(tmp_path / "cache"), None, out=out, gate=gate,
                                    shard_size=8, progress=False)
    real_write = storage.write_bytes

    def failing_manifest(uri, data, options=None):
        if uri.endswith("manifest.json"):
            raise StorageError("endpoint went away")
        real_write(uri, data, options)

    monkeypatch.setattr(storage, "write_bytes", failing_manifest)
    with pytest.raises(StorageError):
        publish_release(out, staged, ledger=ledger(tmp_path), config={}, gate=gate)
    monkeypatch.setattr(storage, "write_bytes", real_write)
    manifest, frame = read_release(out)  # the last good release, complete and verified
    assert manifest["release_id"] == first["release_id"] and len(frame) == 4
    assert len(os.listdir(os.path.join(out, "synthetic"))) == 1 + len(staged.parts)

    # The publish task's retry commits the same parts; the sweep after it removes the older release's part.
    second = publish_release(out, staged, ledger=ledger(tmp_path), config={}, gate=gate)
    manifest, frame = read_release(out)
    assert manifest["release_id"] == second["release_id"] == staged.release_id and len(frame) == 29
    assert sorted(os.listdir(os.path.join(out, "synthetic"))) == [p.path.split("/")[1] for p in staged.parts]


def test_parts_are_checked_by_the_gate_that_publishes_them(tmp_path, recording):
    from privseed.tasks.errors import ConfigError

    out = str(tmp_path / "out")
    staged = generate_release_parts(seeds(8), SPEC, PARAMS, None, None, out=out,
                                    gate=release_gate(labels=[0, 1], llm_used=True), progress=False)
    with pytest.raises(ConfigError, match="another release gate"):
        publish_release(out, staged, ledger=ledger(tmp_path), config={},
                        gate=release_gate(labels=[0, 1], llm_used=True, max_duplicate_rate=0.5))
    with pytest.raises(ConfigError, match="written under"):
        publish_release(str(tmp_path / "elsewhere"), staged, ledger=ledger(tmp_path), config={},
                        gate=release_gate(labels=[0, 1], llm_used=True))


def test_part_sizes_and_report_sums():
    assert part_size(30, 2) == 16 and part_size(10_000, 2) == 1250 and part_size(10**6, 16) == 5000
    a = {"policy": "p", "max_regenerations": 3, "rows_generated": 2, "rows_kept": 1, "rows_dropped": 1,
         "dropped_by_reason": {"meta_talk": 1}, "kept_per_class": {"0": 1}, "candidates": 4,
         "rejected_candidates_by_reason": {"meta_talk": 3}, "regeneration_calls": 2, "rows_regenerated": 1}
    b = {**a, "dropped_by_reason": {}, "kept_per_class": {"1": 2}, "rejected_candidates_by_reason": {"glossary": 1}}
    merged = merge_generation_reports([a, b])
    assert merged["max_regenerations"] == 3 and merged["rows_kept"] == 2 and merged["candidates"] == 8
    assert merged["kept_per_class"] == {"0": 1, "1": 2}
    assert merged["rejected_candidates_by_reason"] == {"glossary": 1, "meta_talk": 3}


@pytest.mark.slow
def test_on_a_cluster_batches_go_out_together_and_workers_write_the_parts(tmp_path, monkeypatch):
    """The flow's shape with a LocalCluster: a batching Anthropic run submits all its batches at once from one
    worker (fill_cache), then the shards (other tasks) find every answer in the cache, write and check their
    parts; the release read back holds one document per seed."""
    from privseed.tasks.data.cluster import dask_client
    from privseed.tasks.llm import LLMSpec
    from tests.fakes.anthropic_server import FakeAnthropic

    monkeypatch.setenv("ANTHROPIC_API_KEY", "fake-key")
    with FakeAnthropic(api_key="fake-key") as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        fake.polls_until_end, fake.hold_creates = 2, 4
        spec = LLMSpec("anthropic", "claude-haiku-4-5").with_options(
            use_batches=True, max_batch_size=8, max_concurrency=4, poll_interval=0.05,
            batch_state=str(tmp_path / "state"))
        # The fake's answer repeats its seed's terms, and these 30 seeds have 6 term sets: duplicates by design.
        gate = release_gate(labels=[0, 1], llm_used=True, max_duplicate_rate=1.0)
        out = str(tmp_path / "out")
        with dask_client(n_workers=2):
            staged = generate_release_parts(seeds(), spec, GenerationParams(doc_type="memo", max_tokens=40),
                                            str(tmp_path / "cache"), None, out=out, gate=gate, shard_size=8,
                                            progress=False)
        assert len(fake.batches) == 4 and fake.peak_creates == 4 and fake.message_calls == 0
        manifest = publish_release(out, staged, ledger=ledger(tmp_path), config={}, gate=gate)
    _, frame = read_release(out)
    assert len(staged.parts) == 4 and manifest["gate"]["success"] is True
    assert frame["seed"].tolist() == [s.seed for s in seeds()]
    assert frame["text"].str.startswith("A fake document").all()


def test_the_document_bar_keeps_its_total_and_counts_the_calls_beside_it():
    """Issue 31: the bar's total grew with regenerations, so its percentage and ETA misled. Its total is now the
    documents to write; it moves when a seed is settled, and the calls (regenerations included) are a count."""
    from privseed.tasks.llm.progress import CallProgress

    bar = CallProgress(10, None, "generate", enabled=True, unit="doc")  # 10 seeds, best of 1
    bar.add(7, 10, 20)  # 7 calls: 5 first candidates and 2 regenerations
    assert (bar.bar.n, bar.bar.total, bar.calls) == (0, 10, 7)
    bar.settle(4)
    bar.on_settled(4, kept=False)  # a seed dropped after its last regeneration
    assert (bar.bar.n, bar.bar.total, bar.dropped) == (5, 10, 1)
    assert "calls=7" in bar.bar.postfix and "dropped=1" in bar.bar.postfix
    bar.close()


def test_a_call_bar_moves_with_each_call():
    """Private evolution's rounds plan every call: their bars count calls (and show no calls= beside them)."""
    from privseed.tasks.llm.progress import CallProgress

    bar = CallProgress(6, None, "augpe", enabled=True)
    bar.add(2, 10, 20)
    bar.settle(1)  # a call bar does not count documents
    assert (bar.bar.n, bar.bar.total) == (2, 6) and "calls=" not in bar.bar.postfix
    bar.close()


def test_shard_progress_counts_each_call_and_seed_once_whether_its_message_comes_early_late_or_never():
    from privseed.tasks.llm.progress import CallProgress, ShardProgress

    bar = CallProgress(10, None, "generate", enabled=True, unit="doc")  # two shards of 5 seeds, best of 1
    calls = ShardProgress(bar, [5, 5])
    message = {"in": 10, "out": 20, "cached": 0}
    for _ in range(7):  # shard 0's calls as they happen: 5 first candidates, then 2 regenerations
        calls.on_call({"shard": 0, **message})
    for kept in (1, 1, 1, 1, 0):  # and its seeds as they are settled, one dropped
        calls.on_call({"shard": 0, "settled": 1, "kept": kept})
    calls.on_call({"shard": 0, "settled": 1, "kept": 1})  # one more than the shard has seeds: not counted
    assert (bar.bar.n, bar.bar.total, bar.calls, bar.dropped) == (5, 10, 7, 1)
    calls.finished(0, 7, 70, 140, dropped=1)  # everything already counted
    calls.on_call({"shard": 0, **message})  # a message that arrives after its shard finished
    assert (bar.bar.n, bar.bar.total, bar.calls, bar.tokens_in) == (5, 10, 7, 70)
    calls.on_call({"shard": 1, **message})  # shard 1: one message of each kind arrives, the rest never do
    calls.on_call({"shard": 1, "settled": 1, "kept": 1})
    assert (bar.bar.n, bar.bar.total) == (6, 10)
    calls.finished(1, 6, 60, 120, dropped=2)
    assert (bar.bar.n, bar.bar.total, bar.calls, bar.dropped) == (10, 10, 13, 3)
    assert (bar.tokens_in, bar.tokens_out) == (130, 260)
    bar.close()


def test_the_bar_moves_with_every_seed_and_its_total_never_changes(tmp_path, recording, monkeypatch):
    """Shards of a local model finish minutes apart: the bar must move before a shard does. Each call's and each
    seed's message reaches the bar before its shard's final count does; the total stays the number of seeds while
    seed 1003 is regenerated to the end and dropped, and the counts agree with what was sent."""
    from privseed.tasks.generation import drivers as generation

    events: list[tuple[str, int]] = []
    shown: list[tuple[int, int]] = []
    on_call, finished = generation.ShardProgress.on_call, generation.ShardProgress.finished
    monkeypatch.setattr(generation.ShardProgress, "on_call",
                        lambda self, m: (events.append(("seed" if "settled" in m else "call", m["shard"])),
                                         on_call(self, m))[1])
    monkeypatch.setattr(generation.ShardProgress, "finished",
                        lambda self, i, *a: (events.append(("shard done", i)), finished(self, i, *a))[1])
    show = generation.CallProgress._show
    monkeypatch.setattr(generation.CallProgress, "_show",
                        lambda self, steps: (show(self, steps),
                                             self.bar.disable or shown.append((self.bar.n, self.bar.total)))[0])
    closed: list[tuple[int, int, int, int]] = []
    close = generation.CallProgress.close
    monkeypatch.setattr(generation.CallProgress, "close",
                        lambda self: (closed.append((self.bar.n, self.bar.total, self.calls, self.dropped)),
                                      close(self))[1])
    generate_release_parts(seeds(), SPEC, PARAMS, str(tmp_path / "cache"), None, out=str(tmp_path / "out"),
                           gate=None, shard_size=8, progress=True)
    calls = [shard for kind, shard in events if kind == "call"]
    assert len(calls) == len(recording.requests) > 30  # one message per call (regenerations included)
    assert len([e for e in events if e[0] == "seed"]) == 30  # one per seed
    for shard in range(4):  # each shard's calls and seeds were reported before the shard was
        assert events.index(("shard done", shard)) > max(i for i, e in enumerate(events) if e[1] == shard
                                                         and e[0] != "shard done")
    assert {total for _, total in shown} == {30}  # the total never changed
    assert [n for n, _ in shown] == sorted(n for n, _ in shown)
    assert closed[-1] == (30, 30, len(recording.requests), 1)  # every seed settled, seed 1003 dropped


@pytest.mark.slow
def test_on_a_cluster_the_workers_calls_reach_the_drivers_bar_as_they_finish(tmp_path, monkeypatch):
    """The flow's shape: shards on two worker processes report each call through Dask's event stream; the
    driver's bar ends with every call counted once."""
    from privseed.tasks.generation import drivers as generation
    from privseed.tasks.data.cluster import dask_client
    from privseed.tasks.llm import LLMSpec
    from tests.fakes.anthropic_server import FakeAnthropic

    messages, closed = [], []
    on_call = generation.ShardProgress.on_call
    monkeypatch.setattr(generation.ShardProgress, "on_call", lambda self, m: (messages.append(m), on_call(self, m))[1])
    close = generation.CallProgress.close
    monkeypatch.setattr(generation.CallProgress, "close",
                        lambda self: (closed.append((self.bar.n, self.bar.total, self.calls)), close(self))[1])
    monkeypatch.setenv("ANTHROPIC_API_KEY", "fake-key")
    with FakeAnthropic(api_key="fake-key") as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        spec = LLMSpec("anthropic", "claude-haiku-4-5").with_options(use_batches=False)
        gate = release_gate(labels=[0, 1], llm_used=True, max_duplicate_rate=1.0)
        with dask_client(n_workers=2):
            generate_release_parts(seeds(), spec, GenerationParams(doc_type="memo", max_tokens=40),
                                   str(tmp_path / "cache"), None, out=str(tmp_path / "out"), gate=gate,
                                   shard_size=8, progress=True)
        sent = fake.message_calls
    call_messages = [m for m in messages if "settled" not in m]
    assert sent >= 30 and 0 < len(call_messages) <= sent  # messages came from the worker processes
    assert 0 < len(messages) - len(call_messages) <= 30  # and so did the settled seeds'
    assert {m["shard"] for m in messages} <= {0, 1, 2, 3}
    assert closed[-1] == (30, 30, sent)  # each seed and each call counted once, the bar at 100 %
