"""The DP-KPS privatization stages (steps 2-6 of docs/dpkps.md): V~, its embedding, the per-class sketches and
the sampled keyphrase sequences.

The exact counts come from pass 1 (``privseed.tasks.stages.corpus.scan_private_corpus`` with ``term_counting``); the
sketch sums from pass 2 here (``exact_sketch_sums``), unit by unit on the workers. Every release goes through the ledger
(``PrivacyLedger.draw_once``), so noise is drawn once and re-read on retry or re-run. The math is in
tasks/seeds/vocabulary.py, tasks/seeds/kde.py and tasks/seeds/sampling.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pandas as pd

from privseed.tasks.config.commands import AugPeConfig, DpKpsConfig
from privseed.tasks.dp.ledger import PrivacyLedger
from privseed.tasks.dp.mechanisms import mechanism_kind
from privseed.tasks.seeds.corpus_profile import ADAPTIVE_OPTIONS, asks_for_profile, settled
from privseed.tasks.seeds.passes import TermCounting
from privseed.tasks.seeds.seed_methods import HISTOGRAM_METHODS, SEED_METHODS
from privseed.tasks.stages import private_stage, public_stage, stage_logger
from privseed.tasks.data.units import CorpusPlan

def selection_rule(cfg: DpKpsConfig) -> str:
    if cfg.selection is None:  # the method's own default, chosen on public data (tasks/seeds/seed_methods.py)
        return SEED_METHODS[cfg.method].default_selection
    if cfg.selection == "top-k":
        return f"top-{cfg.top_k}"
    if cfg.selection == "power":
        return f"power-{cfg.power:g}"
    return cfg.selection


def term_counting(cfg: DpKpsConfig | AugPeConfig) -> TermCounting:
    """What pass 1 counts for this configuration: per class for the histogram methods, the vocabulary histogram
    of DP-KPS and AugPE+V~ otherwise (``cfg`` carries vocab, vocab_top, first_terms)."""
    from privseed.tasks.seeds.vocabulary import DEFAULT_ENGLISH_TOP_N

    per_class = getattr(cfg, "method", None) in HISTOGRAM_METHODS
    # an adaptive option left "auto": pass 1 also counts the corpus profile (tasks/seeds/corpus_profile.py)
    profile = per_class and asks_for_profile({name: getattr(cfg, name) for name in ADAPTIVE_OPTIONS})
    return TermCounting(cfg.vocab, cfg.vocab_top or DEFAULT_ENGLISH_TOP_N, cfg.first_terms, per_class=per_class,
                        contribution=getattr(cfg, "hist_contribution", "first-terms") if per_class else "first-terms",
                        profile=profile)


@private_stage("vocabulary-histogram")
def vocabulary_histogram(texts: Sequence[str], cfg: DpKpsConfig | AugPeConfig) -> np.ndarray:
    """The vocabulary histogram of documents already in memory: the counts pass 1 makes unit by unit
    (``scan_private_corpus`` with ``term_counting``), for checks that hold the documents (the audit's trials run
    pass 1 itself)."""
    from privseed.tasks.seeds.vocabulary import require_vocabulary_hits

    counts = term_counting(cfg).count(texts)
    require_vocabulary_hits(counts, cfg.vocab)
    return counts


def release_vocabulary(counts: np.ndarray, cfg: DpKpsConfig | AugPeConfig, ledger: PrivacyLedger) -> list[str]:
    """V~: the vocabulary mechanism (discrete Laplace, scale S / eps_voc, on every term of V) then the top N,
    drawn once through the ledger under the name ``vocabulary``. The one vocabulary privatization of privseed:
    DP-KPS and AugPE+V~ both call it. ``cfg`` carries vocab, vocab_top, first_terms, vocab_size, eps_voc.

    The ledger stores the full noisy histogram next to the top-N ids, so the released values can be checked
    against the mechanism. The seed is not a parameter of this release: it does not influence the noise
    (except under --insecure-reproducible-noise, where the noise source names it)."""
    from privseed.tasks.seeds.vocabulary import DEFAULT_ENGLISH_TOP_N, load_vocabulary, top_terms, vocabulary_mechanism

    top_n = cfg.vocab_top or DEFAULT_ENGLISH_TOP_N
    vocabulary = load_vocabulary(cfg.vocab, top_n)
    params = {"vocab": vocabulary.name, "vocab_terms": len(vocabulary), "first_terms": cfg.first_terms,
              "vocab_size": cfg.vocab_size, "adjacency": "add/remove one document"}
    released = ledger.draw_once(
        "vocabulary", mechanism=vocabulary_mechanism(cfg.eps_voc, cfg.first_terms), noise=cfg.noise("vocabulary"),
        params=params, stage="vocabulary", exact=lambda: counts,
        postprocess=lambda noisy: top_terms(noisy, cfg.vocab_size),
    )
    return [vocabulary.terms[int(i)] for i in released["term_ids"]]


@private_stage("privatize-vocabulary")
def privatize_vocabulary_stage(counts: np.ndarray, cfg: DpKpsConfig | AugPeConfig, ledger: PrivacyLedger) -> list[str]:
    """V~ (``release_vocabulary``), as a task."""
    terms = release_vocabulary(counts, cfg, ledger)
    stage_logger().info("privatized vocabulary: %d terms", len(terms))
    return terms


@public_stage("embed-released-vocabulary", retries=2)
def embed_released_vocabulary(terms: list[str], cfg: DpKpsConfig) -> np.ndarray:
    """Unit-norm embeddings of V~ (public from here on); private documents are looked up, not embedded."""
    from privseed.tasks.data.embedding import embed_texts

    return embed_texts(terms, cfg.embedding_model)


def feature_specs(cfg: DpKpsConfig, dim: int) -> list:
    """The public random-feature specs of the method's sketch ensemble (regenerated bit for bit on any worker)."""
    from privseed.tasks.seeds.kde import FeatureSpec
    from privseed.tasks.seeds.sampling import ensemble_blocks

    return [FeatureSpec(seed=cfg.seed, name=f"{cfg.method}-{k}", n_features=cfg.n_features, dim=dim, blocks=b,
                        bandwidth=cfg.bandwidth)
            for k, b in enumerate(ensemble_blocks(cfg.method, settled(cfg.length, "--length")))]


@private_stage("sketch-sums", retries=0)  # a unit retries its own transient failures (tasks/data/units.py)
def exact_sketch_sums(plan: CorpusPlan, labels: list, terms: list[str], embeddings: np.ndarray,
                      cfg: DpKpsConfig) -> np.ndarray:
    """Pass 2: exact per-class sketch sums (classes, sketches, I), each unit re-read from storage on a worker and
    matched against V~, the partial sums combined in a tree on the cluster. Private: only the released sums
    (``privatize_sketches``) leave this process."""
    from privseed.tasks.seeds.passes import DeclaredLabels, SketchSpec, combine_sums, sketch_unit
    from privseed.tasks.stages.corpus import unit_progress, unit_reader
    from privseed.tasks.data.units import map_reduce_units

    spec = SketchSpec(unit_reader(cfg), DeclaredLabels(tuple(labels), cfg.label_column), tuple(terms),
                      np.asarray(embeddings), tuple(feature_specs(cfg, embeddings.shape[1])),
                      single_terms=cfg.method == "independent")
    return map_reduce_units(sketch_unit, plan.units, combine_sums, spec, on_done=unit_progress("pass 2"))


@private_stage("privatize-sketches")
def privatize_sketches(exact: np.ndarray, labels: list, terms: list[str], embeddings: np.ndarray, cfg: DpKpsConfig,
                       ledger: PrivacyLedger) -> np.ndarray:
    """Noise once per (class, sketch) on the exact sums, through the ledger. Classes are disjoint (parallel
    composition); the sketches of one class split eps_kde (basic composition). Returns the released sums
    (classes, sketches, I)."""
    specs = feature_specs(cfg, embeddings.shape[1])
    mechanisms = sketch_mechanisms(cfg, specs)
    released = np.zeros_like(exact)
    for c in range(len(labels)):
        for k, spec in enumerate(specs):
            # The feature seed identifies the public features the sum was computed on; it draws no noise.
            params = {"method": cfg.method, "length": cfg.length, "sketch": k, "blocks": spec.blocks,
                      "n_features": spec.n_features, "bandwidth": spec.bandwidth, "feature_seed": spec.seed,
                      "feature_stream": spec.name, "embedding_model": cfg.embedding_model, "dim": spec.dim,
                      "vocabulary": _terms_digest(terms),
                      "adjacency": "add/remove one document", "contribution": "sum of per-document phi"}
            released[c, k] = ledger.draw_once(
                f"kde-class{c}-sketch{k}", params=params, partition=f"class{c}", stage="kde",
                mechanism=mechanisms[k],
                noise=cfg.noise("kde-noise", str(c), str(k)),
                exact=lambda c=c, k=k: exact[c, k],  # type: ignore[misc]  # mypy cannot type default-argument lambdas
            )["noisy"]
    stage_logger().info("released %d sketch(es) per class, I=%d", len(specs), cfg.n_features)
    return released


def sketch_mechanisms(cfg: DpKpsConfig, specs: list) -> list:
    """The mechanism of each sketch of the ensemble: eps_kde split over the sketches (basic composition)."""
    from privseed.tasks.seeds.kde import sketch_mechanism
    from privseed.tasks.seeds.sampling import split_budget

    budgets = split_budget(cfg.method, cfg.eps_kde, settled(cfg.length, "--length"))
    delta_each = cfg.delta / len(specs) if mechanism_kind(cfg.mechanism).spends_delta else 0.0
    return [sketch_mechanism(cfg.mechanism, spec.n_features, budgets[k], delta_each) for k, spec in enumerate(specs)]


def signal_warning(released: np.ndarray, labels: list, cfg: DpKpsConfig, specs: list) -> str | None:
    """One paragraph saying why a DP-KPS sampler cannot work on this release, or None when it can: for each
    sketch, in how many classes the released sum cannot be told from pure noise
    (``privseed.tasks.seeds.kde.sketch_signal``:
    estimated signal energy under 3 noise standard deviations), with the numbers that decided it. Uses the released
    sums and public parameters only."""
    from privseed.tasks.seeds.kde import SIGNAL_Z, sketch_signal

    lines = []
    for k, (spec, mechanism) in enumerate(zip(specs, sketch_mechanisms(cfg, specs))):
        signals = [sketch_signal(released[c, k], mechanism) for c in range(len(labels))]
        swamped = sum(s.swamped for s in signals)
        if swamped * 2 > len(labels):
            z = np.median([s.z for s in signals])
            ratio = np.median([s.signal / s.noise_energy for s in signals])
            lines.append(f"sketch {k} ({spec.blocks} block(s), epsilon {mechanism.epsilon:.3g}, noise scale "
                         f"{mechanism.scale:.3g}): {swamped} of {len(labels)} classes indistinguishable from noise "
                         f"(median estimated signal energy {ratio:.2%} of the noise energy, {z:.2f} noise standard "
                         f"deviations; {SIGNAL_Z:g} needed)")
    if not lines:
        return None
    return (f"--method {cfg.method}: noise swamps the signal of the released sketches, so the sequences it samples "
            "will be close to chance for their class:\n  " + "\n  ".join(lines) + "\n  The samplers need more "
            "documents per class or more epsilon per sketch (iterative-linear splits --eps-kde over L sketches, "
            "iterative-log over about log2 L; independent uses one); --method histogram works at this size "
            "(docs/dpkps.md, 'Where the paper's samplers work').")


def _terms_digest(terms: list[str]) -> str:
    return hashlib.sha256("\n".join(terms).encode()).hexdigest()[:16]


@public_stage("sample-sequences", retries=2)
def sample_keyphrase_sequences(released: np.ndarray, labels: list, terms: list[str], embeddings: np.ndarray,
                               cfg: DpKpsConfig) -> pd.DataFrame:
    """Post-processing of the released sketches: per_class sequences of length L per class."""
    from privseed.tasks.dp.ledger import public_rng
    from privseed.tasks.seeds.sampling import SelectionRule, SketchTables, default_device, sample_sequences

    warning = signal_warning(released, labels, cfg, feature_specs(cfg, embeddings.shape[1]))
    if warning is not None:  # said before any sequence is sampled and released
        stage_logger().warning("%s", warning)
    device = default_device()
    rule = SelectionRule.parse(selection_rule(cfg))
    sketches = [SketchTables.build(spec.draw(), embeddings, device=device)
                for spec in feature_specs(cfg, embeddings.shape[1])]
    ids = sample_sequences(cfg.method, sketches, released, per_class=cfg.per_class,
                           length=settled(cfg.length, "--length"), rule=rule, rng=public_rng(cfg.seed, "sample"))
    rows = [(label, [terms[t] for t in seq]) for c, label in enumerate(labels) for seq in ids[c]]
    stage_logger().info("sampled %d sequences per class (%s, %s, device %s)", cfg.per_class, cfg.method, rule, device)
    sequences = pd.DataFrame({"label": [r[0] for r in rows], "keyphrases": [r[1] for r in rows]})
    # Generation mints prompt seeds only from terms of the released vocabulary (tasks/llm/released.py).
    sequences.attrs["released_vocabulary"] = list(terms)
    sequences.attrs["released_vocabulary_source"] = "ledger:vocabulary"
    return sequences
