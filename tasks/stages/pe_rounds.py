"""The private-evolution round loop, shared by Aug-PE, AugPE+V~ and SecPE, and their vote steps.

    RANDOM_API population -> T x (embed candidates -> vote step (drawn once through the ledger) -> select
    -> VARIATION_API) -> final population

This is the seam of the `pe` library's runner: one loop over rounds that asks a pluggable vote step for one
score per candidate each round. Aug-PE's step is the nearest-neighbour DP histogram (every private document votes
for its nearest candidate of its class; Gaussian noise; threshold H); SecPE's is SecretClustering (noisy cluster
sizes and centres per class; each noisy centre adds its noisy size to its nearest candidate). Both compute their
exact statistic per work unit on the workers and draw its noise once through the ledger, so a resumed run
re-reads every round it already drew and redraws none.

Class conditioning without naming the class (DP-KPS's setting): every class has its own population. All
populations start from the same unconditional RANDOM_API prompt (Aug-PE, SecPE) or from prompts carrying random
words of the released vocabulary V~ (AugPE+V~), with different call seeds; private documents vote only within
their class, so the classes separate through selection alone. The synthetic documents keep their population's
label.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd

from privseed.tasks.pe import evolution as ev
from privseed.tasks import storage
from privseed.tasks.config.commands import AugPeConfig, EvolutionConfig, SecPeConfig
from privseed.tasks.dp.ledger import PrivacyLedger
from privseed.tasks.dp.mechanisms import GaussianMechanism
from privseed.tasks.pe.pe_units import PrivateUnits
from privseed.tasks.stages import stage_logger
from privseed.tasks.stages.pe import (draw_augpe_round, draw_secpe_round, embed_candidates, exact_class_votes,
                                      exact_cluster_sums, generate_candidates, rho_per_unit, variation_settings)


class VoteStep(Protocol):
    """One round's histogram over the candidates: what the loop asks of a PE method."""

    # Read-only members (properties): a vote step may narrow them (AugPeVote's selection is a Literal).
    @property
    def name(self) -> str:
        """Ledger and public-randomness stream prefix ("augpe", "secpe")."""
        ...

    @property
    def title(self) -> str:
        """What logs and the operator's timings call the method ("Aug-PE", "AugPE+V~", "SecPE")."""
        ...

    @property
    def selection(self) -> str:
        """How the loop picks the population from the scores: "rank" or "sample" (``ev.select_population``)."""
        ...

    def scores(self, t: int, candidates: pd.DataFrame, candidate_emb: np.ndarray, candidate_class: np.ndarray,
               documents: np.ndarray) -> np.ndarray:
        """Round t's score of every candidate, post-processing of a statistic drawn once through the ledger."""
        ...


class AugPeVote:
    """Aug-PE: every private document votes for its nearest candidate of its class (non-documents take no vote);
    the counts, summed over the work units, get the schedule's Gaussian noise; threshold H."""

    name = "augpe"

    def __init__(self, ledger: PrivacyLedger, cfg: AugPeConfig, schedule: dict, units: PrivateUnits) -> None:
        self.ledger, self.cfg, self.schedule, self.units = ledger, cfg, schedule, units
        self.title = "AugPE+V~" if cfg.vocab_words else "Aug-PE"
        self.selection = cfg.selection

    def exact_votes(self, candidate_emb: np.ndarray, voting_class: np.ndarray) -> np.ndarray:
        """The exact vote counts over the candidates (private: only the round's draw may see them)."""
        return exact_class_votes(self.units, candidate_emb, voting_class)

    def scores(self, t: int, candidates: pd.DataFrame, candidate_emb: np.ndarray, candidate_class: np.ndarray,
               documents: np.ndarray) -> np.ndarray:
        voting = ev.voting_classes(candidate_class, documents)
        noisy = draw_augpe_round(self.ledger, self.cfg, self.schedule, t, candidates,
                                 lambda: self.exact_votes(candidate_emb, voting))
        return ev.apply_threshold(noisy, self.cfg.threshold)


class SecPeVote:
    """SecPE: per class, the noisy sizes and centres of the public clusters once the class's Bernoulli(rho)-sampled
    documents joined them (one draw per class through the ledger); each noisy centre adds its noisy size to its
    nearest candidate of the class that is a document (to every candidate when none is)."""

    name = "secpe"
    title = "SecPE"
    selection = "rank"

    def __init__(self, ledger: PrivacyLedger, cfg: SecPeConfig, mechanism: GaussianMechanism,
                 clusters: ev.PublicClusters, units: PrivateUnits, rho: np.ndarray, labels: list) -> None:
        self.ledger, self.cfg, self.mechanism, self.clusters, self.units = ledger, cfg, mechanism, clusters, units
        self.rho = rho_per_unit(units, rho)
        self.labels = labels
        self.scales = ev.centre_noise_scales(clusters, cfg.radius)  # public: from the public clusters and R

    def exact_sums(self, t: int) -> ev.ClusterSums:
        """Round t's exact counts and sums per (class, cluster) (private: only the round's draws may see them)."""
        return exact_cluster_sums(self.units, self.rho, self.cfg, t, self.clusters)

    def scores(self, t: int, candidates: pd.DataFrame, candidate_emb: np.ndarray, candidate_class: np.ndarray,
               documents: np.ndarray) -> np.ndarray:
        round_sums = functools.cache(lambda: self.exact_sums(t))  # one pass over the units, only if a class draws

        def exact(ci: int) -> np.ndarray:
            sums = round_sums()
            return ev.joint_statistics(*ev.clustering_from_sums(self.clusters, sums.counts[ci], sums.sums[ci]),
                                       self.scales)

        hist = np.zeros(len(candidates))
        for ci, label in enumerate(self.labels):
            released = draw_secpe_round(self.ledger, self.cfg, self.mechanism, t, ci, label, self.clusters,
                                        self.scales, functools.partial(exact, ci))
            idx = np.flatnonzero(candidate_class == ci)
            voted = idx[documents[idx]] if documents[idx].any() else idx
            hist[voted] = ev.cluster_votes(released["centres"], released["sizes"], candidate_emb[voted],
                                           radius=self.cfg.radius)
        return hist


@dataclass(frozen=True)
class Evolution:
    """What the loop leaves: the last round's population, the LLM calls by kind and the public per-round counts
    (round, candidates, non-documents)."""

    final: pd.DataFrame
    calls: dict[str, int]
    rounds: list[dict[str, int]]


def evolve(cfg: EvolutionConfig, labels: list, vote: VoteStep, words: list[str] | None = None) -> Evolution:
    """The PE round loop: RANDOM_API writes N (K + 1) candidates per class (with words of V~ when ``words``);
    then, T times, embed the candidates, score them with ``vote`` and keep N per class; between rounds,
    VARIATION_API writes K variations of every kept sample."""
    logger = stage_logger()
    plan = ev.evolution_call_plan(len(labels), cfg.per_class, cfg.variations, cfg.iterations)
    logger.info("%s plan: %d classes x population N=%d, K=%d variations, T=%d rounds -> %d LLM calls "
                "(%d RANDOM_API + %d VARIATION_API) on %s; calls already in the cache are not sent again",
                vote.title, len(labels), cfg.per_class, cfg.variations, cfg.iterations, plan["total"],
                plan["random"], plan["variation"], cfg.llm)
    clock = RoundClock()
    prompts, meta = ev.random_prompts(labels, cfg.per_class * (cfg.variations + 1), seed=cfg.seed,
                                      doc_type=cfg.doc_type, words=words,
                                      words_per_prompt=getattr(cfg, "words_per_prompt", 0))
    with clock("llm_s"):
        candidates = generate_candidates(cfg, prompts, meta, f"{vote.name} RANDOM_API")
    calls = {"random": len(prompts), "variation": 0}
    for t in range(1, cfg.iterations + 1):
        with clock("embed_s"):
            candidate_emb = embed_candidates(candidates["text"].tolist(), cfg.embedding_model)
        candidate_class = ev.class_index(labels, candidates["label"])
        documents = ev.candidate_documents(cfg, cfg.min_words, candidates)
        with clock("histogram_s"):
            scores = vote.scores(t, candidates, candidate_emb, candidate_class, documents)
            keep = ev.select_per_class(scores, candidate_class, documents, len(labels), cfg.per_class,
                                       vote.selection, cfg.seed, vote.name, f"round-{t}", "select")
        clock.end_round(t, len(candidates), int((~documents).sum()))
        kept = candidates.iloc[keep].reset_index(drop=True)
        if t == cfg.iterations:
            break
        prompts, meta = ev.variation_prompts(kept, t, **variation_settings(cfg))
        calls["variation"] += len(prompts)
        with clock("llm_s"):
            answers = generate_candidates(cfg, prompts, meta,
                                          f"{vote.name} round {t + 1}/{cfg.iterations} VARIATION_API")
        candidates = pd.concat([kept, answers], ignore_index=True)
        logger.info("%s round %d/%d done", vote.title, t, cfg.iterations)
    clock.save(cfg, vote.title)
    return Evolution(kept, calls, clock.rounds)


class RoundClock:
    """Per-round bookkeeping of a PE run. ``rounds`` (written to evolution.json) holds only public counts: the
    round, its candidates and how many of them were not documents. The wall-clock seconds of each round's parts,
    ``llm_s`` (the calls that made the round's candidates), ``embed_s`` and ``histogram_s`` (votes or
    SecretClustering, noise, selection), show whether a round is bounded by the LLM or by the histogram, but the
    histogram step grows with the private corpus size |D|: they go to the operator's log and to
    ``privseed.tasks.pe.evolution.OPERATOR_TIMINGS`` in the private state (``save``), never to a released file."""

    def __init__(self) -> None:
        self.rounds: list[dict[str, int]] = []
        self.timings: list[dict[str, float]] = []
        self._current: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, part: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self._current[part] = self._current.get(part, 0.0) + time.perf_counter() - began

    def end_round(self, t: int, candidates: int, non_documents: int = 0) -> None:
        self.rounds.append({"round": t, "candidates": candidates, "non_documents": non_documents})
        self.timings.append({"round": t, **{k: round(self._current.get(k, 0.0), 4)
                                            for k in ("llm_s", "embed_s", "histogram_s")}})
        self._current = {}

    def save(self, cfg: EvolutionConfig, method: str) -> None:
        """Timings to the operator: one log line per round and OPERATOR_TIMINGS under the private state."""
        for row in self.timings:
            stage_logger().info("%s round %d timings: llm %.2f s, embed %.2f s, histogram %.2f s", method,
                                row["round"], row["llm_s"], row["embed_s"], row["histogram_s"])
        document: dict[str, Any] = {"method": method, "rounds": self.timings}
        storage.write_bytes(storage.join(cfg.state_uri, ev.OPERATOR_TIMINGS),
                            (json.dumps(document, indent=2) + "\n").encode(), cfg.storage_options)
