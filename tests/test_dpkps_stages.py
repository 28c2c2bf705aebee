"""The DP-KPS privatization stages called directly (no Prefect server, no cluster; the passes run in-process over
the work units of a multi-shard corpus): budget split, ledger entries, draw-once noise, refusals, and a declared
class with no documents."""

import numpy as np
import pytest

from privseed.tasks.config.commands import DpKpsConfig
from privseed.tasks.stages.corpus import scan_private_corpus
from privseed.tasks.stages.dpkps import (embed_released_vocabulary, exact_sketch_sums, privatize_sketches,
                                         privatize_vocabulary_stage, sample_keyphrase_sequences, term_counting,
                                         vocabulary_histogram)
from tests.conftest import corpus_plan
from privseed.tasks.errors import CorpusError, LedgerMismatchError
from privseed.tasks.dp.ledger import PrivacyLedger


def _config(tmp_path, **overrides):
    values = dict(data="unused", out=str(tmp_path / "out"), method="iterative-log", vocab_top=20000, vocab_size=30,
                  n_features=32, per_class=3, length=5, eps_voc=1.0, eps_kde=10.0, gate=False,
                  labels=["0", "1", "2", "3"])
    values.update(overrides)
    return DpKpsConfig(**values)


@pytest.mark.parametrize("method,sketches", [("iterative-log", 4), ("iterative-linear", 5), ("independent", 1)])
def test_stages_split_the_budget_and_draw_once(tmp_path, tiny_corpus, method, sketches):
    cfg = _config(tmp_path, method=method)
    ledger = PrivacyLedger(str(tmp_path / "state"), "fingerprint", "run1")
    labels = [0, 1, 2, 3]  # class 3 is declared but has no documents: sampled from noise, no special path
    plan = corpus_plan(tiny_corpus, tmp_path / "corpus")
    assert len(plan.units) > 2 and sum(u.rows for u in plan.units) == len(tiny_corpus)
    counts = scan_private_corpus.fn(plan, labels, cfg, term_counting(cfg)).counts
    np.testing.assert_array_equal(counts, vocabulary_histogram.fn(tiny_corpus["text"].tolist(), cfg))
    terms = privatize_vocabulary_stage.fn(counts, cfg, ledger)
    assert len(terms) == 30
    embeddings = embed_released_vocabulary.fn(terms, cfg)
    exact = exact_sketch_sums.fn(plan, labels, terms, embeddings, cfg)
    released = privatize_sketches.fn(exact, labels, terms, embeddings, cfg, ledger)
    assert released.shape == (4, sketches, 32)

    entries = {e["name"]: e for e in ledger.entries()}
    assert len(entries) == 1 + 4 * sketches
    assert entries["vocabulary"]["epsilon"] == 1.0 and entries["vocabulary"]["sensitivity"] == 10
    kde = [e for e in entries.values() if e["stage"] == "kde"]
    assert {e["partition"] for e in kde} == {"class0", "class1", "class2", "class3"}
    assert all(e["epsilon"] == pytest.approx(10.0 / sketches) for e in kde)
    assert all(e["sensitivity"] == pytest.approx(np.sqrt(2) * 32) for e in kde)
    assert ledger.total() == (pytest.approx(11.0), 0.0)  # eps_voc + eps_kde: classes compose in parallel

    # a retry re-reads the noise instead of drawing it again, and charges nothing more
    again = privatize_sketches.fn(exact, labels, terms, embeddings, cfg, ledger)
    np.testing.assert_array_equal(again, released)
    assert ledger.total() == (pytest.approx(11.0), 0.0)

    sequences = sample_keyphrase_sequences.fn(released, labels, terms, embeddings, cfg)
    assert sequences.groupby("label").size().to_dict() == {0: 3, 1: 3, 2: 3, 3: 3}
    assert all(len(k) == 5 and set(k) <= set(terms) for k in sequences["keyphrases"])

    # the same release names under other parameters are refused, never silently redrawn
    with pytest.raises(LedgerMismatchError):
        privatize_sketches.fn(exact, labels, terms, embeddings, _config(tmp_path, method=method, bandwidth=0.9), ledger)


def test_corpus_without_vocabulary_terms_fails_before_any_noise(tmp_path):
    import pandas as pd

    cfg = _config(tmp_path)
    corpus = pd.DataFrame({"text": ["zzqx wvvk", "qqzx kkwv"], "label": [0, 1]})
    with pytest.raises(CorpusError, match="vocabulary"):
        vocabulary_histogram.fn(corpus["text"].tolist(), cfg)
    with pytest.raises(CorpusError, match="vocabulary"):
        scan_private_corpus.fn(corpus_plan(corpus, tmp_path / "corpus"), [0, 1], cfg, term_counting(cfg))


def test_a_sampler_whose_sketches_are_noise_says_so_with_the_numbers_before_sampling(tmp_path):
    """iterative-linear splits eps_kde over L sketches: released sums that are pure noise (no signal in any class)
    are reported sketch by sketch; sums that carry a class's documents well above the noise are not. Only the
    released sums and public parameters are read (the estimate is ||F~||^2 - I v)."""
    from privseed.tasks.seeds.kde import sketch_signal
    from privseed.tasks.dp.mechanisms import secure_noise
    from privseed.tasks.stages.dpkps import feature_specs, signal_warning, sketch_mechanisms

    # Nine classes: a sketch is reported when most classes look like noise, and a pure-noise sum reaches 3 noise
    # standard deviations about once in a hundred draws, so with three classes about one run in a thousand missed a
    # sketch (CI, 2026-11-27); with nine, five of nine must be that lucky (about 3e-8 a run).
    labels = list("abcdefghi")
    cfg = DpKpsConfig(data="d.parquet", out=str(tmp_path / "o"), labels=labels, method="iterative-linear",
                      length=4, eps_kde=4.0, n_features=64)
    specs = feature_specs(cfg, 8)
    mechanisms = sketch_mechanisms(cfg, specs)
    assert len(mechanisms) == 4 and mechanisms[0].epsilon == pytest.approx(1.0)
    zeros = np.zeros((len(labels), 4, 64))
    pure_noise = np.stack([[m.release(zeros[c, k], secure_noise()) for k, m in enumerate(mechanisms)]
                           for c in range(len(labels))])
    warning = signal_warning(pure_noise, cfg.labels, cfg, specs)
    assert warning is not None and "--method iterative-linear: noise swamps the signal" in warning
    assert warning.count("indistinguishable from noise") == 4 and "noise standard deviations" in warning
    # a class sum of 2,000 documents, sqrt(2) cos(.) each, is far above Laplace(sqrt(2) I / 1) noise
    strong = np.full((len(labels), 4, 64), 2000 * np.sqrt(2) * 0.9)
    released = np.stack([[m.release(strong[c, k], secure_noise()) for k, m in enumerate(mechanisms)]
                         for c in range(len(labels))])
    assert signal_warning(released, cfg.labels, cfg, specs) is None
    assert sketch_signal(released[0, 0], mechanisms[0]).z > 10
    # pure noise: the estimate is centred on 0 in noise units
    z = [sketch_signal(mechanisms[0].release(np.zeros(64), secure_noise()), mechanisms[0]).z for _ in range(200)]
    assert abs(np.mean(z)) < 0.5 and np.mean(np.array(z) < 3.0) > 0.95
