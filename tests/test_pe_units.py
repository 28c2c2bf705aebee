"""Aug-PE and SecPE per work unit: one round loop for both methods, partial statistics that add up to the
in-memory ones (pure, on a real Dask cluster, and through the flows on a multi-shard corpus), PII secrets merged
across units, and the workers' embedding cache scoped to a run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from privseed.tasks.pe import evolution as ev
from tests.test_evolution_flow import TOPICS, _cfg, fake_llm  # noqa: F401  (fake_llm is a fixture)

LABELS = ["0", "1", "2"]


def _write_shards(frame: pd.DataFrame, folder: Path, shards: int = 3, row_group_size: int = 5) -> str:
    """``frame`` as ``shards`` Parquet files of several row groups each, in row order."""
    folder.mkdir()
    for i, part in enumerate(np.array_split(np.arange(len(frame)), shards)):
        frame.iloc[part].to_parquet(folder / f"part-{i:03d}.parquet", index=False, row_group_size=row_group_size)
    return str(folder)


def _units(folder: str, unit_rows: int = 1):
    from privseed.tasks.pe.pe_units import PrivateUnits
    from privseed.tasks.data.units import plan_units

    return PrivateUnits(tuple(plan_units(folder, unit_rows=unit_rows)), "text", "label", {}, "minilm",
                        tuple(LABELS), "test-run")


# ------------------------------------------------------------------------------------------------------------
# Partial statistics add up to the in-memory ones (pure, in this process)
# ------------------------------------------------------------------------------------------------------------
def test_unit_votes_and_cluster_sums_add_up_to_the_in_memory_statistics(tmp_path, tiny_corpus):
    from privseed.tasks.data.units import add_parts, map_reduce_units
    from privseed.tasks.data.embedding import embed_texts
    from privseed.tasks.dp.mechanisms import insecure_noise
    from privseed.tasks.pe.pe_units import SampledUnit, forget_run, unit_class_votes, unit_cluster_sums

    units = _units(_write_shards(tiny_corpus, tmp_path / "corpus"))
    assert len(units.units) == 9  # 3 shards x 3 row groups: one unit per row group
    private = embed_texts(tiny_corpus["text"].tolist())
    classes = ev.class_index(LABELS, tiny_corpus["label"])
    candidates = embed_texts([f"{TOPICS[i % 3]} candidate {i}" for i in range(12)])
    voting = np.array([i % 3 if i % 4 else -1 for i in range(12)])  # every 4th is a non-document
    try:
        votes = map_reduce_units(unit_class_votes, units.units, add_parts, units, candidates, voting)
        np.testing.assert_array_equal(votes, ev.class_votes(private, classes, candidates, voting))
        assert votes.dtype == np.int64 and votes[voting == -1].sum() == 0

        clusters = ev.public_kmeans(embed_texts([f"{TOPICS[i % 3]} public {i}" for i in range(20)]), 4, 0)
        rho = np.linspace(0.1, 1.0, len(tiny_corpus))
        bounds = np.cumsum([u.rows for u in units.units])[:-1]
        items = [SampledUnit(unit, part, insecure_noise(1, "unit", str(i)))
                 for i, (unit, part) in enumerate(zip(units.units, np.split(rho, bounds)))]
        sums = map_reduce_units(unit_cluster_sums, items, add_parts, units, clusters, 0.5)
        # the same Bernoulli masks, drawn in memory from the same sources, unit by unit
        sampled = np.concatenate([item.sampling.bernoulli(item.rho) for item in items])
        assert 0 < sampled.sum() < sampled.size
        whole = ev.cluster_sums(clusters, private, classes, sampled, radius=0.5, classes=3)
        np.testing.assert_array_equal(sums.counts, whole.counts)
        np.testing.assert_allclose(sums.sums, whole.sums, rtol=0, atol=1e-9)
        for ci in range(3):  # and class by class, what secret_clustering_exact computes for that class alone
            members = classes == ci
            centres, sizes = ev.secret_clustering_exact(clusters, private[members], sampled[members], radius=0.5)
            got = ev.clustering_from_sums(clusters, sums.counts[ci], sums.sums[ci])
            np.testing.assert_allclose(got[0], centres, rtol=0, atol=1e-9)
            np.testing.assert_array_equal(got[1], sizes)
    finally:
        assert forget_run(units.run) == 9  # every unit's embeddings were kept for the run, and are gone now
    assert forget_run(units.run) == 0


@pytest.mark.parametrize("kind", ["words", "pii"])
def test_secret_incidence_merged_across_units_is_the_corpus_incidence(tmp_path, tiny_corpus, kind):
    from privseed.tasks.pe.pe_units import SecretDetector, stack_incidence, unit_secret_incidence

    corpus = tiny_corpus.copy()
    corpus.loc[[1, 7, 20, 33], "text"] += [" mail ann@example.org", " call bob@example.org",
                                           " mail ann@example.org", " see 192.168.0.1"]
    units = _units(_write_shards(corpus, tmp_path / "corpus"))
    detector = (SecretDetector("pii", key=b"k" * 32) if kind == "pii"
                else SecretDetector("words", ("goals", "glacier", "guitar", "absent")))
    merged = stack_incidence([part for u in units.units for part in unit_secret_incidence(u, units, detector)])
    if kind == "pii":
        whole, types = ev.pii_secret_incidence(corpus["text"].tolist())
        assert {"EMAIL_ADDRESS", "IP_ADDRESS"} <= set(types)
        assert whole.sum(axis=0).max() >= 2  # a value in two shards (ann@, example.org) is one secret
    else:
        whole = ev.word_secret_incidence(corpus["text"].tolist(), detector.terms)
    assert merged.shape == whole.shape and (merged != whole).nnz == 0


def test_map_reduce_units_combines_in_unit_order_with_and_without_affinity():
    import dask
    from distributed import Client, LocalCluster

    from privseed.tasks.data.cluster import NO_PROFILER
    from privseed.tasks.data.units import add_parts, map_reduce_units

    items = list(range(7))
    assert map_reduce_units(lambda i: [i], items, add_parts) == items  # no client: in this process
    with dask.config.set(dict(NO_PROFILER)), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster):
        assert map_reduce_units(lambda i: [i], items, add_parts) == items
        assert map_reduce_units(lambda i: [i], items, add_parts, affinity=True) == items
        argument = np.ones(200_000)  # scattered to the workers, not put in the graph
        assert map_reduce_units(lambda i, big: [i + int(big[0])], [1], add_parts, argument) == [2]


# ------------------------------------------------------------------------------------------------------------
# The flows: one loop, and per-unit exact statistics equal to the in-memory ones on a multi-shard corpus
# ------------------------------------------------------------------------------------------------------------
class _Recorder:
    """Wraps a driver-side method and records its arguments and result (the exact statistic a round's draw
    receives); the noise is untouched."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __call__(self, owner, *args):
        result = self.real(owner, *args)
        self.calls.append((args, result))
        return result


def test_both_flows_run_the_one_round_loop(prefect_harness, corpus_file, tmp_path, fake_llm, monkeypatch):
    import privseed.flows.evolution as flows_evolution
    from privseed.tasks.stages.pe_rounds import evolve

    seen = []

    def recording_evolve(cfg, labels, vote, words=None):
        scores = vote.scores

        def recorded(t, candidates, *rest):
            seen.append((type(vote).__name__, t, len(candidates)))
            return scores(t, candidates, *rest)

        vote.scores = recorded
        return evolve(cfg, labels, vote, words)

    monkeypatch.setattr(flows_evolution, "evolve", recording_evolve)
    public = tmp_path / "public.parquet"
    pd.DataFrame({"text": [f"{TOPICS[i % 3]} public {i}" for i in range(30)]}).to_parquet(public)
    flows_evolution.augpe_flow(_cfg(corpus_file, tmp_path / "a"))
    secpe = _cfg(corpus_file, tmp_path / "s", public=str(public), clusters=6, p=1e-4, r_over_p=1e4,
                 noise_multiplier=3.0)
    secpe.pop("epsilon")
    flows_evolution.secpe_flow(secpe)
    # T = 2 rounds each over N (K + 1) = 4 candidates per class: the same loop asked each method's vote step
    assert seen == [("AugPeVote", 1, 12), ("AugPeVote", 2, 12), ("SecPeVote", 1, 12), ("SecPeVote", 2, 12)]


def test_the_loop_with_any_vote_step(prefect_harness, corpus_file, tmp_path, fake_llm):
    """``evolve`` with a vote step that records its calls and prefers each class's last candidates: RANDOM_API
    writes N (K + 1) per class, the step is asked once per round over all candidates, the population is what it
    scored highest, and VARIATION_API writes K per kept sample between rounds."""
    from privseed.tasks.config.commands import AugPeConfig
    from privseed.tasks.stages.pe_rounds import evolve

    class LastWins:
        name, title, selection = "test", "Test", "rank"

        def __init__(self):
            self.calls = []

        def scores(self, t, candidates, candidate_emb, candidate_class, documents):
            self.calls.append((t, candidates["origin"].tolist(), candidate_emb.shape, candidate_class.tolist()))
            return np.arange(len(candidates), dtype=float)

    cfg = AugPeConfig.model_validate(_cfg(corpus_file, tmp_path / "loop", iterations=3))
    vote = LastWins()
    result = evolve(cfg, [0, 1, 2], vote)
    assert [t for t, *_ in vote.calls] == [1, 2, 3]
    assert vote.calls[0][1] == ["random"] * 12 and vote.calls[0][2] == (12, 384)
    assert vote.calls[1][1] == ["random"] * 6 + ["variation-1"] * 6  # the kept ones, then their variations
    assert vote.calls[2][1] == ["variation-1"] * 6 + ["variation-2"] * 6
    assert result.calls == {"random": 12, "variation": 12} and fake_llm.calls == 24
    assert result.final["origin"].tolist() == ["variation-2"] * 6  # the last candidates of every class won
    assert result.final["label"].tolist() == [0, 0, 1, 1, 2, 2]
    assert [r["round"] for r in result.rounds] == [1, 2, 3]


def test_per_unit_votes_equal_in_memory_votes_through_the_flows(prefect_harness, tmp_path, tiny_corpus, fake_llm,
                                                                monkeypatch):
    """Both flows on a corpus of 3 shards: every round's exact statistic, summed over the work units on the
    workers, is what the in-memory computation on the whole corpus gives (Aug-PE's vote counts exactly, SecPE's
    counts exactly and cluster sums within 1e-9; r = 1 makes every rho 1, so no sampling mask is involved)."""
    from privseed.flows.evolution import augpe_flow, secpe_flow
    from privseed.tasks.data.embedding import embed_texts
    from privseed.tasks.stages.pe_rounds import AugPeVote, SecPeVote

    data = _write_shards(tiny_corpus, tmp_path / "corpus", shards=3, row_group_size=4)
    votes, sums = _Recorder(AugPeVote.exact_votes), _Recorder(SecPeVote.exact_sums)
    monkeypatch.setattr(AugPeVote, "exact_votes", lambda self, *a: votes(self, *a))
    monkeypatch.setattr(SecPeVote, "exact_sums", lambda self, *a: sums(self, *a))
    public_texts = [f"{TOPICS[i % 3]} public {i}" for i in range(30)]
    pd.DataFrame({"text": public_texts}).to_parquet(tmp_path / "public.parquet")
    augpe_flow(_cfg(data, tmp_path / "a", n_workers=2))  # units on two workers, counts reduced across them
    secpe = _cfg(data, tmp_path / "s", public=str(tmp_path / "public.parquet"), clusters=6, p=1e-4, r_over_p=1e4,
                 noise_multiplier=3.0, radius=0.5, n_workers=2)
    secpe.pop("epsilon")
    secpe_flow(secpe)

    private = embed_texts(tiny_corpus["text"].tolist())
    classes = ev.class_index(LABELS, tiny_corpus["label"])
    assert len(votes.calls) == 2
    for (candidate_emb, voting), exact in votes.calls:
        _assert_no_near_ties(private, candidate_emb, classes[:, None] == voting[None, :])
        np.testing.assert_array_equal(exact, ev.class_votes(private, classes, candidate_emb, voting))
        assert exact.sum() == len(tiny_corpus)
    clusters = ev.public_kmeans(embed_texts(public_texts), 6, 3)
    _assert_no_near_ties(ev.clip_rows(private, 0.5), clusters.centres, np.ones((len(private), 6), bool))
    assert [args for args, _ in sums.calls] == [(1,), (2,)]
    for _, exact in sums.calls:
        whole = ev.cluster_sums(clusters, private, classes, np.ones(len(private), bool), radius=0.5, classes=3)
        np.testing.assert_array_equal(exact.counts, whole.counts)
        np.testing.assert_allclose(exact.sums, whole.sums, rtol=0, atol=1e-6)


def _assert_no_near_ties(private: np.ndarray, targets: np.ndarray, allowed: np.ndarray) -> None:
    """Every private row's nearest allowed target wins by a margin, so that float32 differences between the
    workers' batches and this process's cannot move a vote (a precondition of comparing exact counts)."""
    scores = 2 * private @ targets.T - (targets ** 2).sum(axis=1)
    top2 = np.sort(np.where(allowed, scores, -np.inf), axis=1)[:, -2:]
    assert np.all(top2[:, 1] - top2[:, 0] > 1e-4)


def test_a_resumed_run_rereads_every_round_and_votes_no_more(prefect_harness, corpus_file, tmp_path, fake_llm,
                                                              monkeypatch):
    """The exact votes are computed only when a round must be drawn: resuming a finished run (--run-id) re-reads
    every round from the ledger and sends no unit to the workers and no call to the LLM."""
    from privseed.flows.evolution import augpe_flow
    from privseed.tasks.stages.pe_rounds import AugPeVote

    votes = _Recorder(AugPeVote.exact_votes)
    monkeypatch.setattr(AugPeVote, "exact_votes", lambda self, *a: votes(self, *a))
    out = tmp_path / "resume"
    first = augpe_flow(_cfg(corpus_file, out, run_id="resumed-run"))
    assert len(votes.calls) == 2 and fake_llm.calls == 18
    again = augpe_flow(_cfg(corpus_file, out, run_id="resumed-run"))
    assert len(votes.calls) == 2 and fake_llm.calls == 18
    assert again["rows"] == first["rows"]


def test_a_units_transient_storage_error_retries_the_round_step_and_a_corpus_error_does_not(
        prefect_harness, tmp_path, tiny_corpus, monkeypatch):
    import privseed.tasks.pe.pe_units as pe_units
    from privseed.tasks.data.embedding import embed_texts
    from privseed.tasks.errors import CorpusError, StorageError
    from privseed.tasks.stages.pe import exact_class_votes

    units = _units(_write_shards(tiny_corpus, tmp_path / "corpus"), unit_rows=12)
    candidates = embed_texts([f"{TOPICS[i % 3]} candidate {i}" for i in range(6)])
    voting = np.arange(6) % 3
    real, reads = pe_units.read_unit, []

    def flaky(unit, *args, **kwargs):
        reads.append(unit)
        if len(reads) == 2:
            raise StorageError(f"reading shard {unit.uri} failed: throttled")
        return real(unit, *args, **kwargs)

    monkeypatch.setattr(pe_units, "read_unit", flaky)
    try:
        votes = exact_class_votes(units, candidates, voting)  # the Prefect task, with its retries
        assert votes.sum() == len(tiny_corpus) and len(reads) > len(units.units)
        pe_units.forget_run(units.run)
        reads.clear()

        def broken(unit, *args, **kwargs):
            reads.append(unit)
            raise CorpusError(f"unreadable Parquet shard {unit.uri}: bad footer")

        monkeypatch.setattr(pe_units, "read_unit", broken)
        with pytest.raises(CorpusError, match="part-000.parquet"):
            exact_class_votes(units, candidates, voting)
        assert len(reads) == 1  # deterministic: not retried
    finally:
        pe_units.forget_run(units.run)
