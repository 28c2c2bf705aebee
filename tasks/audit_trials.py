"""The trials of `privseed audit`: an empirical privacy audit of every mechanism, run through the flows' own
stage functions (tasks/audit.py holds the statistics; flows/audit.py the command line).

For each mechanism the audit runs the stage exactly as the flow runs it (the same stage/task function, a fresh
ledger in a fresh temporary state folder per trial, the same public configuration and the same ``--seed`` every
trial) many times on a small public corpus D and on D' = D plus one canary document built to move the release as
much as one document can. A threshold test on what the stage RELEASED (the values the ledger stores and the
stage's output, never a private intermediate) tries to tell D' from D; its true and false positive rates become a
95 % Clopper-Pearson lower bound on epsilon (tasks/audit.py). The claimed epsilon is what the trial's ledger
charged. A lower bound above the claim refutes the claim: the command then exits with status 1.

    vocabulary  DP-KPS's vocabulary histogram (privatize_vocabulary_stage). Canary: a document whose first S terms
                are one term of V that no other document uses, so it moves that term's count by S, the whole L1
                sensitivity, on one coordinate (S distinct terms would move S coordinates by 1 each, and a test on
                one of them bounds only eps / S: a noise scale 2x too small would pass). N = |V|, so every
                term's noisy count is released (V~ membership and order are functions of those counts and cannot
                make a stronger test).
    kde         DP-KPS's per-class DP-KDE (privatize_sketches, then sample_keyphrase_sequences). Canary: a class-0
                document whose phrases are one term far from the class's. Tests: the released sketch's score of the
                canary term, the Laplace likelihood ratio of the released sketch (the adversary knows D's exact
                sum), and how often the term appears in class 0's sampled sequences.
    markov      histogram-markov's pair stage (privatize_class_histograms, then privatize_class_pairs; the term stage
                takes a quarter of the budget 1). Canary: a class-0 document of three terms no document uses, so its
                S_2 = 3 candidate terms move three pair counts of class 0 by 1 each: its whole L1 sensitivity
                S_2 (S_2 - 1) / 2. Tests: the Laplace likelihood ratio of those three released counts (the adversary
                knows D's exact counts, 0) and their sum. K and P cover V, so the pairs are released every trial.
    augpe       One Aug-PE round (charge_augpe_schedule + augpe_round_histogram, T = 1). Canary: a private
                document identical to one candidate that no other document votes for. Test: its noisy count.
    histogram-unit-l2  The histogram methods' stage 1 with --hist-contribution unit-l2 (Gaussian, L2 sensitivity
                1). Canary: a class-0 document of four terms no document uses, 1/2 each (L2 norm 1). Tests: the sum
                of the four released weights (the Gaussian likelihood ratio) and their maximum.
    histogram-threshold  The same stage with --mechanism laplace-threshold and delta 1e-5: the canary's terms
                exist only on D', so they are released only when their noisy counts pass the threshold.
    secpe       One SecPE round (detect_secrets, secpe_noise, charge_secpe_schedule, secpe_round_release, T = 1)
                with a public sigma (--noise-multiplier), auditing the DP epsilon SecPE reports "if rho and sigma
                are fixed". The canary holds no secret, so rho = 1 (it is always sampled). K = 2 public clusters,
                and only the canary's class is drawn per trial (the other classes' releases are independent of
                it). Tests: the noisy size of its cluster, the centre's move towards it, and their
                likelihood-ratio combination.

Small public configs keep a trial cheap (a 57-term vocabulary file, 36 documents, I = 32, epsilon 1-2 per
mechanism). With noise drawn from --seed (main before issue 13) or from ``--insecure-reproducible-noise``, every
trial on D is identical, and so is every trial on D': the test separates them perfectly and the bound reaches
about 5 with 500 trials per side, above every claim. The trials call the stage functions directly (``.fn``), not
through a Prefect flow run per trial: a flow run costs more than the trial itself.
"""
from __future__ import annotations

import abc
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import privseed.tasks._runtime  # noqa: F401  (offline settings before prefect is imported)
import numpy as np
import pandas as pd
from pydantic import BaseModel

from privseed.tasks import audit as stats
from privseed.tasks import jsonable, storage
from privseed.tasks.config import AUDIT_MECHANISMS, AUDIT_PROFILES
from privseed.tasks.errors import ConfigError
from privseed.tasks.ledger import PrivacyLedger

log = logging.getLogger(__name__)

MECHANISMS = AUDIT_MECHANISMS


@dataclass(frozen=True)
class Profile:
    calibration: int  # trials per corpus that choose the test
    evaluation: int   # trials per corpus that measure it


# quick: in the test suite (1-2 minutes on two shared cores). full: the figures of docs/privacy.md; with 500
# evaluation trials per side a perfect test bounds epsilon by about 4.9, above every claim audited here.
PROFILES = {name: Profile(*counts) for name, counts in AUDIT_PROFILES.items()}

# ---------------------------------------------------------------------------------------------------------
# The public audit corpus. Everything here is public by construction: the audit never reads private data.
# ---------------------------------------------------------------------------------------------------------
_TOPICS = {
    0: ["football club player scored goals league season", "striker signed contract club league",
        "goalkeeper saved penalty match season", "coach team won championship league title"],
    1: ["river valley mountain lake forest village", "mountain peak glacier valley river",
        "lake shore forest island river", "forest national park mountain trail lake"],
    2: ["album band song released records guitar", "singer recorded album single records",
        "band tour guitar drums album", "song chart single album music video"],
}
#: A term of V that no document of D contains: the vocabulary canary is this term S times.
VOCABULARY_CANARY_TERM = "zeppelin"
#: Terms of V that no document uses (their counts are pure noise, as most of a real vocabulary's are).
_UNUSED_TERMS = ("quasar", "obsidian", "marzipan", "lava", "eruption", "bakery", "recipe", "invoice", "pension")
#: The KDE canary's one phrase, far (in MiniLM space) from class 0's football terms.
KDE_CANARY_TERM = "volcano"

#: Aug-PE candidates (public synthetic texts). The last class-0 candidate is the one the canary is closest to.
_CANDIDATES = [
    ("The striker scored two goals and the club won the league title this season.", 0),
    ("Our goalkeeper saved a penalty late in the match to keep the championship hopes alive.", 0),
    ("The coach signed a new contract after the team finished top of the league.", 0),
    ("The volcano erupted at night and rivers of molten lava ran down into the sea.", 0),
    ("A quiet river winds through the valley below the snowy mountain peaks.", 1),
    ("Hikers followed the forest trail around the lake to the small village.", 1),
    ("The band released a new album with loud guitars and heavy drums.", 2),
    ("The singer recorded a single that climbed to the top of the chart.", 2),
]
_ISOLATED_CANDIDATE = 3

#: SecPE's public corpus (k-means centres) and its canary, a document far from every private one.
_PUBLIC_TEXTS = [
    "The club won the football league after a long season.", "A late goal decided the championship match.",
    "The team signed a young striker from a rival club.", "Fans celebrated the title in the city square.",
    "The river flows from the glacier down the mountain valley.", "A forest trail leads around the quiet lake.",
    "The national park protects the island's wild shore.", "Snow covers the mountain peaks above the village.",
    "The band recorded its new album in a small studio.", "The singer's single reached the top of the chart.",
    "The guitar and drums drove the band's live tour.", "A music video for the song was released online.",
    "The bakery sells fresh bread and pastries every morning.", "Mix the flour and butter before adding sugar.",
    "The recipe calls for two eggs and a cup of milk.", "Slow roasting keeps the vegetables tender.",
]
_SECPE_CANARY = "Quarterly invoices for the municipal pension fund were audited by the city treasury."
_NOBODY_HOLDS_THIS_SECRET = "xylophonist"


def audit_corpus() -> pd.DataFrame:
    """D: 36 short labelled documents, three classes (each text three times, like a small private corpus)."""
    rows = [(text, label) for label, texts in _TOPICS.items() for text in texts for _ in range(3)]
    return pd.DataFrame(rows, columns=["text", "label"])


def audit_vocabulary_terms() -> list[str]:
    words = sorted({w for texts in _TOPICS.values() for t in texts for w in t.split()})
    return words + [VOCABULARY_CANARY_TERM, KDE_CANARY_TERM, *_UNUSED_TERMS]


def _with(corpus: pd.DataFrame, text: str, label: Any) -> pd.DataFrame:
    return pd.concat([corpus, pd.DataFrame({"text": [text], "label": [label]})], ignore_index=True)


# ---------------------------------------------------------------------------------------------------------
# Trial plumbing: a fresh ledger per trial that also remembers what it released
# ---------------------------------------------------------------------------------------------------------
class _RecordingLedger(PrivacyLedger):
    """The flows' ledger, unchanged, plus a record of the arrays every draw returned: what the stage released."""

    released: dict[str, dict[str, np.ndarray]]


def _recording(method: str) -> Callable[..., dict[str, np.ndarray]]:
    def draw(self: _RecordingLedger, name: str, **kwargs: Any) -> dict[str, np.ndarray]:
        out = getattr(PrivacyLedger, method)(self, name, **kwargs)
        self.__dict__.setdefault("released", {})[name] = {k: np.asarray(v) for k, v in out.items()}
        return out

    return draw


for _method in ("draw_once", "draw_once_unverified"):
    if hasattr(PrivacyLedger, _method):
        setattr(_RecordingLedger, _method, _recording(_method))


def _noise_label(ledger: PrivacyLedger) -> str:
    """How the trial's noise was drawn, from what the ledger recorded (older ledgers record nothing)."""
    flags = [e.get("secure", "unrecorded") for e in ledger.entries()]
    if any(f is False for f in flags):
        return "insecure-reproducible"
    if flags and all(f is True for f in flags):
        return "secure"
    return "unrecorded (drawn from --seed)" if any(f == "unrecorded" for f in flags) else "unverified"


class _Mechanism(abc.ABC):
    """One audited mechanism: its public setup (done once) and its trial (run many times)."""

    name: str = ""

    def __init__(self, workdir: Path, insecure: bool) -> None:
        self.workdir = workdir
        self.insecure = insecure
        self.claim: tuple[float, float] | None = None
        self.noise = "unknown"

    @contextmanager
    def ledger(self) -> Iterator[_RecordingLedger]:
        """A fresh state folder and ledger for one trial: nothing drawn in one trial is re-read by the next."""
        state = Path(tempfile.mkdtemp(prefix="trial-", dir=self.workdir))
        try:
            ledger = _RecordingLedger(str(state), "audit-corpus", "audit-trial")
            ledger.__dict__["released"] = {}
            yield ledger
            claim = ledger.total()
            if self.claim is None:
                self.claim, self.noise = claim, _noise_label(ledger)
            elif not np.allclose(claim, self.claim):
                raise ConfigError(f"audit {self.name}: the ledger charged {claim} in one trial and {self.claim} in "
                                  "another; the claim must not depend on the corpus")
        finally:
            shutil.rmtree(state, ignore_errors=True)

    def config_values(self, values: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
        # The fixtures' classes are 0, 1, 2; declared like every run declares them.
        values = {"data": "audit://public-audit-corpus", "out": str(self.workdir / "out"), "gate": False,
                  "seed": 0, "labels": ["0", "1", "2"], **values}
        if self.insecure:
            if "insecure_reproducible_noise" not in model.model_fields:
                raise ConfigError("this version of privseed has no --insecure-reproducible-noise: its noise is "
                                  "drawn from --seed already; run the audit without the flag")
            values["insecure_reproducible_noise"] = True
        return values

    @abc.abstractmethod
    def trial(self, with_canary: bool) -> dict[str, float]:
        """Run the stage once on D (or D') and return the test statistics of what it released."""


class VocabularyAudit(_Mechanism):
    name = "vocabulary"

    def __init__(self, workdir: Path, insecure: bool) -> None:
        super().__init__(workdir, insecure)
        from privseed.tasks.config import DpKpsConfig
        from privseed.tasks.vocabulary import load_vocabulary

        path = workdir / "audit-vocabulary.txt"
        path.write_text("\n".join(audit_vocabulary_terms()) + "\n", encoding="utf-8")
        vocabulary = load_vocabulary(str(path))
        self.size = len(vocabulary)
        self.canary_id = vocabulary.terms.index(VOCABULARY_CANARY_TERM)
        self.cfg = DpKpsConfig(**self.config_values(dict(
            vocab=str(path), vocab_top=None, first_terms=4, vocab_size=self.size, eps_voc=1.0, n_workers=1),
            DpKpsConfig))
        self.private = audit_corpus()
        self.canary = _with(self.private, " ".join([VOCABULARY_CANARY_TERM] * self.cfg.first_terms), 0)

    def trial(self, with_canary: bool) -> dict[str, float]:
        from privseed.tasks.stages.dpkps import privatize_vocabulary_stage, vocabulary_histogram

        corpus = self.canary if with_canary else self.private
        with self.ledger() as ledger:
            counts = vocabulary_histogram.fn(corpus["text"].tolist(), self.cfg)
            privatize_vocabulary_stage.fn(counts, self.cfg, ledger)
            noisy = released_counts(ledger.released["vocabulary"], self.size)
        return {f"noisy count of '{VOCABULARY_CANARY_TERM}'": float(noisy[self.canary_id])}


def released_counts(released: Mapping[str, np.ndarray], size: int) -> np.ndarray:
    """The noisy count of every term of V from a vocabulary release (-inf for a term not released)."""
    if "noisy" in released and np.asarray(released["noisy"]).shape == (size,):
        return np.asarray(released["noisy"], dtype=np.float64)
    if "term_ids" in released and "noisy_counts" in released:
        out = np.full(size, -np.inf)
        out[np.asarray(released["term_ids"], dtype=np.int64)] = np.asarray(released["noisy_counts"], dtype=np.float64)
        return out
    raise ConfigError(f"the vocabulary release has arrays {sorted(released)}; the audit does not know which holds "
                      "the noisy counts")


class KdeAudit(_Mechanism):
    name = "kde"
    labels = [0, 1, 2]

    def __init__(self, workdir: Path, insecure: bool) -> None:
        super().__init__(workdir, insecure)
        from privseed.tasks.config import DpKpsConfig
        from privseed.tasks.stages.dpkps import embed_released_vocabulary, feature_specs
        from privseed.tasks.kde import laplace_scale

        # V~ is taken as released (all of the audit vocabulary): the audit isolates the eps_kde of the sketches.
        self.terms = audit_vocabulary_terms()
        self.cfg = DpKpsConfig(**self.config_values(dict(
            method="independent", n_features=32, eps_kde=2.0, length=5, per_class=10, n_workers=1), DpKpsConfig))
        self.embeddings = embed_released_vocabulary.fn(self.terms, self.cfg)
        self.canary_id = self.terms.index(KDE_CANARY_TERM)
        features = feature_specs(self.cfg, self.embeddings.shape[1])[0].draw()
        # phi(canary term): the sketch's own feature map; <noisy sum, phi> / I is the sampler's score of the term.
        self.canary_phi = features.features(self.embeddings[self.canary_id][None, None, :].astype(np.float64))[0]
        self.private = audit_corpus()
        self.canary = _with(self.private, " ".join([KDE_CANARY_TERM] * self.cfg.length), 0)
        # The adversary knows every document of D and the public features, so it knows class 0's exact sum on D and
        # on D' (the canary adds its feature vector); with the public Laplace scale that gives the likelihood ratio.
        exact = {side: self._exact_class0(corpus) for side, corpus in ((False, self.private), (True, self.canary))}
        self.exact_without, self.move = exact[False], exact[True] - exact[False]
        self.laplace_scale = laplace_scale(self.cfg.n_features, self.cfg.eps_kde)

    def _exact_class0(self, corpus: pd.DataFrame) -> np.ndarray:
        return self._exact(corpus)[0, 0]

    def _exact(self, corpus: pd.DataFrame) -> np.ndarray:
        from privseed.tasks.kde import sketch_sums_of_shard
        from privseed.tasks.stages.dpkps import feature_specs

        specs = feature_specs(self.cfg, self.embeddings.shape[1])
        shard = (corpus["text"].tolist(), corpus["label"].tolist())
        return sketch_sums_of_shard(shard, self.labels, tuple(self.terms), self.embeddings, specs, True)

    def trial(self, with_canary: bool) -> dict[str, float]:
        from privseed.tasks.stages.dpkps import privatize_sketches, sample_keyphrase_sequences

        corpus = self.canary if with_canary else self.private
        with self.ledger() as ledger:
            released = privatize_sketches.fn(self._exact(corpus), self.labels, self.terms, self.embeddings,
                                             self.cfg, ledger)
            sequences = sample_keyphrase_sequences.fn(released, self.labels, self.terms, self.embeddings, self.cfg)
        class0 = sequences.loc[sequences["label"] == 0, "keyphrases"]
        noise = released[0, 0] - self.exact_without  # what is left of the release once D's exact sum is known
        return {f"sketch score of '{KDE_CANARY_TERM}' (class 0)":
                float(released[0, 0] @ self.canary_phi) / self.cfg.n_features,
                "class 0 sketch, Laplace likelihood ratio":
                float(np.sum(np.abs(noise) - np.abs(noise - self.move))) / self.laplace_scale,
                f"'{KDE_CANARY_TERM}' in class 0's sequences":
                float(sum(list(k).count(KDE_CANARY_TERM) for k in class0))}


class AugPeAudit(_Mechanism):
    name = "augpe"

    def __init__(self, workdir: Path, insecure: bool) -> None:
        super().__init__(workdir, insecure)
        from privseed.tasks.config import AugPeConfig
        from privseed.tasks.evolution import candidate_documents as _documents, class_index as _per_class_index
        from privseed.tasks.stages.pe import embed_candidates, embed_private
        from privseed.tasks import evolution as ev

        self.cfg = AugPeConfig(**self.config_values(dict(
            epsilon=2.0, delta=1e-5, iterations=1, per_class=2, progress=False), AugPeConfig))
        self.labels = [0, 1, 2]
        self.candidates = pd.DataFrame(_CANDIDATES, columns=["text", "label"])
        self.syn_emb = embed_candidates.fn(self.candidates["text"].tolist(), self.cfg.embedding_model)
        self.syn_class = _per_class_index(self.labels, self.candidates["label"])
        self.documents = _documents(self.cfg, self.candidates)
        private = audit_corpus()
        canary_text = _CANDIDATES[_ISOLATED_CANDIDATE][0]
        embeddings = embed_private.fn([*private["text"], canary_text], self.cfg.embedding_model)
        classes = _per_class_index(self.labels, pd.Series([*private["label"], 0]))
        self.sides = {False: (embeddings[:-1], classes[:-1]), True: (embeddings, classes)}
        # The construction the test relies on: no document of D votes for the isolated candidate; the canary does.
        for with_canary, expected in ((False, 0), (True, 1)):
            votes = ev.class_votes(*self.sides[with_canary], self.syn_emb, np.where(self.documents, self.syn_class, -1))
            if votes[_ISOLATED_CANDIDATE] != expected:
                raise ConfigError(f"audit corpus: the isolated candidate gets {votes[_ISOLATED_CANDIDATE]} votes "
                                  f"{'with' if with_canary else 'without'} the canary, expected {expected}")

    def trial(self, with_canary: bool) -> dict[str, float]:
        from privseed.tasks.stages.pe import augpe_round_histogram, charge_augpe_schedule

        private_emb, private_class = self.sides[with_canary]
        with self.ledger() as ledger:
            schedule = charge_augpe_schedule(ledger, self.cfg)
            noisy = augpe_round_histogram(ledger, self.cfg, schedule, 1, self.candidates, self.syn_emb,
                                          self.syn_class, self.documents, private_emb, private_class)
        return {"noisy count of the canary's candidate": float(noisy[_ISOLATED_CANDIDATE])}


def _exact_class_term_counts(audit: Any, corpus: pd.DataFrame) -> np.ndarray:
    """Stage 1's exact per-class counts of ``corpus`` for the histogram audits (``matcher``, ``labels``,
    ``vocabulary``, ``cfg`` of the audit)."""
    from privseed.tasks.histogram_seeds import class_positions, class_term_counts

    ids = [audit.matcher.match(t) for t in corpus["text"]]
    positions = class_positions(audit.labels, corpus["label"])
    return class_term_counts(ids, positions, len(audit.labels), len(audit.vocabulary), audit.cfg.first_terms)


def _laplace_ratio_of_unit_shift(noisy: np.ndarray, scale: float) -> float:
    """Log-likelihood ratio of released counts whose exact values are 0 on D and 1 on D' (the adversary knows D),
    under Laplace noise of ``scale``."""
    return float(np.sum(np.abs(noisy) - np.abs(noisy - 1.0))) / scale


class MarkovPairsAudit(_Mechanism):
    """histogram-markov's pair stage (tasks/stages/histogram.py), with its term stage before it as in the flow."""

    name = "markov"
    labels = [0, 1, 2]

    def __init__(self, workdir: Path, insecure: bool) -> None:
        super().__init__(workdir, insecure)
        from privseed.tasks.config import DpKpsConfig
        from privseed.tasks.histogram_seeds import pair_mechanism, stage_budgets
        from privseed.tasks.vocabulary import load_vocabulary, phrase_matcher

        path = workdir / "audit-markov-vocabulary.txt"
        path.write_text("\n".join(audit_vocabulary_terms()) + "\n", encoding="utf-8")
        self.vocabulary = load_vocabulary(str(path))
        size = len(self.vocabulary)
        # K and P cover V, so every term is a pair candidate whatever stage 1 released: the canary's pairs are
        # always released (their position in the release depends on stage 1's order and is looked up per trial).
        # Most of the budget goes to the pairs (eps_2 = 0.75 of 1), so the audit measures the pair stage.
        self.cfg = DpKpsConfig(**self.config_values(dict(
            method="histogram-markov", vocab=str(path), vocab_top=None, first_terms=4, hist_top_k=size,
            markov_pair_top=size, markov_pair_terms=3, epsilon=1.0, markov_term_share=0.25, per_class=10,
            length=5, n_workers=1), DpKpsConfig))
        self.matcher = phrase_matcher(self.vocabulary)
        self.private = audit_corpus()
        # A class-0 document of three terms no document uses: its S_2 = 3 candidate terms give it all
        # S_2 (S_2 - 1) / 2 = 3 pairs of its sensitivity, each at exact count 0 on D and 1 on D'.
        self.canary_terms = _UNUSED_TERMS[:3]
        self.canary = _with(self.private, " ".join(self.canary_terms), 0)
        eps_2, delta_2 = stage_budgets(self.cfg.method, self.cfg.histogram_epsilon, self.cfg.delta,
                                       self.cfg.markov_term_share)[1]
        self.scale = pair_mechanism(self.cfg.mechanism, self.cfg.markov_pair_terms, eps_2, delta_2).scale

    def trial(self, with_canary: bool) -> dict[str, float]:
        from privseed.tasks.histogram_seeds import class_pair_counts, class_positions, pair_columns
        from privseed.tasks.stages.histogram import (pair_candidate_ids, privatize_class_histograms,
                                                     privatize_class_pairs)

        corpus = self.canary if with_canary else self.private
        ids = [self.matcher.match(t) for t in corpus["text"]]
        positions = class_positions(self.labels, corpus["label"])
        with self.ledger() as ledger:
            exact = _exact_class_term_counts(self, corpus)
            terms = privatize_class_histograms.fn(exact, self.labels, self.cfg, ledger)
            candidates = pair_candidate_ids(terms, self.cfg)
            counts = class_pair_counts(ids, positions, candidates, self.cfg.markov_pair_terms)
            released = privatize_class_pairs.fn(counts, self.labels, terms, self.cfg, ledger)[0]
        where = {int(t): i for i, t in enumerate(released["pair_ids"])}
        at = [where[self.vocabulary.terms.index(t)] for t in self.canary_terms]
        columns = pair_columns(len(released["pair_ids"]))
        noisy = np.asarray(released["noisy"], dtype=np.float64)[[columns[at[0], at[1]], columns[at[0], at[2]],
                                                                  columns[at[1], at[2]]]]
        # D's exact counts of the three pairs are 0 and D''s are 1 (the adversary knows D): Laplace likelihood ratio
        return {"class 0, the canary's three pair counts, Laplace likelihood ratio":
                _laplace_ratio_of_unit_shift(noisy, self.scale),
                "class 0, the canary's three pair counts, sum": float(noisy.sum())}


class HistogramAudit(_Mechanism):
    """The histogram methods' stage 1 (``--method histogram``; histogram-markov's term stage is the same code at
    a share of the budget): per-class noisy term counts."""

    name = "histogram"
    labels = [0, 1, 2]
    #: configuration a variant of stage 1 changes (its mechanism)
    variant: dict[str, Any] = {}

    def __init__(self, workdir: Path, insecure: bool) -> None:
        super().__init__(workdir, insecure)
        from privseed.tasks.config import DpKpsConfig
        from privseed.tasks.histogram_seeds import build_mechanism, stage_budgets
        from privseed.tasks.vocabulary import load_vocabulary, phrase_matcher

        path = workdir / "audit-histogram-vocabulary.txt"
        path.write_text("\n".join(audit_vocabulary_terms()) + "\n", encoding="utf-8")
        self.vocabulary = load_vocabulary(str(path))
        self.cfg = DpKpsConfig(**self.config_values(dict(
            method="histogram", vocab=str(path), vocab_top=None, first_terms=4, hist_top_k=len(self.vocabulary),
            epsilon=1.0, per_class=10, length=5, n_workers=1, **self.variant), DpKpsConfig))
        self.matcher = phrase_matcher(self.vocabulary)
        self.private = audit_corpus()
        # A class-0 document of S terms no document uses: S counts of class 0 move by 1, the whole L1 sensitivity.
        self.canary_ids = [self.vocabulary.terms.index(t) for t in _UNUSED_TERMS[:self.cfg.first_terms]]
        self.canary = _with(self.private, " ".join(_UNUSED_TERMS[:self.cfg.first_terms]), 0)
        eps_1, delta_1 = stage_budgets(self.cfg.method, self.cfg.histogram_epsilon, self.cfg.delta,
                                       self.cfg.markov_term_share)[0]
        self.scale = build_mechanism(self.cfg.mechanism, self.cfg.first_terms, eps_1, delta_1).scale

    def trial(self, with_canary: bool) -> dict[str, float]:
        from privseed.tasks.stages.histogram import privatize_class_histograms

        corpus = self.canary if with_canary else self.private
        with self.ledger() as ledger:
            released = privatize_class_histograms.fn(_exact_class_term_counts(self, corpus), self.labels, self.cfg,
                                                     ledger)[0]
        noisy = np.asarray(released["noisy"], dtype=np.float64)[self.canary_ids]
        # D's exact counts of the S terms are 0 and D''s are 1 (the adversary knows D): Laplace likelihood ratio
        return {"class 0, the canary's S term counts, Laplace likelihood ratio":
                _laplace_ratio_of_unit_shift(noisy, self.scale),
                "class 0, the canary's S term counts, sum": float(noisy.sum())}


class HistogramThresholdAudit(HistogramAudit):
    """Stage 1 with ``--mechanism laplace-threshold`` (noise only on occurring terms, released above the
    threshold; (epsilon, delta) by OpenDP's map). The canary's S counts exist only on D': the test sees them when
    they pass the threshold (probability within delta) and through their noisy values."""

    name = "histogram-threshold"
    variant = {"mechanism": "laplace-threshold", "delta": 1e-5}


class HistogramUnitL2Audit(_Mechanism):
    """The histogram methods' stage 1 with ``--hist-contribution unit-l2`` (Gaussian, L2 sensitivity 1): each
    document adds 1 / sqrt(n) to each of its n distinct terms."""

    name = "histogram-unit-l2"
    labels = [0, 1, 2]

    def __init__(self, workdir: Path, insecure: bool) -> None:
        super().__init__(workdir, insecure)
        from privseed.tasks.config import DpKpsConfig
        from privseed.tasks.vocabulary import load_vocabulary, phrase_matcher

        path = workdir / "audit-histogram-unit-l2-vocabulary.txt"
        path.write_text("\n".join(audit_vocabulary_terms()) + "\n", encoding="utf-8")
        self.vocabulary = load_vocabulary(str(path))
        self.cfg = DpKpsConfig(**self.config_values(dict(
            method="histogram", vocab=str(path), vocab_top=None, hist_top_k=len(self.vocabulary), epsilon=1.0,
            delta=1e-5, mechanism="gaussian", hist_contribution="unit-l2", per_class=10, length=5, n_workers=1),
            DpKpsConfig))
        self.matcher = phrase_matcher(self.vocabulary)
        self.private = audit_corpus()
        # A class-0 document of four terms no document uses: each gets 1 / 2, a shift of L2 norm 1 (the whole
        # sensitivity) along the all-equal direction, which the sum of the four released counts measures best.
        self.canary_ids = [self.vocabulary.terms.index(t) for t in _UNUSED_TERMS[:4]]
        self.canary = _with(self.private, " ".join(_UNUSED_TERMS[:4]), 0)

    def trial(self, with_canary: bool) -> dict[str, float]:
        from privseed.tasks.histogram_seeds import class_positions, class_unit_l2_weights
        from privseed.tasks.stages.histogram import privatize_class_histograms

        corpus = self.canary if with_canary else self.private
        exact = class_unit_l2_weights([self.matcher.match(t) for t in corpus["text"]],
                                      class_positions(self.labels, corpus["label"]), len(self.labels),
                                      len(self.vocabulary))
        with self.ledger() as ledger:
            released = privatize_class_histograms.fn(exact, self.labels, self.cfg, ledger)[0]
        noisy = np.asarray(released["noisy"], dtype=np.float64)[self.canary_ids]
        # Gaussian noise, exact counts 0 on D and 1/2 each on D': the likelihood ratio is monotone in their sum
        return {"class 0, the canary's 4 term weights, sum (Gaussian likelihood ratio)": float(noisy.sum()),
                "class 0, the canary's 4 term weights, max": float(noisy.max())}


class SecPeAudit(_Mechanism):
    name = "secpe"

    def __init__(self, workdir: Path, insecure: bool) -> None:
        super().__init__(workdir, insecure)
        from privseed.tasks.config import SecPeConfig
        from privseed.tasks.stages.pe import embed_candidates, embed_private
        from privseed.tasks import evolution as ev

        secrets = workdir / "audit-secrets.txt"
        secrets.write_text(_NOBODY_HOLDS_THIS_SECRET + "\n", encoding="utf-8")
        self.cfg = SecPeConfig(**self.config_values(dict(
            public="audit://public-texts", secrets=str(secrets), noise_multiplier=3.0, iterations=1, clusters=2,
            delta=1e-5, per_class=2, progress=False), SecPeConfig))
        public_emb = embed_candidates.fn(_PUBLIC_TEXTS, self.cfg.embedding_model)
        self.clusters = ev.public_kmeans(public_emb, self.cfg.clusters, self.cfg.seed)
        private = audit_corpus()
        self.texts = {False: private["text"].tolist(), True: [*private["text"], _SECPE_CANARY]}
        self.classes = {False: private["label"].to_numpy(), True: np.append(private["label"].to_numpy(), 0)}
        embeddings = embed_private.fn(self.texts[True], self.cfg.embedding_model)
        self.embeddings = {False: embeddings[:-1], True: embeddings}
        self._adversary_view(embeddings)

    def _adversary_view(self, embeddings: np.ndarray) -> None:
        """What the adversary, who knows every document of D, expects: the canary's cluster k, the exact class-0
        centre of k on D, and the direction and length of the canary's move of it, in units of its noise."""
        from privseed.tasks import evolution as ev

        radius, sizes, centres = self.cfg.radius, self.clusters.sizes, self.clusters.centres
        clipped = ev.clip_rows(embeddings, radius)
        nearest = ev.nearest_synthetic(clipped, centres)
        k = int(nearest[-1])
        members = (self.classes[True] == 0) & (nearest == k)
        exact = {}
        for with_canary in (False, True):
            rows = members.copy()
            rows[-1] = with_canary
            exact[with_canary] = (centres[k] * sizes[k] + clipped[rows].sum(axis=0)) / (sizes[k] + rows.sum())
        move = exact[True] - exact[False]
        self.cluster = k
        self.scale = float(ev.centre_noise_scales(self.clusters, radius)[k])  # the centre's noise unit c_k
        self.centre_without = exact[False]
        self.direction = move / max(float(np.linalg.norm(move)), 1e-300)
        self.move_in_noise_units = float(np.linalg.norm(move)) / self.scale

    def trial(self, with_canary: bool) -> dict[str, float]:
        from privseed.tasks.evolution import secpe_noise
        from privseed.tasks.stages.pe import charge_secpe_schedule, detect_secrets, secpe_round_release
        from privseed.tasks import evolution as ev

        classes = self.classes[with_canary]
        scales = ev.centre_noise_scales(self.clusters, self.cfg.radius)
        with self.ledger() as ledger:
            incidence, _ = detect_secrets.fn(self.cfg, self.texts[with_canary])
            secret_noise = secpe_noise(self.cfg, incidence)
            _, mechanism = charge_secpe_schedule(ledger, self.cfg, secret_noise)
            # Only the canary's class: the flow draws every class with this same function, but the other classes'
            # releases are computed on other documents (parallel composition) and would only cost sampling time.
            members = classes == 0
            released = secpe_round_release(ledger, self.cfg, mechanism, 1, 0, 0, self.clusters, scales,
                                           self.embeddings[with_canary][members], secret_noise.rho[members])
        sigma = secret_noise.sigma
        size = float(released["sizes"][self.cluster]) / sigma
        centre = float((released["centres"][self.cluster] - self.centre_without) @ self.direction)
        centre /= self.scale * sigma
        # Both are Gaussian in noise units with means shifted by 1 and by the centre's move: the likelihood ratio
        # of the pair is their sum weighted by the shifts.
        return {"noisy size of the canary's cluster": size, "centre moved towards the canary": centre,
                "size + centre (likelihood ratio)": size + self.move_in_noise_units * centre}


AUDITS: dict[str, type[_Mechanism]] = {"vocabulary": VocabularyAudit, "kde": KdeAudit, "histogram": HistogramAudit,
                                       "markov": MarkovPairsAudit, "augpe": AugPeAudit, "secpe": SecPeAudit,
                                       "histogram-unit-l2": HistogramUnitL2Audit,
                                       "histogram-threshold": HistogramThresholdAudit}


# ---------------------------------------------------------------------------------------------------------
# Running the audit
# ---------------------------------------------------------------------------------------------------------
@contextmanager
def _trial_environment(insecure: bool = False) -> Iterator[None]:
    """Quiet, single-threaded trials. Stage and ledger INFO lines, once per trial, would bury the table (warnings
    still show, except the ledger's NOT DIFFERENTIALLY PRIVATE one per draw when the audit was asked to run the
    insecure mode: its table says so once); a trial's matrices are tiny, and BLAS or torch threads fighting over
    two shared cores made a trial several times slower than one thread does."""
    import torch
    from threadpoolctl import threadpool_limits

    names = ("privseed.flows", "privseed.tasks", "prefect", "privseed.tasks.ledger")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    threads = torch.get_num_threads()
    for name, lg in zip(names, loggers):
        floor = logging.ERROR if insecure and name == "privseed.tasks.ledger" else logging.WARNING
        lg.setLevel(max(lg.getEffectiveLevel(), floor))
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        torch.set_num_threads(threads)
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def run_audit(mechanisms: Sequence[str], profile: Profile, *, insecure: bool = False, workdir: Path | None = None,
              progress: bool = True, alpha: float = stats.DEFAULT_ALPHA) -> list[stats.AuditRow]:
    """Audit each mechanism: set up its public fixture, calibrate a test, evaluate it, bound epsilon."""
    from tqdm.auto import tqdm

    unknown = [m for m in mechanisms if m not in AUDITS]
    if unknown:
        raise ConfigError(f"unknown mechanism(s) {', '.join(unknown)}; choose from {', '.join(MECHANISMS)}")
    rows = []
    own = workdir is None
    # Trial ledgers are thrown away after each trial: on tmpfs the ledger's fsync per write costs nothing, and on
    # a busy disk it was most of a trial's time.
    shm = Path("/dev/shm")
    scratch = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="privseed-audit-", dir=scratch))
    root.mkdir(parents=True, exist_ok=True)
    try:
        with _trial_environment(insecure):
            for name in mechanisms:
                mechanism = AUDITS[name](root, insecure)
                total = 2 * (profile.calibration + profile.evaluation)
                with tqdm(total=total, desc=f"audit {name}", unit="trial", disable=not progress, leave=False,
                          file=sys.stderr) as bar:
                    row = _audit_one(mechanism, profile, alpha, bar.update)
                rows.append(row)
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
    return rows


def _audit_one(mechanism: _Mechanism, profile: Profile, alpha: float,
               tick: Callable[[int], None]) -> stats.AuditRow:
    # One trial first: it fixes the claim (what the ledger charges) and its delta, which the test needs.
    mechanism.trial(False)
    assert mechanism.claim is not None
    epsilon, delta = mechanism.claim
    return stats.audit(mechanism.name, mechanism.trial, claimed_epsilon=epsilon, delta=delta,
                       calibration_trials=profile.calibration, evaluation_trials=profile.evaluation,
                       noise=mechanism.noise, alpha=alpha, on_trial=lambda: tick(1))


def plot_audit(rows: Sequence[stats.AuditRow], path: Path, title: str) -> None:
    """Claimed epsilon next to the empirical lower bound, per mechanism (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.patches import Patch

    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(rows), 3.6))
    ax.bar(x - 0.2, [r.claimed_epsilon for r in rows], 0.4, color="#4c72b0")
    ax.bar(x + 0.2, [r.epsilon_lower_bound for r in rows], 0.4,
           color=["#c44e52" if r.exceeds_claim else "#55a868" for r in rows])
    for i, r in enumerate(rows):
        ax.annotate(r.verdict, (x[i] + 0.2, r.epsilon_lower_bound), ha="center", va="bottom", fontsize=8)
    top = max([r.claimed_epsilon for r in rows] + [r.epsilon_lower_bound for r in rows] + [1.0])
    ax.set_ylim(0, 1.35 * top)
    ax.set_xticks(x, [r.mechanism for r in rows])
    ax.set_ylabel("epsilon")
    ax.set_title(title, fontsize=10)
    level = f"{100 * (1 - rows[0].alpha):g}%" if rows else "95%"
    ax.legend(handles=[Patch(color="#4c72b0", label="claimed epsilon (ledger)"),
                       Patch(color="#55a868", label=f"{level} lower bound: consistent"),
                       Patch(color="#c44e52", label=f"{level} lower bound: VIOLATED")],
              fontsize=8, loc="upper left", ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(rows: Sequence[stats.AuditRow], out: Path, meta: Mapping[str, Any]) -> dict[str, str]:
    """audit.json (the rows, the claims they refute and ``meta``) and audit.png under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    document = {**meta, "rows": [r.as_dict() for r in rows],
                "violated": [r.mechanism for r in rows if r.exceeds_claim]}
    storage.write_bytes(str(out / "audit.json"), (jsonable.dumps(document, indent=2, sort_keys=True) + "\n").encode())
    title = "privseed audit" + (" (--insecure-reproducible-noise)" if meta.get("insecure_reproducible_noise") else "")
    plot_audit(rows, out / "audit.png", title)
    return {"json": str(out / "audit.json"), "plot": str(out / "audit.png")}
