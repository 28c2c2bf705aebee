"""The trials of `privseed audit`: an empirical privacy audit of every mechanism, run through the flows' own
stage functions (tasks/audit/statistics.py holds the statistics; flows/audit.py the command line).

For each mechanism the audit runs the stage exactly as the flow runs it many times on a small public corpus D and
on D' = D plus one canary document built to move the release as much as one document can. Both are Parquet
corpora of three work units; a trial runs the flow's own passes over them (pass 1, pass 2, the PE vote and cluster
passes, the same unit functions and reduction tree as on a cluster), hands its corpus's exact values to the stage
that privatizes them (a fresh ledger in a fresh temporary state folder per trial, the same public configuration and
the same ``--seed`` every trial), and reports what the stage RELEASED (the values the ledger stores and the
stage's output, never a private intermediate):

* statistics for a threshold test that tries to tell D' from D; its true and false positive rates become a
  Clopper-Pearson lower bound on epsilon;
* every released block with its noise (released minus the exact value of the trial's corpus, which the adversary
  who knows D knows) and the canary's move of it (the passes on D' minus the passes on D): the calibration check,
  whose bound is the canary's analytic privacy loss at upper confidence limits of the measured noise scales
  (with the moves of the audit's other canaries, below: the largest loss);
* for the thresholded histogram, its delta events: how many of D's single-document items had a term released,
  the delta check's binomial counts.

tasks/audit/statistics.py holds all three. The claimed (epsilon, delta) is what the trial's ledger charged. A lower
bound
above the claim refutes the claim: the command then exits with status 1. The calibration check catches half the
noise and a sensitivity counted half in every mechanism at 10 + 10 trials per corpus, and the other canaries and
the delta check the pass-1 faults of other shapes and the unfixed threshold map (tests/test_audit.py, with the
faults of tasks/audit/faults.py; the power table is in docs/privacy.md).

    vocabulary  DP-KPS's vocabulary histogram (privatize_vocabulary_stage). Canary: a document whose first S terms
                are one term of V that no other document uses, so it moves that term's count by S, the whole L1
                sensitivity, on one coordinate (S distinct terms would move S coordinates by 1 each, and a test on
                one of them bounds only eps / S: a noise scale 2x too small would pass). N = |V|, so every
                term's noisy count is released (V~ membership and order are functions of those counts and cannot
                make a stronger test).
    kde         DP-KPS's per-class DP-KDE (privatize_sketches, then sample_keyphrase_sequences). Canary: a class-0
                document whose phrases are one term no document uses, the one whose public feature vector is the
                longest in L1 (it moves the sketch by 0.67 of the sensitivity sqrt(2) I). Tests: the released
                sketch's score of the canary term, the Laplace likelihood ratio of the released sketch (the
                adversary knows D's exact sum), and how often the term appears in class 0's sampled sequences.
    markov      histogram-markov's pair stage (privatize_class_histograms, then privatize_class_pairs; the term stage
                takes a quarter of the budget 1). Canary: a class-0 document of three terms no document uses, so its
                S_2 = 3 candidate terms move three pair counts of class 0 by 1 each: its whole L1 sensitivity
                S_2 (S_2 - 1) / 2. Tests: the Laplace likelihood ratio of those three released counts (the adversary
                knows D's exact counts, 0) and their sum. K and P cover V, so the pairs are released every trial.
    augpe       One Aug-PE round (exact_class_votes, charge_augpe_schedule, draw_augpe_round, T = 1) over 24
                public candidates. Canary: a private document identical to one candidate that no other document
                votes for. Test: its noisy count.
    secpe       One SecPE round (detect_unit_secrets, secpe_noise, charge_secpe_schedule, exact_cluster_sums,
                draw_secpe_round, T = 1) with a public sigma (--noise-multiplier), auditing the DP epsilon SecPE
                reports "if rho and sigma are fixed". The canary holds no secret, so rho = 1 (it is always
                sampled). K = 2 public clusters, and only the canary's class is drawn per trial (the other
                classes' releases are independent of it). Tests: the noisy size of its cluster, the centre's move
                towards it, and their likelihood-ratio combination.
    histogram   The histogram methods' stage 1 (privatize_class_histograms; Laplace, epsilon 1, S = 4). Canary: a
                class-0 document of S terms no document uses: S counts move by 1, the whole L1 sensitivity.
                Tests: the Laplace likelihood ratio of those S released counts and their sum.
    histogram-unit-l2  The same stage with --hist-contribution unit-l2 (Gaussian, L2 sensitivity 1, delta 1e-5).
                Canary: the same document, 1/sqrt(S) on each term (L2 norm 1, the whole sensitivity). Tests: as
                for histogram, through the same passes.
    histogram-rank-l2  The same stage with --hist-contribution rank-l2 (Gaussian, L2 sensitivity 1, delta 1e-5).
                Canary: the same document, its i-th term i^-0.5 scaled to L2 norm 1 (the whole sensitivity).
    histogram-slow-rank-l2  The same stage with --hist-contribution slow-rank-l2 (the corpus profile's kind for short
                documents): the canary's i-th term i^-0.25, scaled to L2 norm 1 (the whole sensitivity).
    histogram-rank-rare-l2  The same stage with --hist-contribution rank-rare-l2: the canary's rank-l2 weights
                times the public common-word factors, scaled to L2 norm 1 (the whole sensitivity).
    histogram-threshold  The same stage with --mechanism laplace-threshold, epsilon 4 and delta 1e-2 (scale 1,
                threshold 7: a configuration where the delta event is frequent enough to be measured): the canary's
                terms exist only on D', so they are released only when their noisy counts pass the threshold. The
                calibration check takes only the counts far above the threshold (cut with probability at most
                1e-12) and the moves of second neighbours on them; the delta check counts how often a term that
                one document of D holds is released (HistogramThresholdAudit).

Other canaries. One canary shows a sensitivity bug only in its own shape, so the audits of pass 1 (vocabulary and
the histogram stages) also compute, once at setup through the same pass, the moves of other neighbours D + c for the
calibration check (``other_canaries``): the canary in class 1 and in class 2 (a pass that counts a class twice), its
terms each written S times (a pass that counts a repeated term per occurrence), and one document of every term of V
(the longest a contribution allows; a pass that takes a long document as several). A correct mechanism moves each by
at most its sensitivity; the check bounds epsilon by the largest of their losses.

Small public configs keep a trial cheap (a 57-term vocabulary file, 36 documents, I = 32, epsilon 1-2 per
mechanism; histogram-threshold's epsilon 4, its corpora hold 780 short documents more, as one more work unit). With
noise drawn from --seed (main before issue 13) or from ``--insecure-reproducible-noise``, every trial on D is
identical, and so is every trial on D': the test separates them perfectly and the bound reaches about 5 with 500
trials per side, above every claim (except histogram-threshold's, whose canary's counts stay under the threshold on
both corpora, so both release the same zeros). The trials call the stage functions directly (``.fn``), not through
a Prefect flow run per trial: a flow run costs more than the trial itself.
"""
from __future__ import annotations

import abc
import itertools
import logging
import os
import shutil
import string
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel

from privseed.tasks.audit import statistics as stats
from privseed.tasks import jsonable, storage
from privseed.tasks.config.commands import AUDIT_MECHANISMS, AUDIT_PROFILES
from privseed.tasks.errors import ConfigError
from privseed.tasks.dp.ledger import PrivacyLedger
from privseed.tasks.data.units import CorpusPlan

log = logging.getLogger(__name__)

MECHANISMS = AUDIT_MECHANISMS


@dataclass(frozen=True)
class Profile:
    calibration: int  # trials per corpus that choose the test
    evaluation: int   # trials per corpus that measure it


# quick: 40 + 100 trials (the suite's slow CLI test; the suite's own audit is --trials 10, 10 + 10). full: the
# figures of experiments/results/privacy-audit.md; with 500 evaluation trials per side a perfect threshold test
# bounds epsilon by about 4.9, above every claim audited here, and every noise group of the calibration check
# reaches its 20,000 values.
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
#: A term no document uses, far (in MiniLM space) from class 0's football terms; like every unused term, a candidate
#: for the KDE canary's one phrase (KdeAudit takes the one whose features move the sketch most).
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


def other_canaries(terms: Sequence[str], first_terms: int, vocabulary: Sequence[str],
                   repeated: bool = True) -> dict[str, tuple[str, Any]]:
    """The calibration check's other canaries of an audit whose canary is the class-0 document ``terms``: the same
    document in class 1 and in class 2; each of its terms written S times in a row (``repeated``; one document
    still, whose distinct terms move as much as the canary's and no more); and one class-0 document of every term
    of ``vocabulary`` in order (the longest document a contribution allows: a first-S contribution reads its first
    S, a whole-document one all of them). Each is (text, label)."""
    canary = " ".join(terms)
    out: dict[str, tuple[str, Any]] = {"class 1": (canary, 1), "class 2": (canary, 2)}
    if repeated:
        out["repeated terms"] = (" ".join(t for t in terms for _ in range(first_terms)), 0)
    out["long document"] = (" ".join(vocabulary), 0)
    return out


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
    """One audited mechanism: its public setup (done once) and its trial (run many times).

    D and D' are written as Parquet corpora of several work units (``_write_corpus``); a trial runs the flow's own
    passes over those units (``.fn`` of the flow's stage tasks, in-process: ``map_reduce_units`` without a cluster
    runs the same unit functions and the same reduction tree), hands its corpus's exact values to the stage that
    privatizes them, and reports the threshold statistics of what was released together with every released block
    for the calibration check: its noise (released - exact of this corpus) and the canary's move (the passes on D'
    minus the passes on D: pass 1 once per corpus, :meth:`exact_counts`; pass 2 every trial, over what the trial
    released). ``cfg``: the public configuration of the command whose stages it runs, set by each audit."""

    name: str = ""
    labels: list[Any] = [0, 1, 2]
    cfg: Any

    def __init__(self, workdir: Path, insecure: bool) -> None:
        self.workdir = workdir
        self.insecure = insecure
        self.claim: tuple[float, float] | None = None
        self.noise = "unknown"
        self._scanned: dict[int, tuple[CorpusPlan, np.ndarray]] = {}  # plan id -> (plan, counts): exact_counts

    def close(self) -> None:  # noqa: B027  (most audits keep nothing)
        """Forget what the trials kept in memory (the PE audits' embeddings)."""

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

    def write_corpora(self, private: pd.DataFrame, canary: pd.DataFrame,
                      bulk: pd.DataFrame | None = None) -> dict[bool, CorpusPlan]:
        """D (False) and D' (True) as Parquet corpora, planned into work units as a run plans its corpus; ``bulk``:
        documents both hold besides, as one more work unit (``_write_corpus``)."""
        return {side: _write_corpus(frame, self.workdir / f"{self.name}-{'with' if side else 'without'}-canary",
                                    bulk=bulk)
                for side, frame in ((False, private), (True, canary))}

    @staticmethod
    def draws(ledger: _RecordingLedger, exact: Mapping[str, tuple[np.ndarray, np.ndarray]],
              with_canary: bool, others: Mapping[str, Mapping[str, np.ndarray]] | None = None
              ) -> dict[str, stats.NoiseDraw]:
        """Each released block ``name`` with its exact values on D and on D' (``exact[name]``), as the calibration
        check takes it: the mechanism family and scale the ledger recorded, the noise and the canary's move; and
        ``others[name][c]``, the block's exact values on D + c for the audit's other canaries c."""
        entries = {e["name"]: e for e in ledger.entries()}
        out = {}
        for name, (without, with_) in exact.items():
            released = np.asarray(ledger.released[name]["noisy"], dtype=np.float64)
            own = np.asarray(with_ if with_canary else without, dtype=np.float64)
            base = np.asarray(without, dtype=np.float64)
            out[name] = stats.NoiseDraw(family=str(entries[name]["mechanism"]), residual=released - own,
                                        move=np.asarray(with_, dtype=np.float64) - base,
                                        claimed_scale=float(entries[name]["scale"]),
                                        other_moves={c: np.asarray(v, dtype=np.float64) - base
                                                     for c, v in (others or {}).get(name, {}).items()})
        return out

    def other_counts(self, private: pd.DataFrame, canaries: Mapping[str, tuple[str, Any]],
                     bulk: pd.DataFrame | None = None) -> dict[str, np.ndarray]:
        """Pass 1's exact counts of D + c for each other canary ``canaries[c] = (text, label)``, through the same
        pass as the trials (once: the pass is deterministic, and a fault injected for the audit is in place from
        its setup on)."""
        out = {}
        for n, (canary, (text, label)) in enumerate(canaries.items()):
            folder = self.workdir / f"{self.name}-other-canary-{n}"
            out[canary] = self.exact_counts(_write_corpus(_with(private, text, label), folder, bulk=bulk))
        return out

    def exact_counts(self, plan: CorpusPlan) -> np.ndarray:
        """Pass 1's exact counts of ``plan`` under this audit's config, scanned once per corpus: the pass is
        deterministic, and a fault injected for the audit is in place from its setup on, so every trial would scan
        the same counts again. A trial's own work is then its noise (a copy: a stage may write into its input)."""
        from privseed.tasks.stages.corpus import scan_private_corpus
        from privseed.tasks.stages.dpkps import term_counting

        key = id(plan)
        if key not in self._scanned:  # pass 1 of the flows, with the run's term counting
            counts = scan_private_corpus.fn(plan, self.labels, self.cfg, term_counting(self.cfg)).term_counts
            self._scanned[key] = (plan, counts)
        return self._scanned[key][1].copy()

    def private_units(self, plan: CorpusPlan) -> Any:
        """The flows' ``PrivateUnits`` of one audit corpus, under a random run name (the workers' embedding
        cache)."""
        import uuid

        from privseed.tasks.pe.pe_units import PrivateUnits

        return PrivateUnits(plan.units, self.cfg.text_column, self.cfg.label_column,
                            dict(self.cfg.storage_options or {}), self.cfg.embedding_model,
                            tuple(str(label) for label in self.labels), uuid.uuid4().hex)

    @abc.abstractmethod
    def trial(self, with_canary: bool) -> stats.TrialOutcome:
        """Run the stage once on D (or D') and return what it released, as statistics and as noise draws."""


def _write_corpus(frame: pd.DataFrame, folder: Path, rows_per_group: int = 8,
                  bulk: pd.DataFrame | None = None) -> CorpusPlan:
    """``frame`` as one Parquet shard of row groups of ``rows_per_group`` rows, planned into units of two row
    groups: the audit corpus of 36 documents is then three units, combined in the passes' reduction tree.
    ``bulk`` (many short documents) is a second shard of one row group, so one more unit: in units of 16 rows its
    pass would cost a unit's overhead per 16 documents, every trial."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from privseed.tasks.data.units import plan_corpus

    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(frame.reset_index(drop=True), preserve_index=False),
                   folder / "part-0.parquet", row_group_size=rows_per_group)
    if bulk is not None:
        pq.write_table(pa.Table.from_pandas(bulk.reset_index(drop=True), preserve_index=False),
                       folder / "part-1.parquet", row_group_size=max(1, len(bulk)))
    return plan_corpus(str(folder), unit_rows=2 * rows_per_group)


class VocabularyAudit(_Mechanism):
    name = "vocabulary"

    def __init__(self, workdir: Path, insecure: bool) -> None:
        super().__init__(workdir, insecure)
        from privseed.tasks.config.commands import DpKpsConfig
        from privseed.tasks.seeds.vocabulary import load_vocabulary

        path = workdir / "audit-vocabulary.txt"
        path.write_text("\n".join(audit_vocabulary_terms()) + "\n", encoding="utf-8")
        vocabulary = load_vocabulary(str(path))
        self.size = len(vocabulary)
        self.canary_id = vocabulary.terms.index(VOCABULARY_CANARY_TERM)
        self.cfg = DpKpsConfig(**self.config_values(dict(  # the paper's vocabulary release (DP-KPS's samplers)
            method="independent", vocab=str(path), vocab_top=None, first_terms=4, vocab_size=self.size, eps_voc=1.0,
            n_workers=1), DpKpsConfig))
        private = audit_corpus()
        canary = [VOCABULARY_CANARY_TERM] * self.cfg.first_terms
        self.plans = self.write_corpora(private, _with(private, " ".join(canary), 0))
        # the vocabulary counts a repeated term per occurrence by design (its canary is one term written S times)
        self.others = self.other_counts(private, other_canaries(canary, self.cfg.first_terms, vocabulary.terms,
                                                                repeated=False))

    def trial(self, with_canary: bool) -> stats.TrialOutcome:
        from privseed.tasks.stages.dpkps import privatize_vocabulary_stage

        counts = {side: self.exact_counts(plan) for side, plan in self.plans.items()}
        with self.ledger() as ledger:
            privatize_vocabulary_stage.fn(counts[with_canary], self.cfg, ledger)
            noisy = released_counts(ledger.released["vocabulary"], self.size)
            draws = self.draws(ledger, {"vocabulary": (counts[False], counts[True])}, with_canary,
                               {"vocabulary": self.others})
        return stats.TrialOutcome({f"noisy count of '{VOCABULARY_CANARY_TERM}'": float(noisy[self.canary_id])},
                                  draws)


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

    def __init__(self, workdir: Path, insecure: bool) -> None:
        super().__init__(workdir, insecure)
        from privseed.tasks.config.commands import DpKpsConfig
        from privseed.tasks.seeds.kde import laplace_scale
        from privseed.tasks.stages.dpkps import embed_released_vocabulary, feature_specs

        # V~ is taken as released (all of the audit vocabulary): the audit isolates the eps_kde of the sketches.
        self.terms = audit_vocabulary_terms()
        self.cfg = DpKpsConfig(**self.config_values(dict(
            method="independent", n_features=32, eps_kde=2.0, length=5, per_class=10, n_workers=1), DpKpsConfig))
        self.embeddings = embed_released_vocabulary.fn(self.terms, self.cfg)
        features = feature_specs(self.cfg, self.embeddings.shape[1])[0].draw()
        phi = features.features(self.embeddings[:, None, :].astype(np.float64))
        # The canary document is one term repeated: its sketch contribution is phi(term), whose L1 norm is its
        # move (at most the sensitivity sqrt(2) I). Of the terms no document of D uses, the one that moves the
        # sketch most (public: the features and the embeddings are).
        unused = [VOCABULARY_CANARY_TERM, KDE_CANARY_TERM, *_UNUSED_TERMS]
        self.canary_term = max(unused, key=lambda t: float(np.abs(phi[self.terms.index(t)]).sum()))
        self.canary_phi = phi[self.terms.index(self.canary_term)].ravel()
        private = audit_corpus()
        canary = " ".join([self.canary_term] * int(self.cfg.length))
        self.plans = self.write_corpora(private, _with(private, canary, 0))
        # The adversary knows every document of D and the public features, so it knows class 0's exact sum on D and
        # on D' (the canary adds its feature vector); with the public Laplace scale that gives the likelihood ratio.
        exact = {side: self._exact(side) for side in (False, True)}
        self.exact_without, self.move = exact[False][0, 0], exact[True][0, 0] - exact[False][0, 0]
        self.laplace_scale = laplace_scale(self.cfg.n_features, self.cfg.eps_kde)

    def _exact(self, with_canary: bool) -> np.ndarray:
        """Pass 2 of DP-KPS (``exact_sketch_sums``) over the corpus's units: (classes, sketches, I)."""
        from privseed.tasks.stages.dpkps import exact_sketch_sums

        return exact_sketch_sums.fn(self.plans[with_canary], self.labels, self.terms, self.embeddings, self.cfg)

    def trial(self, with_canary: bool) -> stats.TrialOutcome:
        from privseed.tasks.stages.dpkps import privatize_sketches, sample_keyphrase_sequences

        exact = {side: self._exact(side) for side in (False, True)}
        with self.ledger() as ledger:
            released = privatize_sketches.fn(exact[with_canary], self.labels, self.terms, self.embeddings,
                                             self.cfg, ledger)
            sequences = sample_keyphrase_sequences.fn(released, self.labels, self.terms, self.embeddings, self.cfg)
            draws = self.draws(ledger, {f"kde-class{c}-sketch{k}": (exact[False][c, k], exact[True][c, k])
                                        for c in range(len(self.labels)) for k in range(exact[False].shape[1])},
                               with_canary)
        class0 = sequences.loc[sequences["label"] == 0, "keyphrases"]
        noise = released[0, 0] - self.exact_without  # what is left of the release once D's exact sum is known
        return stats.TrialOutcome({
            f"sketch score of '{self.canary_term}' (class 0)":
            float(released[0, 0] @ self.canary_phi) / self.cfg.n_features,
            "class 0 sketch, Laplace likelihood ratio":
            float(np.sum(np.abs(noise) - np.abs(noise - self.move))) / self.laplace_scale,
            f"'{self.canary_term}' in class 0's sequences":
            float(sum(list(k).count(self.canary_term) for k in class0))}, draws)


class _PeAudit(_Mechanism):
    """The PE audits embed each corpus once per unit, in the process's cache, as a run's workers do."""

    units: dict[bool, Any]

    def close(self) -> None:
        from privseed.tasks.pe.pe_units import forget_run

        for units in getattr(self, "units", {}).values():
            forget_run(units.run)


class AugPeAudit(_PeAudit):
    name = "augpe"

    def __init__(self, workdir: Path, insecure: bool) -> None:
        super().__init__(workdir, insecure)
        from privseed.tasks.pe import evolution as ev
        from privseed.tasks.config.commands import AugPeConfig
        from privseed.tasks.pe.evolution import candidate_documents as _documents, class_index as _per_class_index
        from privseed.tasks.stages.pe import embed_candidates

        self.cfg = AugPeConfig(**self.config_values(dict(
            epsilon=2.0, delta=1e-5, iterations=1, per_class=2, progress=False), AugPeConfig))
        # Every candidate's noisy count is a noise value for the calibration check: the public texts join the pool
        # (they take no vote from the canary, whose text is its own candidate's).
        pool = _CANDIDATES + [(text, i * 3 // len(_PUBLIC_TEXTS)) for i, text in enumerate(_PUBLIC_TEXTS)]
        self.candidates = pd.DataFrame(pool, columns=["text", "label"])
        self.syn_emb = embed_candidates.fn(self.candidates["text"].tolist(), self.cfg.embedding_model)
        self.syn_class = _per_class_index(self.labels, self.candidates["label"])
        self.voting = ev.voting_classes(self.syn_class, _documents(self.cfg, self.cfg.min_words, self.candidates))
        private = audit_corpus()
        plans = self.write_corpora(private, _with(private, _CANDIDATES[_ISOLATED_CANDIDATE][0], 0))
        self.units = {side: self.private_units(plan) for side, plan in plans.items()}
        # The construction the test relies on: no document of D votes for the isolated candidate; the canary does.
        for with_canary, expected in ((False, 0), (True, 1)):
            votes = self._votes(with_canary)
            if votes[_ISOLATED_CANDIDATE] != expected:
                raise ConfigError(f"audit corpus: the isolated candidate gets {votes[_ISOLATED_CANDIDATE]} votes "
                                  f"{'with' if with_canary else 'without'} the canary, expected {expected}")

    def _votes(self, with_canary: bool) -> np.ndarray:
        """The flow's vote pass over the corpus's units (``exact_class_votes``)."""
        from privseed.tasks.stages.pe import exact_class_votes

        return np.asarray(exact_class_votes.fn(self.units[with_canary], self.syn_emb, self.voting), dtype=np.float64)

    def trial(self, with_canary: bool) -> stats.TrialOutcome:
        from privseed.tasks.stages.pe import charge_augpe_schedule, draw_augpe_round

        votes = {side: self._votes(side) for side in (False, True)}
        with self.ledger() as ledger:
            schedule = charge_augpe_schedule(ledger, self.cfg)
            noisy = draw_augpe_round(ledger, self.cfg, schedule, 1, self.candidates, lambda: votes[with_canary])
            draws = self.draws(ledger, {"augpe.round-001.histogram": (votes[False], votes[True])}, with_canary)
        return stats.TrialOutcome({"noisy count of the canary's candidate": float(noisy[_ISOLATED_CANDIDATE])},
                                  draws)


def _laplace_ratio_of_unit_shift(noisy: np.ndarray, scale: float) -> float:
    """Log-likelihood ratio of released counts whose exact values are 0 on D and 1 on D' (the adversary knows D),
    under Laplace noise of ``scale``."""
    return float(np.sum(np.abs(noisy) - np.abs(noisy - 1.0))) / scale


class MarkovPairsAudit(_Mechanism):
    """histogram-markov's pair stage (tasks/stages/histogram.py), with its term stage before it as in the flow."""

    name = "markov"

    def __init__(self, workdir: Path, insecure: bool) -> None:
        super().__init__(workdir, insecure)
        from privseed.tasks.config.commands import DpKpsConfig
        from privseed.tasks.seeds.histogram_seeds import pair_mechanism, stage_budgets
        from privseed.tasks.seeds.vocabulary import load_vocabulary

        path = workdir / "audit-markov-vocabulary.txt"
        path.write_text("\n".join(audit_vocabulary_terms()) + "\n", encoding="utf-8")
        self.vocabulary = load_vocabulary(str(path))
        size = len(self.vocabulary)
        # K and P cover V, so every term is a pair candidate whatever stage 1 released: the canary's pairs are
        # always released (their position in the release depends on stage 1's order and is looked up per trial).
        # Most of the budget goes to the pairs (eps_2 = 0.75 of 1), so the audit measures the pair stage.
        self.cfg = DpKpsConfig(**self.config_values(dict(
            method="histogram-markov", mechanism="laplace", vocab=str(path), vocab_top=None, first_terms=4,
            hist_top_k=size,
            markov_pair_top=size, markov_pair_terms=3, epsilon=1.0, markov_term_share=0.25, per_class=10,
            length=5, n_workers=1), DpKpsConfig))
        private = audit_corpus()
        # A class-0 document of three terms no document uses: its S_2 = 3 candidate terms give it all
        # S_2 (S_2 - 1) / 2 = 3 pairs of its sensitivity, each at exact count 0 on D and 1 on D'.
        self.canary_terms = _UNUSED_TERMS[:3]
        self.plans = self.write_corpora(private, _with(private, " ".join(self.canary_terms), 0))
        eps_2, delta_2 = stage_budgets(self.cfg.method, self.cfg.histogram_epsilon, self.cfg.delta,
                                       self.cfg.markov_term_share)[1]
        self.scale = pair_mechanism(self.cfg.mechanism, self.cfg.markov_pair_terms, eps_2, delta_2).scale

    def trial(self, with_canary: bool) -> stats.TrialOutcome:
        from privseed.tasks.seeds.histogram_seeds import pair_columns
        from privseed.tasks.stages.histogram import exact_pair_counts, privatize_class_histograms, privatize_class_pairs

        counts = {side: self.exact_counts(plan) for side, plan in self.plans.items()}
        with self.ledger() as ledger:
            terms = privatize_class_histograms.fn(counts[with_canary], self.labels, self.cfg, ledger)
            # Pass 2 on both corpora, over the candidates stage 1 released in this trial (public from here on).
            pairs = {side: exact_pair_counts.fn(plan, self.labels, terms, self.cfg)
                     for side, plan in self.plans.items()}
            releases = privatize_class_pairs.fn(pairs[with_canary], self.labels, terms, self.cfg, ledger)
            exact = {f"histogram-class{c}": (counts[False][c], counts[True][c]) for c in range(len(self.labels))}
            for c, release in enumerate(releases):
                n = len(release["pair_ids"])
                exact[f"markov-class{c}"] = (pairs[False][c, :n * (n - 1) // 2], pairs[True][c, :n * (n - 1) // 2])
            draws = self.draws(ledger, exact, with_canary)
        released = releases[0]
        where = {int(t): i for i, t in enumerate(released["pair_ids"])}
        at = [where[self.vocabulary.terms.index(t)] for t in self.canary_terms]
        columns = pair_columns(len(released["pair_ids"]))
        noisy = np.asarray(released["noisy"], dtype=np.float64)[[columns[at[0], at[1]], columns[at[0], at[2]],
                                                                  columns[at[1], at[2]]]]
        # D's exact counts of the three pairs are 0 and D''s are 1 (the adversary knows D): Laplace likelihood ratio
        return stats.TrialOutcome({"class 0, the canary's three pair counts, Laplace likelihood ratio":
                                   _laplace_ratio_of_unit_shift(noisy, self.scale),
                                   "class 0, the canary's three pair counts, sum": float(noisy.sum())}, draws)


class HistogramAudit(_Mechanism):
    """The histogram methods' stage 1 (``--method histogram``; histogram-markov's term stage is the same code at
    a share of the budget): per-class noisy term counts."""

    name = "histogram"
    #: configuration a variant of stage 1 changes (its mechanism or its contribution); this audit is of the
    #: first-S Laplace histogram (--mechanism laplace), named because the histogram methods' default is Gaussian
    variant: dict[str, Any] = {"mechanism": "laplace"}
    #: S (``--first-terms``)
    FIRST_TERMS = 4

    def __init__(self, workdir: Path, insecure: bool) -> None:
        super().__init__(workdir, insecure)
        from privseed.tasks.config.commands import DpKpsConfig
        from privseed.tasks.seeds.histogram_seeds import build_mechanism, stage_budgets
        from privseed.tasks.seeds.vocabulary import load_vocabulary

        path = workdir / f"audit-{self.name}-vocabulary.txt"
        path.write_text("\n".join(self.vocabulary_terms()) + "\n", encoding="utf-8")
        self.vocabulary = load_vocabulary(str(path))
        self.cfg = DpKpsConfig(**self.config_values({**dict(
            method="histogram", vocab=str(path), vocab_top=None, first_terms=self.FIRST_TERMS,
            hist_top_k=len(self.vocabulary), epsilon=1.0, per_class=10, length=5, n_workers=1), **self.variant},
            DpKpsConfig))
        eps_1, delta_1 = stage_budgets(self.cfg.method, self.cfg.histogram_epsilon, self.cfg.delta,
                                       self.cfg.markov_term_share)[0]
        self.mechanism = build_mechanism(self.cfg.mechanism, self.cfg.first_terms, eps_1, delta_1,
                                         self.cfg.hist_contribution)
        self.scale = self.mechanism.scale
        private = audit_corpus()
        # A class-0 document of S terms no document uses: S counts of class 0 move by 1, the whole L1 sensitivity.
        canary = list(_UNUSED_TERMS[:self.cfg.first_terms])
        self.canary_ids = [self.vocabulary.terms.index(t) for t in canary]
        self.plans = self.write_corpora(private, _with(private, " ".join(canary), 0), self.bulk())
        self.others = self.other_counts(private, self.other_canaries(canary), self.bulk())

    def vocabulary_terms(self) -> list[str]:
        """V of this audit (a file written at setup)."""
        return audit_vocabulary_terms()

    def other_canaries(self, canary: list[str]) -> dict[str, tuple[str, Any]]:
        """The calibration check's other canaries (``other_canaries``) besides ``canary``, as (text, label)."""
        return other_canaries(canary, self.cfg.first_terms, self.vocabulary.terms)

    def bulk(self) -> pd.DataFrame | None:
        """Documents D and D' hold besides the audit corpus (none: its own counts serve the calibration check)."""
        return None

    def noise_draws(self, ledger: _RecordingLedger, own: np.ndarray, with_canary: bool) -> dict[str, stats.NoiseDraw]:
        """The calibration check's blocks: every class's whole noisy row, moved by the canary (pass 1 on the other
        corpus too, every trial) and by the other canaries. ``own``: the trial's corpus's counts, which the stage
        released."""
        counts = {with_canary: own, not with_canary: self.exact_counts(self.plans[not with_canary])}
        blocks = {f"histogram-class{c}": (counts[False][c], counts[True][c]) for c in range(len(self.labels))}
        others = {f"histogram-class{c}": {name: other[c] for name, other in self.others.items()}
                  for c in range(len(self.labels))}
        return self.draws(ledger, blocks, with_canary, others)

    def trial(self, with_canary: bool) -> stats.TrialOutcome:
        from privseed.tasks.stages.histogram import privatize_class_histograms

        own = self.exact_counts(self.plans[with_canary])
        with self.ledger() as ledger:
            released = privatize_class_histograms.fn(own, self.labels, self.cfg, ledger)[0]
            draws = self.noise_draws(ledger, own, with_canary)
            events = self.delta_events(ledger)
        noisy = np.asarray(released["noisy"], dtype=np.float64)[self.canary_ids]
        # D's exact counts of the S terms are 0 and D''s are 1 (the adversary knows D): Laplace likelihood ratio
        return stats.TrialOutcome({"class 0, the canary's S term counts, Laplace likelihood ratio":
                                   _laplace_ratio_of_unit_shift(noisy, self.scale),
                                   "class 0, the canary's S term counts, sum": float(noisy.sum())}, draws, events)

    def delta_events(self, ledger: _RecordingLedger) -> dict[str, tuple[int, int]]:
        """The delta check's events of the trial (none: this mechanism claims delta 0 for its own reasons, and D
        has no term that only one document holds)."""
        return {}


def _move_above(floor: int, without: np.ndarray, neighbour: np.ndarray) -> np.ndarray:
    """A neighbour's move of the counts at or above ``floor`` on both corpora (there released - exact is noise)."""
    moved = (without >= floor) & (neighbour >= floor)
    return (neighbour - without)[moved].astype(np.float64)


def single_document_terms(count: int) -> list[str]:
    """``count`` made-up words, each of two letters "zq" and three more (public, in no other list of the audit):
    the terms of the thresholded histogram's single-document items."""
    words = ["zq" + "".join(letters) for letters in itertools.product(string.ascii_lowercase, repeat=3)]
    if count > len(words):
        raise ConfigError(f"the audit has {len(words)} made-up words, not {count}")
    return words[:count]


class HistogramThresholdAudit(HistogramAudit):
    """Stage 1 with ``--mechanism laplace-threshold`` (discrete Laplace noise only on occurring terms, a noisy
    count released only at or above the threshold; epsilon by OpenDP's map, delta exact). The canary's S counts
    exist only on D': the test sees them when they pass the threshold (probability within delta) and through their
    noisy values.

    Configuration: epsilon 4 and delta 1e-2 at S = 4, so scale 1 and threshold 7. The delta event must happen
    often enough to be counted: at delta 1e-5 it would take millions of trials, and at scale 4 the off-by-one of
    OpenDP's map (a delta e^(1 / scale) too small, opendp/opendp#2922) is a factor 1.28; at scale 1 it is e, and
    the same code computes the delta at every configuration.

    The calibration check. A count under the threshold is released as 0, so released minus exact is the noise
    only where the exact count is far above the threshold: from ``stats.untruncated_floor`` (threshold +
    ceil(b ln 1e12), 35 at the threshold 7 and scale b = 1) a count is cut with probability at most 1e-12, so the
    check takes the released counts there and no others. D's own counts are at most 9, so both corpora also hold
    ``bulk()``: each of the audit corpus's 12 texts, as many times as the floor (37 counts of the three classes at
    or above it, about 1,500 noise values in the suite's 40 trials). The canary's terms never get there (they are
    the delta event), so the check's moves are those of second neighbours through the same pass 1: D+ = D plus one
    more copy of a class-0 bulk text, which moves S = 4 counts above the floor by 1 each, the whole L1 sensitivity
    (its loss is S / b, as for histogram); the same with a class-1 and a class-2 text; and one document of the first
    S terms of every class-0 text (16 words, the longest document whose terms are all above the floor). (The check
    bounds the pure epsilon of such a shift; at the claimed delta its epsilon is at least S / b + ln(1 - 2^S delta),
    since the loss S / b has probability >= 2^-S. And a cut count among the check's values, probability at most
    2e-8 per audit, adds that much to its level.)

    The delta check. D (and D') also hold ``SINGLE_DOCUMENTS`` documents of S made-up terms that no other document
    holds (a document at the L0 bound: S counts of 1, each a coordinate that D without it does not have) and
    ``REPEATED_DOCUMENTS`` of one made-up term written S times (1 when counted right, S when a pass counts repeats),
    a third in each class. Without its document, none of its terms is noised or released; so "one of its terms is
    released" has probability at most the claimed delta, and the trials count how often it happens
    (``stats.delta_check``)."""

    name = "histogram-threshold"
    variant = {"mechanism": "laplace-threshold", "epsilon": 4.0, "delta": 1e-2}
    SINGLE_DOCUMENTS = 300
    REPEATED_DOCUMENTS = 60

    def __init__(self, workdir: Path, insecure: bool) -> None:
        super().__init__(workdir, insecure)
        # D+'s move of D's counts, by the same pass 1 on both, once: the pass is deterministic, and a trial's pass
        # over the bulk is most of its time.
        neighbour = _write_corpus(_with(audit_corpus(), _TOPICS[0][0], 0), workdir / f"{self.name}-neighbour",
                                  bulk=self.bulk())
        self.without = self.exact_counts(self.plans[False])
        self.neighbour_counts = self.exact_counts(neighbour)
        index = {t: i for i, t in enumerate(self.vocabulary.terms)}
        self.single_documents = {group: [(label, [index[t] for t in dict.fromkeys(text.split())])
                                         for text, label in documents]
                                 for group, documents in self.single_document_groups().items()}

    def vocabulary_terms(self) -> list[str]:
        return audit_vocabulary_terms() + single_document_terms(
            self.SINGLE_DOCUMENTS * self.FIRST_TERMS + self.REPEATED_DOCUMENTS)

    def single_document_groups(self) -> dict[str, list[tuple[str, int]]]:
        """The delta check's documents, (text, label), by group: S made-up terms each, and one made-up term written
        S times; document i of a group in class i mod 3."""
        s = self.FIRST_TERMS
        words = single_document_terms(self.SINGLE_DOCUMENTS * s + self.REPEATED_DOCUMENTS)
        distinct = words[:self.SINGLE_DOCUMENTS * s]
        repeated = words[self.SINGLE_DOCUMENTS * s:]
        classes = len(self.labels)
        return {f"a document of {s} terms only it holds": [(" ".join(distinct[i * s:(i + 1) * s]), i % classes)
                                                            for i in range(self.SINGLE_DOCUMENTS)],
                f"a document of 1 term only it holds, written {s} times": [(" ".join([w] * s), i % classes)
                                                                           for i, w in enumerate(repeated)]}

    def other_canaries(self, canary: list[str]) -> dict[str, tuple[str, Any]]:
        """The calibration check's other second neighbours (above): a bulk text of class 1 and of class 2, and the
        long document of class 0's first terms."""
        first = [" ".join(text.split()[:self.cfg.first_terms]) for text in _TOPICS[0]]
        return {"class 1": (_TOPICS[1][0], 1), "class 2": (_TOPICS[2][0], 2), "long document": (" ".join(first), 0)}

    def bulk(self) -> pd.DataFrame:
        """Every text of the audit corpus, ``untruncated_floor`` times: each of its S counted terms is at the
        floor or above (the floor of the mechanism as built, so of a faulty one too); and the delta check's
        single-document items."""
        copies = stats.untruncated_floor(self.mechanism.threshold, self.mechanism.scale)
        rows = [(text, label) for label, texts in _TOPICS.items() for text in texts for _ in range(copies)]
        rows += [row for documents in self.single_document_groups().values() for row in documents]
        return pd.DataFrame(rows, columns=["text", "label"])

    def noise_draws(self, ledger: _RecordingLedger, own: np.ndarray, with_canary: bool) -> dict[str, stats.NoiseDraw]:
        """Per class: released minus exact (``own``, this trial's pass) on the counts at or above the floor of the
        threshold and scale the ledger recorded (the noise: discrete Laplace, the family the kind states), and
        each second neighbour's move of the counts at or above it on D and on that neighbour."""
        without = self.without
        entries = {e["name"]: e for e in ledger.entries()}
        out = {}
        for c in range(len(self.labels)):
            name = f"histogram-class{c}"
            entry = entries[name]
            if entry["mechanism"] != "laplace-threshold":
                raise ConfigError(f"audit {self.name}: {name} was drawn by {entry['mechanism']!r}")
            floor = stats.untruncated_floor(entry["guarantee"]["threshold"], float(entry["scale"]))
            whole = own[c] >= floor
            released = np.asarray(ledger.released[name]["noisy"], dtype=np.float64)
            out[name] = stats.NoiseDraw(family="laplace", residual=released[whole] - own[c][whole],
                                        move=_move_above(floor, without[c], self.neighbour_counts[c]),
                                        claimed_scale=float(entry["scale"]),
                                        other_moves={n: _move_above(floor, without[c], counts[c])
                                                     for n, counts in self.others.items()})
        return out

    def delta_events(self, ledger: _RecordingLedger) -> dict[str, tuple[int, int]]:
        """Per group, how many of the single-document items had one of their terms released, of how many."""
        released = [np.asarray(ledger.released[f"histogram-class{c}"]["noisy"]) for c in range(len(self.labels))]
        return {group: (sum(bool(np.any(released[c][ids] != 0)) for c, ids in documents), len(documents))
                for group, documents in self.single_documents.items()}


class HistogramUnitL2Audit(HistogramAudit):
    """The histogram methods' stage 1 with ``--hist-contribution unit-l2`` (Gaussian, L2 sensitivity 1): each
    document adds 1 / sqrt(n) to each of its n distinct terms, computed by the flows' own pass 1."""

    name = "histogram-unit-l2"
    variant = {"mechanism": "gaussian", "delta": 1e-5, "hist_contribution": "unit-l2"}


class HistogramRankL2Audit(HistogramAudit):
    """The histogram methods' stage 1 with ``--hist-contribution rank-l2`` (Gaussian, L2 sensitivity 1): the i-th
    of a document's n distinct terms weighs i^-0.5, scaled to L2 norm 1, computed by the flows' own pass 1."""

    name = "histogram-rank-l2"
    variant = {"mechanism": "gaussian", "delta": 1e-5, "hist_contribution": "rank-l2"}


class HistogramSlowRankL2Audit(HistogramAudit):
    """The histogram methods' stage 1 with ``--hist-contribution slow-rank-l2`` (Gaussian, L2 sensitivity 1), the
    corpus profile's kind for short documents: the i-th of a document's n distinct terms weighs i^-0.25, scaled to
    L2 norm 1, computed by the flows' own pass 1."""

    name = "histogram-slow-rank-l2"
    variant = {"mechanism": "gaussian", "delta": 1e-5, "hist_contribution": "slow-rank-l2"}


class HistogramRankRareL2Audit(HistogramAudit):
    """The histogram methods' stage 1 with ``--hist-contribution rank-rare-l2`` (Gaussian, L2 sensitivity 1): the
    rank-l2 weights times public factors that lower the most common English words, scaled to L2 norm 1, computed
    by the flows' own pass 1."""

    name = "histogram-rank-rare-l2"
    variant = {"mechanism": "gaussian", "delta": 1e-5, "hist_contribution": "rank-rare-l2"}


class SecPeAudit(_PeAudit):
    name = "secpe"

    def __init__(self, workdir: Path, insecure: bool) -> None:
        super().__init__(workdir, insecure)
        from privseed.tasks.pe import evolution as ev
        from privseed.tasks.config.commands import SecPeConfig
        from privseed.tasks.stages.pe import embed_candidates

        secrets = workdir / "audit-secrets.txt"
        secrets.write_text(_NOBODY_HOLDS_THIS_SECRET + "\n", encoding="utf-8")
        self.cfg = SecPeConfig(**self.config_values(dict(
            public="audit://public-texts", secrets=str(secrets), noise_multiplier=3.0, iterations=1, clusters=2,
            delta=1e-5, per_class=2, progress=False), SecPeConfig))
        public_emb = embed_candidates.fn(_PUBLIC_TEXTS, self.cfg.embedding_model)
        self.clusters = ev.public_kmeans(public_emb, self.cfg.clusters, self.cfg.seed)
        self.scales = ev.centre_noise_scales(self.clusters, self.cfg.radius)
        private = audit_corpus()
        plans = self.write_corpora(private, _with(private, _SECPE_CANARY, 0))
        self.units = {side: self.private_units(plan) for side, plan in plans.items()}
        self._adversary_view({side: self._joint(side, self._rho(side)) for side in (False, True)})

    def _rho(self, with_canary: bool) -> Any:
        """The flow's secret detection over the units and SecretNoise: (sampling probabilities per unit, noise).
        Nobody holds the audit's secret, so every rho is 1: the sampled sums are the exact ones, every trial."""
        from privseed.tasks.stages.pe import detect_unit_secrets, rho_per_unit, secret_noise as run_secret_noise

        units = self.units[with_canary]
        secret_noise = run_secret_noise(self.cfg, detect_unit_secrets.fn(self.cfg, units))
        if not np.all(secret_noise.rho == 1.0):
            raise ConfigError("audit corpus: a document's sampling probability is below 1; the audit needs exact sums")
        return rho_per_unit(units, secret_noise.rho), secret_noise

    def _joint(self, with_canary: bool, rho: Any) -> np.ndarray:
        """Round 1's exact joint statistics of class 0 (sizes, centres in noise units) from the flow's per-unit
        cluster sums (``exact_cluster_sums``), as the flow's SecPE round computes them."""
        from privseed.tasks.pe import evolution as ev
        from privseed.tasks.stages.pe import exact_cluster_sums

        sums = exact_cluster_sums.fn(self.units[with_canary], rho[0], self.cfg, 1, self.clusters)
        return ev.joint_statistics(*ev.clustering_from_sums(self.clusters, sums.counts[0], sums.sums[0]), self.scales)

    def _adversary_view(self, joint: Mapping[bool, np.ndarray]) -> None:
        """What the adversary, who knows every document of D, expects: the canary's cluster k (the size it moves),
        the exact class-0 centre of k on D, and the direction and length of the canary's move of it, in units of
        its noise."""
        from privseed.tasks.pe import evolution as ev

        centres, sizes = {}, {}
        for side, z in joint.items():
            centres[side], sizes[side] = ev.split_joint_statistics(z, self.scales)
        k = int(np.argmax(sizes[True] - sizes[False]))
        move = centres[True][k] - centres[False][k]
        self.cluster = k
        self.scale = float(self.scales[k])  # the centre's noise unit c_k
        self.centre_without = centres[False][k]
        self.direction = move / max(float(np.linalg.norm(move)), 1e-300)
        self.move_in_noise_units = float(np.linalg.norm(move)) / self.scale

    def trial(self, with_canary: bool) -> stats.TrialOutcome:
        from privseed.tasks.stages.pe import charge_secpe_schedule, draw_secpe_round

        rho = {side: self._rho(side) for side in (False, True)}
        joint = {side: self._joint(side, rho[side]) for side in (False, True)}
        with self.ledger() as ledger:
            _, mechanism = charge_secpe_schedule(ledger, self.cfg, rho[with_canary][1])
            # Only the canary's class: the flow draws every class with this same function, but the other classes'
            # releases are computed on other documents (parallel composition) and would only cost sampling time.
            released = draw_secpe_round(ledger, self.cfg, mechanism, 1, 0, 0, self.clusters, self.scales,
                                        lambda: joint[with_canary])
            draws = self.draws(ledger, {"secpe.round-001.class-0": (joint[False], joint[True])}, with_canary)
        sigma = rho[with_canary][1].sigma
        size = float(released["sizes"][self.cluster]) / sigma
        centre = float((released["centres"][self.cluster] - self.centre_without) @ self.direction)
        centre /= self.scale * sigma
        # Both are Gaussian in noise units with means shifted by 1 and by the centre's move: the likelihood ratio
        # of the pair is their sum weighted by the shifts.
        return stats.TrialOutcome({"noisy size of the canary's cluster": size,
                                   "centre moved towards the canary": centre,
                                   "size + centre (likelihood ratio)": size + self.move_in_noise_units * centre},
                                  draws)


class CorpusProfileAudit(_Mechanism):
    """The histogram methods' corpus profile (tasks/seeds/corpus_profile.py, released by
    ``settle_histogram_settings`` when an option is left "auto"): documents per (class, length bin), discrete
    Laplace of scale 1 / eps_profile. The canary is a class-0 document of four terms no document uses: it adds 1
    to one cell (class 0, the bin of length 4), the whole L1 sensitivity."""

    name = "corpus-profile"

    def __init__(self, workdir: Path, insecure: bool) -> None:
        super().__init__(workdir, insecure)
        from privseed.tasks.config.commands import DpKpsConfig
        from privseed.tasks.seeds.corpus_profile import length_bin, profile_budget, profile_mechanism
        from privseed.tasks.seeds.vocabulary import load_vocabulary

        path = workdir / "audit-corpus-profile-vocabulary.txt"
        path.write_text("\n".join(audit_vocabulary_terms()) + "\n", encoding="utf-8")
        self.vocabulary = load_vocabulary(str(path))
        # --length auto asks for the profile; epsilon 5 gives it eps_profile 0.25: scale 4, as the other histogram
        # audits (S / eps at S = 4, eps 1), where the discrete Laplace is close to the continuous one the check reads
        self.cfg = DpKpsConfig(**self.config_values(dict(
            method="histogram", mechanism="laplace", vocab=str(path), vocab_top=None, first_terms=4,
            hist_top_k=len(self.vocabulary), epsilon=5.0, per_class=10, length="auto", n_workers=1), DpKpsConfig))
        (eps_profile, _), _ = profile_budget(self.cfg.histogram_epsilon, self.cfg.delta)
        self.scale = profile_mechanism(eps_profile).scale
        canary = list(_UNUSED_TERMS[:4])
        self.cell = length_bin(len(canary))
        private = audit_corpus()
        self.plans = self.write_corpora(private, _with(private, " ".join(canary), 0))

    def trial(self, with_canary: bool) -> stats.TrialOutcome:
        from privseed.tasks.seeds.corpus_profile import split_profiled_counts
        from privseed.tasks.stages.histogram import settle_histogram_settings

        counts = {side: self.exact_counts(plan) for side, plan in self.plans.items()}
        profiles: dict[bool, np.ndarray] = {}
        for side, c in counts.items():
            exact = split_profiled_counts(c, len(self.vocabulary), str(self.cfg.hist_contribution), True)[1]
            assert exact is not None  # asked for with True
            profiles[side] = exact
        with self.ledger() as ledger:
            settle_histogram_settings.fn(counts[with_canary], self.labels, self.cfg, ledger)
            noisy = float(np.asarray(ledger.released["corpus-profile"]["noisy"], dtype=np.float64)[0, self.cell])
            draws = self.draws(ledger, {"corpus-profile": (profiles[False], profiles[True])}, with_canary)
        shifted = np.asarray([noisy - float(profiles[False][0, self.cell])])  # D's count is public to the adversary
        # the likelihood ratio is the most powerful test, but it is flat beyond one unit of shift: a noise value that
        # repeats (reproducible noise) far from 0 is told apart by the count itself
        return stats.TrialOutcome({"class 0, the canary's length bin, Laplace likelihood ratio":
                                   _laplace_ratio_of_unit_shift(shifted, self.scale),
                                   "class 0, the canary's length bin, noisy count": float(shifted[0])}, draws)


AUDITS: dict[str, type[_Mechanism]] = {"vocabulary": VocabularyAudit, "kde": KdeAudit, "histogram": HistogramAudit,
                                       "markov": MarkovPairsAudit, "augpe": AugPeAudit, "secpe": SecPeAudit,
                                       "histogram-unit-l2": HistogramUnitL2Audit,
                                       "histogram-rank-l2": HistogramRankL2Audit,
                                       "histogram-slow-rank-l2": HistogramSlowRankL2Audit,
                                       "histogram-rank-rare-l2": HistogramRankRareL2Audit,
                                       "histogram-threshold": HistogramThresholdAudit,
                                       "corpus-profile": CorpusProfileAudit}


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

    names = ("privseed.flows", "privseed.tasks", "prefect", "privseed.tasks.dp.ledger")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    threads = torch.get_num_threads()
    for name, lg in zip(names, loggers):
        floor = logging.ERROR if insecure and name == "privseed.tasks.dp.ledger" else logging.WARNING
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
                try:
                    with tqdm(total=total, desc=f"audit {name}", unit="trial", disable=not progress, leave=False,
                              file=sys.stderr) as bar:
                        row = _audit_one(mechanism, profile, alpha, bar.update)
                finally:
                    mechanism.close()
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
