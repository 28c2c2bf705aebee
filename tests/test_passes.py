"""The passes of the streaming data path (tasks/seeds/passes.py) over the work units of a multi-shard, multi-row-group
corpus add up to exactly what the in-memory computation gives (full extraction of every document, one sum):
term counts and pair counts identical, sketch sums within 1e-9."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from privseed.tasks.errors import ConfigError
from privseed.tasks.seeds.histogram_seeds import class_pair_counts, class_positions, class_term_counts
from privseed.tasks.seeds.kde import FeatureSpec, shard_sketch_sums
from privseed.tasks.seeds.passes import (DeclaredLabels, PairSpec, ScanPart, ScanSpec, SketchSpec, TermCounting,
                                         UnitReader, combine_sums, pair_unit, scan_unit, sketch_unit)
from privseed.tasks.data.units import map_reduce_units
from privseed.tasks.seeds.vocabulary import first_terms_histogram, load_vocabulary, phrase_matcher
from tests.conftest import DATA_ROOT, corpus_plan

LABELS = tuple(range(14))
KEY = bytes(range(32))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """600 real DBPedia-14 documents (or the tiny corpus without the public corpora of docs/datasets.md) in 3
    shards of 5-row groups."""
    path = DATA_ROOT / "dbpedia14" / "train.parquet"
    if path.exists():
        frame = pd.read_parquet(path, columns=["text", "label"]).sample(600, random_state=1).reset_index(drop=True)
    else:
        frame = pd.DataFrame({"text": ["football club league season player", "river valley lake forest"] * 300,
                              "label": [0, 1] * 300})
    plan = corpus_plan(frame, tmp_path_factory.mktemp("passes") / "c", n_shards=3, row_group_rows=5, unit_rows=40)
    assert len(plan.units) >= 12
    return frame, plan


def _scan(plan, counting):
    spec = ScanSpec(UnitReader(), DeclaredLabels(LABELS), KEY, counting)
    return map_reduce_units(scan_unit, plan.units, ScanPart.combine, spec)


@pytest.mark.parametrize("per_class", [False, True])
def test_pass_one_counts_are_the_in_memory_counts(corpus, per_class):
    frame, plan = corpus
    counting = TermCounting("english", 20_000, first_terms=7, per_class=per_class)
    part = _scan(plan, counting)
    vocabulary = load_vocabulary("english", 20_000)
    full = [phrase_matcher(vocabulary).match(t) for t in frame["text"]]
    if per_class:
        expected = class_term_counts(full, class_positions(LABELS, frame["label"]), len(LABELS), len(vocabulary), 7)
    else:
        expected = first_terms_histogram(full, len(vocabulary), 7)
    assert expected.sum() > 1000
    np.testing.assert_array_equal(part.counts, expected)
    from privseed.tasks.dp.identity import data_identity

    assert part.identity.finish(KEY).digest == data_identity(frame, KEY).digest


def test_pass_two_pair_counts_are_the_in_memory_counts(corpus):
    frame, plan = corpus
    counting = TermCounting("english", 20_000, first_terms=6, per_class=True)
    vocabulary = load_vocabulary("english", 20_000)
    full = [phrase_matcher(vocabulary).match(t) for t in frame["text"]]
    positions = class_positions(LABELS, frame["label"])
    # each class's candidate terms: its 30 most frequent (any public choice of P ids per class will do)
    counts = class_term_counts(full, positions, len(LABELS), len(vocabulary), 6)
    candidates = tuple(np.argsort(-row, kind="stable")[:30].astype(np.int64) for row in counts)
    spec = PairSpec(UnitReader(), DeclaredLabels(LABELS), counting, candidates, pair_terms=4)
    pairs = map_reduce_units(pair_unit, plan.units, combine_sums, spec)
    expected = class_pair_counts(full, positions, candidates, 4)
    assert pairs.shape == (len(LABELS), 30 * 29 // 2) and expected.sum() > 500
    np.testing.assert_array_equal(pairs, expected)


@pytest.mark.parametrize("method", ["independent", "iterative-log"])
def test_pass_two_sketch_sums_are_the_in_memory_sums(corpus, method):
    from privseed.tasks.seeds.sampling import ensemble_blocks

    frame, plan = corpus
    vocabulary = load_vocabulary("english", 20_000)
    terms = tuple(vocabulary.terms[:400])
    embeddings = np.random.default_rng(3).standard_normal((len(terms), 16))
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)  # public stand-ins for the term embeddings
    specs = tuple(FeatureSpec(seed=5, name=f"{method}-{k}", n_features=24, dim=16, blocks=b, bandwidth=0.5)
                  for k, b in enumerate(ensemble_blocks(method, 6)))
    single = method == "independent"
    spec = SketchSpec(UnitReader(), DeclaredLabels(LABELS), terms, embeddings, specs, single)
    sums = map_reduce_units(sketch_unit, plan.units, combine_sums, spec)
    expected = shard_sketch_sums(frame["text"].tolist(), frame["label"].tolist(), LABELS, terms, embeddings, specs,
                                 single)
    assert sums.shape == (14, len(specs), 24) and np.abs(expected).max() > 1.0
    np.testing.assert_allclose(sums, expected, rtol=1e-9, atol=1e-9)


def test_an_undeclared_label_stops_pass_one_without_naming_it(corpus):
    frame, plan = corpus
    missing = int(frame["label"].max())  # a label the corpus holds, left out of the declared set
    spec = ScanSpec(UnitReader(), DeclaredLabels(tuple(lb for lb in LABELS if lb != missing), "label"), KEY)
    with pytest.raises(ConfigError, match="not in the declared label set") as failure:
        map_reduce_units(scan_unit, plan.units, ScanPart.combine, spec)
    assert not any(ch.isdigit() for ch in str(failure.value))  # names no label and no count


def test_specs_do_not_show_the_key_or_storage_options():
    spec = ScanSpec(UnitReader(storage_options={"secret": "s3cr3t-value"}), DeclaredLabels((0,)), b"K" * 32)
    assert "s3cr3t" not in repr(spec) and "KKKK" not in repr(spec)
