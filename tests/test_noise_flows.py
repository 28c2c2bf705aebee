"""The noise the flows really add (issue 13, point 5), checked on what they release.

Each test runs the real flow (dpkps_flow / augpe_flow, or the flow's own vocabulary release for the canary) and
compares the released values with exact values the test computes itself from the corpus. They fail when the
noise is missing or when its scale is half the stated one (checked by hand by patching tasks/dp/mechanisms.py;
see the engineer's report), which the ledger-bookkeeping tests elsewhere cannot see.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from privseed.tasks.dp.mechanisms import INSECURE_STAMP
from privseed.tasks.seeds.seed_methods import method_options
from tests.noise_checks import FALSE_ALARM, assert_noise_is, scale_pvalue

pytestmark = pytest.mark.slow

TOPICS = {
    0: ["football club player scored goals league season", "striker signed contract club league",
        "goalkeeper saved penalty match season", "coach team won championship league title"],
    1: ["river valley mountain lake forest village", "mountain peak glacier valley river",
        "lake shore forest island river", "forest national park mountain trail lake"],
    2: ["album band song released records guitar", "singer recorded album single records",
        "band tour guitar drums album", "song chart single album music video"],
}
EPS_VOC, EPS_KDE, S, N_FEATURES, VOCAB_TOP, BANDWIDTH = 1.0, 10.0, 10, 200, 20_000, 0.5


def _corpus(tmp: Path) -> tuple[str, pd.DataFrame]:
    rows = [(text, label) for label, texts in TOPICS.items() for text in texts for _ in range(3)]
    frame = pd.DataFrame(rows, columns=["text", "label"])
    path = tmp / "corpus.parquet"
    frame.to_parquet(path, index=False)
    return str(path), frame


def _dpkps_config(data: str, out: Path, **overrides) -> dict:
    values = dict(data=data, out=str(out), state=str(out.parent / f"{out.name}-state"), method="independent",
                  vocab_top=VOCAB_TOP, vocab_size=40, n_features=N_FEATURES, per_class=4, length=5,
                  eps_voc=EPS_VOC, eps_kde=EPS_KDE, first_terms=S, bandwidth=BANDWIDTH, llm="none", gate=False,
                  n_workers=1, seed=0, labels=[str(label) for label in TOPICS])
    values.update(overrides)
    return method_options(values["method"], values)  # the sampler's settings are refused by a histogram method


def _stored(out: Path, name: str) -> dict[str, np.ndarray]:
    """A released value as the draw-once store holds it (the run's state folder is next to the release)."""
    [path] = (out.parent / f"{out.name}-state").glob(f"runs/*/values/{name}.npz")
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files if k != "__params__"}


def _tokens(text: str) -> list[str]:
    return re.findall(r"[^\W_]+", text.lower())


def _exact_vocabulary_histogram(texts: list[str], terms: tuple[str, ...], first: int) -> np.ndarray:
    """Recomputed here, not with the flow's matcher: every public term is one word, so a document's matched terms
    are its tokens that are terms, and it counts its first ``first`` of them."""
    assert all(" " not in t for t in terms)
    index = {t: i for i, t in enumerate(terms)}
    counts = np.zeros(len(terms), dtype=np.int64)
    for text in texts:
        for token in [t for t in _tokens(text) if t in index][:first]:
            counts[index[token]] += 1
    return counts


@pytest.fixture(scope="module")
def dpkps_runs(prefect_harness, tmp_path_factory):
    """Two DP-KPS runs with the same flags into two folders."""
    from privseed.flows.dpkps import dpkps_flow

    tmp = tmp_path_factory.mktemp("noise")
    data, frame = _corpus(tmp)
    outs = [tmp / "run-a", tmp / "run-b"]
    manifests = [dpkps_flow(_dpkps_config(data, out)) for out in outs]
    return data, frame, outs, manifests


def test_vocabulary_noise_is_discrete_laplace_of_scale_s_over_eps(dpkps_runs):
    from privseed.tasks.seeds.vocabulary import english_vocabulary

    _, frame, outs, _ = dpkps_runs
    terms = english_vocabulary(VOCAB_TOP).terms  # the public vocabulary (wordfreq), not the flow's counts
    exact = _exact_vocabulary_histogram(frame["text"].tolist(), terms, S)
    assert exact.sum() > 100  # the corpus does hit the vocabulary
    released = _stored(outs[0], "vocabulary")
    noise = released["noisy"] - exact
    stated = S / EPS_VOC  # sensitivity S (a document counts its first S terms) over eps_voc
    assert noise.size == len(terms) > 10_000
    assert_noise_is(noise, "discrete-laplace", stated)  # and refuted at half or twice the scale
    # the released top-N is the top of this noisy histogram (post-processing only)
    top = released["term_ids"]
    assert len(top) == 40 and released["noisy"][top].min() >= np.delete(released["noisy"], top).max()


def test_one_sketch_noise_is_laplace_of_scale_sqrt2_I_over_eps(dpkps_runs):
    from privseed.tasks.stages.dpkps import feature_specs
    from privseed.tasks.config.commands import DpKpsConfig
    from privseed.tasks.data.embedding import embed_texts
    from privseed.tasks.seeds.vocabulary import english_vocabulary

    data, frame, outs, _ = dpkps_runs
    vocabulary = english_vocabulary(VOCAB_TOP)
    released_terms = [vocabulary.terms[i] for i in _stored(outs[0], "vocabulary")["term_ids"]]
    cfg = DpKpsConfig(**_dpkps_config(data, outs[0]))
    embeddings = embed_texts(released_terms, cfg.embedding_model).astype(np.float64)
    [spec] = feature_specs(cfg, embeddings.shape[1])  # the independent method: one sketch of one block
    features = spec.draw()  # public: regenerated from the published seed
    # phi(e_t) = sqrt(2) cos(sqrt(2) w . e_t / h + b) for every released term; a document adds the mean over its
    # terms in V~ (weight 1 per document), so the class's sum moves by at most sqrt(2) per coordinate.
    phase = math.sqrt(2) * (embeddings / BANDWIDTH) @ features.omega[:, 0, :].T + features.offset
    phi = math.sqrt(2) * np.cos(phase)
    index = {t: i for i, t in enumerate(released_terms)}
    noise = []
    for c, label in enumerate(sorted(TOPICS)):
        exact = np.zeros(N_FEATURES)
        for text in frame.loc[frame["label"] == label, "text"]:
            ids = [index[t] for t in _tokens(text) if t in index]
            if ids:
                exact += phi[ids].mean(axis=0)
        noise.append(_stored(outs[0], f"kde-class{c}-sketch0")["noisy"] - exact)
    noise = np.concatenate(noise)
    stated = math.sqrt(2) * N_FEATURES / EPS_KDE  # L1 sensitivity sqrt(2) I over eps_kde (one sketch: all of it)
    assert_noise_is(noise, "laplace", stated)


def test_two_runs_with_the_same_flags_release_different_values(dpkps_runs):
    from privseed.tasks.data.corpus import read_release

    _, _, outs, manifests = dpkps_runs
    vocabularies = [_stored(out, "vocabulary")["noisy"] for out in outs]
    sketches = [_stored(out, "kde-class0-sketch0")["noisy"] for out in outs]
    # secure noise: two independent draws of ~16K discrete-Laplace(10) values agree on about 5 % of the terms
    assert np.mean(vocabularies[0] == vocabularies[1]) < 0.2
    assert not np.any(sketches[0] == sketches[1])
    releases = [read_release(str(out))[1] for out in outs]
    assert releases[0]["keyphrases"].map(tuple).tolist() != releases[1]["keyphrases"].map(tuple).tolist()
    for out, manifest in zip(outs, manifests):
        ledger = json.loads((out / "ledger.json").read_text())
        assert ledger["total"]["secure"] is True and "stamp" not in ledger and "stamp" not in manifest
        assert manifest["privacy"]["secure"] is True
        assert all(e["noise_source"] == "opendp" for e in ledger["entries"])
        assert all("seed" not in e["params"] for e in ledger["entries"])  # the seed draws no noise


def test_insecure_reproducible_noise_repeats_is_stamped_and_refused_unless_allowed(dpkps_runs, tmp_path):
    from privseed.flows.dpkps import dpkps_flow
    from privseed.tasks.errors import GateFailedError
    from privseed.tasks.evaluation.report import insecure_stamp

    data, _, _, _ = dpkps_runs
    with pytest.raises(GateFailedError, match="NOT DIFFERENTIALLY PRIVATE.*--allow-insecure-release"):
        dpkps_flow(_dpkps_config(data, tmp_path / "refused", insecure_reproducible_noise=True))
    assert not (tmp_path / "refused" / "manifest.json").exists()
    assert not (tmp_path / "refused").exists() or not list((tmp_path / "refused").rglob("*.*"))  # nothing in OUT
    assert list((tmp_path / "refused-state" / "quarantine").glob("*/ledger.json"))  # kept for the operator
    outs = [tmp_path / "a", tmp_path / "b"]
    manifests = [dpkps_flow(_dpkps_config(data, out, insecure_reproducible_noise=True, allow_insecure_release=True))
                 for out in outs]
    for name in ("vocabulary", "kde-class1-sketch0"):
        np.testing.assert_array_equal(_stored(outs[0], name)["noisy"], _stored(outs[1], name)["noisy"])
    ledger = json.loads((outs[0] / "ledger.json").read_text())
    assert manifests[0]["stamp"] == INSECURE_STAMP and ledger["stamp"] == INSECURE_STAMP
    assert json.loads((outs[0] / "manifest.json").read_text())["privacy"]["secure"] is False
    assert insecure_stamp(ledger, manifests[0]) == INSECURE_STAMP


def test_vocabulary_canary_with_s_distinct_terms_is_not_reliably_released(tmp_path):
    """One document holds S distinct terms that no other document has (L1 change S, the full sensitivity).
    The stated mechanism (discrete Laplace of scale S / eps) moves each canary term's count by 1, i.e. by 1/S of
    the sensitivity: a term is then released at most e^(eps / S) times as often as without the canary (fewer
    when the other canary terms compete for the same slots). Without noise every canary term is released; at
    half the scale the ratio reaches e^(2 eps / S) and the test fails."""
    from privseed.tasks.stages.dpkps import release_vocabulary, vocabulary_histogram
    from privseed.tasks.config.commands import DpKpsConfig
    from privseed.tasks.dp.ledger import PrivacyLedger

    eps, popular, rare, slots, trials = 6.0, 10, 200, 20, 500
    words = [f"pop{chr(97 + i)}" for i in range(popular)] + [f"rare{i:03d}" for i in range(rare)]
    vocab_file = tmp_path / "terms.txt"
    vocab_file.write_text("\n".join(words) + "\n")
    canary_terms = words[popular:popular + S]
    base = pd.DataFrame({"text": [" ".join(words[:popular])] * 30, "label": 0})
    with_canary = pd.concat([base, pd.DataFrame({"text": [" ".join(canary_terms)], "label": [0]})],
                            ignore_index=True)
    cfg = DpKpsConfig(data="unused", out=str(tmp_path / "out"), labels=["0"], method="independent",
                      vocab=str(vocab_file), eps_voc=eps,
                      first_terms=S,
                      vocab_size=popular + slots)
    canary_ids = set(range(popular, popular + S))
    rates = {}
    for name, corpus in (("with", with_canary), ("without", base)):
        counts = vocabulary_histogram.fn(corpus["text"].tolist(), cfg)
        hits = 0
        for trial in range(trials):  # a fresh run each time: the flow's own draw-once release, new noise
            ledger = PrivacyLedger(str(tmp_path / "state" / name), "fp", f"trial{trial}")
            released = release_vocabulary(counts, cfg, ledger)
            hits += len(canary_ids & {words.index(t) for t in released})
        rates[name] = hits / (trials * S)
    n = trials * S
    bound = math.exp(eps / S) * rates["without"]
    slack = 4 * math.sqrt(rates["with"] * (1 - rates["with"]) / n
                          + math.exp(2 * eps / S) * rates["without"] * (1 - rates["without"]) / n)
    assert rates["without"] > 0.05  # zero counts get noise too, so the test has power
    assert rates["with"] <= bound + slack, rates
    assert rates["with"] < 0.5  # the canary's terms are not reliably released


class _VoteSpy:
    """Records the exact votes a round's draw receives (the vote step's sum over the work units)."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __call__(self, *args, **kwargs):
        votes = self.real(*args, **kwargs)
        self.calls.append(np.array(votes, copy=True))
        return votes


def test_augpe_vote_noise_has_the_schedules_sigma(prefect_harness, tmp_path, monkeypatch):
    """Aug-PE (and AugPE+V~'s vocabulary) through augpe_flow with a deterministic fake LLM: every round's
    released histogram minus the exact votes is N(0, sigma^2) with the published schedule's sigma."""
    from privseed.flows.evolution import augpe_flow
    from privseed.tasks.dp import accounting
    from privseed.tasks.llm import register_backend
    from privseed.tasks.stages.pe_rounds import AugPeVote
    from privseed.tasks.seeds.vocabulary import english_vocabulary
    from tests.test_evolution_flow import FakeBackend

    data, frame = _corpus(tmp_path)
    spy = _VoteSpy(AugPeVote.exact_votes)
    monkeypatch.setattr(AugPeVote, "exact_votes", lambda self, *a: spy(self, *a))
    register_backend("local:fake-topics", FakeBackend())
    try:
        out = tmp_path / "augpe"
        augpe_flow({"data": data, "out": str(out), "state": str(tmp_path / "augpe-state"), "llm": "local:fake-topics",
                    "per_class": 4, "variations": 2, "iterations": 3, "epsilon": 2.0, "delta": 1e-5, "gate": False,
                    "doc_type": "short text", "seed": 3, "progress": False, "vocab_words": True,
                    "vocab_top": VOCAB_TOP, "eps_voc": EPS_VOC, "first_terms": S,
                    "labels": [str(label) for label in TOPICS]})
    finally:
        register_backend("local:fake-topics", None)
    ledger = json.loads((out / "ledger.json").read_text())
    schedule = next(e for e in ledger["entries"] if e["name"] == "augpe.schedule")
    sigma = schedule["params"]["sigma"]
    assert sigma == pytest.approx(accounting.augpe_noise_multiplier(2.0, 1e-5, 3))
    assert len(spy.calls) == 3
    noise = []
    for t, votes in enumerate(spy.calls, start=1):
        assert votes.sum() == len(frame)  # every private document voted once: these are the exact votes
        noise.append(_stored(out, f"augpe.round-{t:03d}.histogram")["noisy"] - votes)
    noise = np.concatenate(noise)
    assert noise.size == 3 * 3 * 4 * 3
    # 108 draws: the shape and the scale hold (too few to refute half the scale at 1e-9 every time)
    assert_noise_is(noise, "gaussian", sigma, wrong=())
    rounds = [e for e in ledger["entries"] if e["name"].startswith("augpe.round-")]
    assert all(e["accounted_in"] == "augpe.schedule" and not e["charged"] and e["scale"] == sigma for e in rounds)
    # AugPE+V~ used DP-KPS's vocabulary release: same name, mechanism and noise
    vocabulary = next(e for e in ledger["entries"] if e["name"] == "vocabulary")
    assert (vocabulary["mechanism"], vocabulary["sensitivity"], vocabulary["scale"]) == ("laplace", S, S / EPS_VOC)
    terms = english_vocabulary(VOCAB_TOP).terms
    voc_noise = _stored(out, "vocabulary")["noisy"] - _exact_vocabulary_histogram(frame["text"].tolist(), terms, S)
    assert_noise_is(voc_noise, "discrete-laplace", S / EPS_VOC)
    assert ledger["total"]["epsilon"] == pytest.approx(2.0 + EPS_VOC) and ledger["total"]["secure"] is True


def _first_distinct(text: str, allowed, count: int) -> list[str]:
    """A document's first ``count`` distinct tokens among ``allowed`` (every public term here is one word)."""
    out: list[str] = []
    for token in _tokens(text):
        if token in allowed and token not in out:
            out.append(token)
            if len(out) == count:
                break
    return out


def test_histogram_markov_noise_is_discrete_laplace_of_each_stages_sensitivity(prefect_harness, tmp_path):
    """The real flow with --method histogram-markov: stage 1's noise (every term of V, every class) is discrete
    Laplace of scale S / eps_1, stage 2's (every pair among each class's P candidates) of scale
    S_2 (S_2 - 1) / 2 / eps_2; both recomputed here from the corpus and the stored releases. The pair noise is
    refused at half and at twice its scale, so a pair stage calibrated to another sensitivity fails."""
    from privseed.flows.dpkps import dpkps_flow
    from privseed.tasks.seeds.vocabulary import english_vocabulary

    data, frame = _corpus(tmp_path)
    out = tmp_path / "markov"
    # eps_1 = 18 lets the topic words stand out of the noise, so the pair candidates are words of the class
    epsilon, share, pair_terms, pair_top = 20.0, 0.9, 3, 30
    dpkps_flow(_dpkps_config(data, out, method="histogram-markov", mechanism="laplace", epsilon=epsilon,
                             markov_term_share=share, markov_pair_terms=pair_terms, markov_pair_top=pair_top,
                             hist_top_k=60))
    eps_1, eps_2 = share * epsilon, epsilon - share * epsilon
    terms = english_vocabulary(VOCAB_TOP).terms
    index = {t: i for i, t in enumerate(terms)}
    term_noise, pair_noise, co_occurring = [], [], 0
    for c, label in enumerate(sorted(TOPICS)):
        texts = frame.loc[frame["label"] == label, "text"].tolist()
        exact = np.zeros(len(terms), dtype=np.int64)
        for text in texts:
            exact[[index[t] for t in _first_distinct(text, index, S)]] += 1
        assert exact.sum() > 50
        term_noise.append(_stored(out, f"histogram-class{c}")["noisy"] - exact)
        released = _stored(out, f"markov-class{c}")
        candidates = [terms[int(i)] for i in released["pair_ids"]]
        assert len(candidates) == pair_top
        position = {t: i for i, t in enumerate(candidates)}
        pairs = np.zeros((pair_top, pair_top), dtype=np.int64)
        for text in texts:
            kept = sorted(position[t] for t in _first_distinct(text, position, pair_terms))
            for n, i in enumerate(kept):
                for j in kept[n + 1:]:
                    pairs[i, j] += 1
        exact_pairs = pairs[np.triu_indices(pair_top, 1)]  # the release's order: the upper triangle, row by row
        co_occurring += int(exact_pairs.sum())
        pair_noise.append(released["noisy"] - exact_pairs)
    # the candidates do co-occur (pooled: which words of a 12-document class become candidates is noisy)
    assert co_occurring > 20
    term_noise, pair_noise = np.concatenate(term_noise), np.concatenate(pair_noise)
    assert term_noise.size == 3 * len(terms) and pair_noise.size == 3 * pair_top * (pair_top - 1) // 2
    assert_noise_is(term_noise, "discrete-laplace", S / eps_1)
    stated = pair_terms * (pair_terms - 1) / 2 / eps_2  # 3 pairs per document over eps_2 = 2
    assert_noise_is(pair_noise, "discrete-laplace", stated)  # refuted at half and at twice the scale
    ledger = json.loads((out / "ledger.json").read_text())
    markov = [e for e in ledger["entries"] if e["name"].startswith("markov-class")]
    assert len(markov) == 3 and all(e["sensitivity"] == 3.0 and e["scale"] == pytest.approx(stated) for e in markov)
    assert ledger["total"]["epsilon"] == pytest.approx(epsilon)


def _rank_weights(ids: list[int], common_rank: int | None = None, power: float = 0.0,
                  decay: float = 0.5) -> list[float]:
    """The i-th of a document's n distinct terms i^-decay, times min(1, (r + 1) / R)^a for a term at position r of
    V when R is given, scaled to L2 norm 1."""
    raw = [i ** -decay * (1.0 if common_rank is None else min(1.0, (r + 1) / common_rank) ** power)
           for i, r in enumerate(ids, start=1)]
    norm = math.sqrt(sum(w * w for w in raw))
    return [w / norm for w in raw]


#: A document's weights on its distinct terms (their positions in V, in reading order), written out here from
#: docs/dpkps.md (not taken from the code under test): unit-l2 1/sqrt(n) each; rank-l2 the i-th 1/sqrt(i), over
#: sqrt(1 + 1/2 + ... + 1/n); slow-rank-l2 the i-th i^-0.25, scaled to norm 1; rank-rare-l2 rank-l2's times
#: min(1, (r + 1) / 2000)^2 for the term at position r, scaled to norm 1. Each is told apart from the next kind's
#: weights in the list (the last from the first).
WHOLE_DOCUMENT_WEIGHTS = {
    "unit-l2": lambda ids: [1.0 / math.sqrt(len(ids))] * len(ids),
    "rank-l2": _rank_weights,
    "slow-rank-l2": lambda ids: _rank_weights(ids, decay=0.25),
    "rank-rare-l2": lambda ids: _rank_weights(ids, 2000, 2.0),
}


@pytest.mark.parametrize("contribution", sorted(WHOLE_DOCUMENT_WEIGHTS))
def test_histogram_whole_document_noise_is_gaussian_of_sensitivity_one(prefect_harness, tmp_path, contribution):
    """The real flow with --method histogram --hist-contribution unit-l2, rank-l2, slow-rank-l2 or rank-rare-l2: each
    document adds its weights to each of its n distinct terms (all of them, although S = 2 here), and the released rows
    minus those weights, recomputed here, are Gaussian of sigma = z(eps, delta) * 1 on every term of V of every class;
    the ledger says L2 sensitivity 1. Half or twice sigma is refuted, and so is a count of the first S terms only (its
    residuals on the counted terms would be far from 0) and every other contribution's weights (at epsilon 200 sigma is
    0.063, under the weights' differences, so residuals from the wrong weights are too wide)."""
    from privseed.flows.dpkps import dpkps_flow
    from privseed.tasks.dp.mechanisms import gaussian_noise_multiplier
    from privseed.tasks.seeds.vocabulary import english_vocabulary

    data, frame = _corpus(tmp_path)
    out = tmp_path / contribution
    epsilon, delta = 200.0, 1e-6
    dpkps_flow(_dpkps_config(data, out, method="histogram", epsilon=epsilon, delta=delta, mechanism="gaussian",
                             hist_contribution=contribution, first_terms=2, hist_top_k=60))
    sigma = gaussian_noise_multiplier(epsilon, delta)
    terms = english_vocabulary(VOCAB_TOP).terms
    index = {t: i for i, t in enumerate(terms)}
    others = [kind for kind in WHOLE_DOCUMENT_WEIGHTS if kind != contribution]
    noise, on_terms = [], []
    other_on_terms: dict[str, list[np.ndarray]] = {kind: [] for kind in others}
    for c, label in enumerate(sorted(TOPICS)):
        exact = np.zeros(len(terms))
        exact_other = {kind: np.zeros(len(terms)) for kind in others}
        for text in frame.loc[frame["label"] == label, "text"]:
            distinct = _first_distinct(text, index, len(terms))
            assert len(distinct) > 2  # every document has more terms than S: the rest must count too
            ids = [index[t] for t in distinct]
            exact[ids] += WHOLE_DOCUMENT_WEIGHTS[contribution](ids)
            for kind in others:
                exact_other[kind][ids] += WHOLE_DOCUMENT_WEIGHTS[kind](ids)
        released = _stored(out, f"histogram-class{c}")["noisy"]
        residual = released - exact
        noise.append(residual)
        on_terms.append(residual[exact > 0])
        for kind in others:
            other_on_terms[kind].append((released - exact_other[kind])[exact > 0])
    assert_noise_is(np.concatenate(noise), "gaussian", sigma)
    on_terms_ = np.concatenate(on_terms)
    assert abs(on_terms_.mean()) < 5 * sigma / math.sqrt(on_terms_.size)  # the recomputed weights are the flow's
    assert scale_pvalue(on_terms_, "gaussian", sigma) > FALSE_ALARM
    for kind in others:  # every other kind's weights are refuted, the nearest (decays 0.5 and 0.25) included
        assert scale_pvalue(np.concatenate(other_on_terms[kind]), "gaussian", sigma) < FALSE_ALARM, kind
    ledger = json.loads((out / "ledger.json").read_text())
    stage = [e for e in ledger["entries"] if e["name"].startswith("histogram-class")]
    assert len(stage) == 3 and all(e["sensitivity"] == 1.0 and e["scale"] == pytest.approx(sigma) for e in stage)
    assert ledger["total"]["epsilon"] == pytest.approx(epsilon) and ledger["total"]["delta"] == pytest.approx(delta)


def test_thresholded_histogram_releases_only_occurring_terms_with_discrete_laplace_noise(prefect_harness,
                                                                                          tmp_path):
    """The real flow with --method histogram --mechanism laplace-threshold: no term that no document of the class
    holds is ever released (every one of |V| x 3 entries stays 0), every released count passes the ledger's
    threshold, and the released counts minus the exact first-S distinct counts (recomputed here; every occurring
    count is far above the threshold, so none is cut) are discrete Laplace of scale S / eps."""
    from privseed.flows.dpkps import dpkps_flow
    from privseed.tasks.seeds.vocabulary import english_vocabulary

    rows = [(text, label) for label, texts in TOPICS.items() for text in texts for _ in range(100)]
    frame = pd.DataFrame(rows, columns=["text", "label"])
    data = str(tmp_path / "corpus.parquet")
    frame.to_parquet(data, index=False)
    out = tmp_path / "threshold"
    epsilon, delta = 5.0, 1e-6
    dpkps_flow(_dpkps_config(data, out, method="histogram", epsilon=epsilon, delta=delta,
                             mechanism="laplace-threshold", hist_top_k=60))
    ledger = json.loads((out / "ledger.json").read_text())
    stage = [e for e in ledger["entries"] if e["name"].startswith("histogram-class")]
    threshold = stage[0]["guarantee"]["threshold"]
    assert len(stage) == 3 and all(e["mechanism"] == "laplace-threshold" and e["scale"] == S / epsilon for e in stage)
    assert ledger["total"]["epsilon"] == pytest.approx(epsilon) and 0 < ledger["total"]["delta"] <= delta
    terms = english_vocabulary(VOCAB_TOP).terms
    index = {t: i for i, t in enumerate(terms)}
    noise = []
    for c, label in enumerate(sorted(TOPICS)):
        exact = np.zeros(len(terms), dtype=np.int64)
        for text in frame.loc[frame["label"] == label, "text"]:
            exact[[index[t] for t in _first_distinct(text, index, S)]] += 1
        released = _stored(out, f"histogram-class{c}")["noisy"]
        assert not released[exact == 0].any()  # pure-noise terms never reach the release
        assert (exact[exact > 0] >= threshold + 30 * S / epsilon).all()  # so no occurring count is cut
        assert (released[exact > 0] >= threshold).all()
        noise.append(released[exact > 0] - exact[exact > 0])
    noise_ = np.concatenate(noise)
    assert noise_.size > 40 and np.any(noise_ != 0)
    assert_noise_is(noise_, "discrete-laplace", S / epsilon, wrong=())  # too few draws to refute 2x; shape + scale
