"""The DP-KPS flow on the streaming data path, end to end under Prefect and a Dask cluster: on a corpus of several
shards and row groups (many work units) the exact values the ledger privatizes are those of the in-memory
computation (read through a spy on ``PrivacyLedger.draw_once``, never by seeding the noise); a transient read
failure of one unit is retried and the run completes with the same exact values; a corrupt shard fails the run
with an error naming it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from privseed.tasks.data import units
from privseed.tasks.errors import CorpusError, StorageError
from privseed.tasks.dp.ledger import PrivacyLedger
from privseed.tasks.seeds.seed_methods import method_options
from tests.conftest import DATA_ROOT, write_shards

pytestmark = pytest.mark.slow

LABELS = [str(i) for i in range(14)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, pd.DataFrame]:
    path = DATA_ROOT / "dbpedia14" / "train.parquet"
    if not path.exists():
        pytest.skip("the public corpora are not under $PRIVSEED_DATA_ROOT (docs/datasets.md)")
    frame = pd.read_parquet(path, columns=["text", "label"]).sample(700, random_state=2).reset_index(drop=True)
    return write_shards(frame, tmp_path_factory.mktemp("streaming") / "corpus", n_shards=3, row_group_rows=20), frame


@pytest.fixture
def exact_values(monkeypatch) -> dict[str, tuple[np.ndarray, dict]]:
    """name -> (the exact value the ledger privatized, what it released): the test hook on the ledger."""
    seen: dict[str, tuple[np.ndarray, dict]] = {}
    draw_once = PrivacyLedger.draw_once

    def spy(self, name, **kwargs):
        released = draw_once(self, name, **kwargs)
        seen[name] = (np.array(kwargs["exact"]()), released)
        return released

    monkeypatch.setattr(PrivacyLedger, "draw_once", spy)
    monkeypatch.setattr(units, "DEFAULT_UNIT_ROWS", 60)  # about 12 units of 3 row groups
    return seen


def _config(data: str, out, **overrides) -> dict:
    values = {"data": data, "out": str(out), "labels": LABELS, "llm": "none", "gate": False, "per_class": 3,
              "length": 6, "vocab_top": 20_000, "vocab_size": 200, "n_features": 48, "first_terms": 8, "seed": 3,
              "n_workers": 2}
    values.update(overrides)
    return method_options(values.get("method", "independent"), values)  # a histogram method refuses the sampler's


def _in_memory_counts(frame: pd.DataFrame, first_terms: int) -> np.ndarray:
    from privseed.tasks.seeds.vocabulary import first_terms_histogram, load_vocabulary, phrase_matcher

    vocabulary = load_vocabulary("english", 20_000)
    return first_terms_histogram([phrase_matcher(vocabulary).match(t) for t in frame["text"]], len(vocabulary),
                                 first_terms)


def test_dpkps_flow_privatizes_exactly_the_in_memory_histogram_and_sketch_sums(prefect_harness, corpus, tmp_path,
                                                                               exact_values):
    from privseed.flows.dpkps import dpkps_flow
    from privseed.tasks.config.commands import DpKpsConfig
    from privseed.tasks.data.embedding import embed_texts
    from privseed.tasks.seeds.kde import shard_sketch_sums
    from privseed.tasks.stages.dpkps import feature_specs
    from privseed.tasks.seeds.vocabulary import load_vocabulary

    data, frame = corpus
    config = _config(data, tmp_path / "out", method="iterative-log")
    assert len(units.plan_corpus(data).units) >= 10
    manifest = dpkps_flow(config)
    assert manifest["rows"] == 14 * 3

    counts, released = exact_values["vocabulary"]
    np.testing.assert_array_equal(counts, _in_memory_counts(frame, 8))
    vocabulary = load_vocabulary("english", 20_000)
    terms = [vocabulary.terms[int(i)] for i in released["term_ids"]]
    cfg = DpKpsConfig(**config)
    embeddings = embed_texts(terms, cfg.embedding_model)
    specs = feature_specs(cfg, embeddings.shape[1])
    expected = shard_sketch_sums(frame["text"].tolist(), frame["label"].tolist(), list(range(14)), tuple(terms),
                                 embeddings, specs, single_terms=False)
    sums = np.stack([np.stack([exact_values[f"kde-class{c}-sketch{k}"][0] for k in range(len(specs))])
                     for c in range(14)])
    assert np.abs(expected).max() > 1.0
    np.testing.assert_allclose(sums, expected, rtol=1e-9, atol=1e-9)


def test_histogram_markov_flow_privatizes_exactly_the_in_memory_counts(prefect_harness, corpus, tmp_path,
                                                                       exact_values):
    from privseed.flows.dpkps import dpkps_flow
    from privseed.tasks.seeds.histogram_seeds import class_pair_counts, class_positions, class_term_counts
    from privseed.tasks.seeds.vocabulary import load_vocabulary, phrase_matcher

    data, frame = corpus
    dpkps_flow(_config(data, tmp_path / "out", method="histogram-markov", mechanism="laplace", hist_top_k=25,
                       epsilon=6.0))
    vocabulary = load_vocabulary("english", 20_000)
    full = [phrase_matcher(vocabulary).match(t) for t in frame["text"]]
    positions = class_positions(list(range(14)), frame["label"])
    counts = class_term_counts(full, positions, 14, len(vocabulary), 8)
    candidates = [exact_values[f"markov-class{c}"][1]["pair_ids"] for c in range(14)]
    pairs = class_pair_counts(full, positions, candidates, 2)  # --markov-pair-terms 2 (the default)
    for c in range(14):
        np.testing.assert_array_equal(exact_values[f"histogram-class{c}"][0], counts[c])
        np.testing.assert_array_equal(exact_values[f"markov-class{c}"][0], pairs[c])
    assert pairs.sum() > 100


def test_a_transient_read_failure_of_one_unit_is_retried_and_the_run_completes(prefect_harness, corpus, tmp_path,
                                                                               exact_values, monkeypatch):
    """Workers in this process (a cluster of threads), so the test can make the storage of one unit fail once in
    the middle of pass 1, after some of its rows were already counted: the unit is read again from the start
    and the histogram comes out exactly right (nothing counted twice)."""
    import dask
    from distributed import LocalCluster

    import privseed.tasks.seeds.passes
    from privseed.tasks.data.cluster import NO_PROFILER, NO_SPILL
    from privseed.flows.dpkps import dpkps_flow

    data, frame = corpus
    monkeypatch.setattr(units, "UNIT_RETRY_DELAYS_S", (0.1, 0.1))
    failing = {"unit": None, "failures": 0}
    read_unit = privseed.tasks.seeds.passes.read_unit

    def flaky_read(unit, *args, **kwargs):
        for number, batch in enumerate(read_unit(unit, *args, batch_rows=10, **kwargs)):
            if number == 2 and failing["failures"] == 0 and failing["unit"] in (None, unit):
                failing["unit"], failing["failures"] = unit, 1
                raise StorageError(f"reading shard {unit.uri} failed: SlowDown (throttled)")
            yield batch

    monkeypatch.setattr(privseed.tasks.seeds.passes, "read_unit", flaky_read)
    # spill off, as the flow requires of any cluster it is given (privseed.tasks.data.cluster.check_cluster)
    with dask.config.set({**NO_SPILL, **NO_PROFILER}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster:
        manifest = dpkps_flow(_config(data, tmp_path / "out", method="independent",
                                      dask_address=cluster.scheduler_address))
    assert failing["failures"] == 1 and manifest["rows"] == 14 * 3
    np.testing.assert_array_equal(exact_values["vocabulary"][0], _in_memory_counts(frame, 8))


def test_a_corrupt_shard_fails_the_run_naming_it(prefect_harness, corpus, tmp_path, exact_values):
    import pyarrow.parquet as pq

    from privseed.flows.dpkps import dpkps_flow

    _, frame = corpus
    folder = tmp_path / "corrupt"
    write_shards(frame, folder, n_shards=3, row_group_rows=20)
    shard = folder / "part-00001.parquet"
    data = bytearray(shard.read_bytes())
    column = pq.ParquetFile(shard).metadata.row_group(4).column(0)
    start = column.dictionary_page_offset or column.data_page_offset
    data[start:start + 32] = bytes(b ^ 0xFF for b in data[start:start + 32])  # a page header inside the shard
    shard.write_bytes(bytes(data))
    with pytest.raises(CorpusError, match=f"unreadable Parquet shard {shard}"):
        dpkps_flow(_config(str(folder), tmp_path / "out", method="independent", n_workers=1))
    assert "vocabulary" not in exact_values  # failed in pass 1, before anything was drawn
    shard.write_bytes(b"PAR1 truncated")
    with pytest.raises(CorpusError, match=f"unreadable Parquet shard {shard}"):
        dpkps_flow(_config(str(folder), tmp_path / "out2", method="independent", n_workers=1))
