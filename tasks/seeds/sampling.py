"""Keyphrase-sequence samplers and fast DP-KDE scoring (DP-KPS step 6).

Methods (per class; classes are disjoint parts of the corpus, so their sketches compose in parallel):
  independent       one sketch over all single phrases of the class (each document's weight 1); every term
                    of V~ is scored once and L terms are drawn i.i.d.
  iterative-linear  L sketches, sketch i over length-i prefixes (d*i dimensions), eps_kde / L each.
  iterative-log     ceil(log2 L) + 1 sketches over 1, 2, 4, ... blocks (the last capped at L), eps_kde / count
                    each; a prefix of length i is zero-padded to the smallest sketch with >= i blocks
                    (appendix Theorem B.2: unbiased up to a factor that is constant across candidates).
All of this is post-processing of the released sketches: sampling costs no privacy.

Fast scoring: the phase of a concatenation is the sum of per-block phases. Per-block phase tables of every
V~ term are computed once per sketch (shared by all classes, the features are public); each prefix's phase
a is gathered from them, and cos(a + c) = cos a cos c - sin a sin c turns scoring a batch of prefixes
against all of V~ into two (B x I) @ (I x |V~|) matrix products. torch runs them on the GPU when present.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from privseed.tasks.errors import ConfigError
from privseed.tasks.seeds.kde import SQRT2, RffFeatures
from privseed.tasks.seeds.seed_methods import DPKPS_SAMPLERS, SEED_METHODS

#: The DP-KPS samplers (tasks/seeds/seed_methods.py is their registry).
METHODS = DPKPS_SAMPLERS


def ensemble_blocks(method: str, length: int) -> list[int]:
    """Number of blocks (prefix length) of each sketch of the method's ensemble (the registry's sketch_blocks)."""
    if length < 1:
        raise ConfigError(f"sequence length L must be >= 1, got {length}")
    blocks = SEED_METHODS[method].sketch_blocks if method in DPKPS_SAMPLERS else None
    if blocks is None:
        raise ConfigError(f"unknown DP-KPS method {method!r}; expected one of {METHODS}")
    return blocks(length)


def sketch_for_step(blocks: Sequence[int], step: int) -> int:
    """Index of the sketch that scores prefixes of length ``step`` (1-based): the smallest with >= step blocks."""
    for index, b in enumerate(blocks):
        if b >= step:
            return index
    raise ConfigError(f"no sketch covers prefix length {step} (largest has {max(blocks)} blocks)")


def split_budget(method: str, eps_kde: float, length: int) -> list[float]:
    """Basic composition inside a class: every sketch of the ensemble gets eps_kde / (number of sketches)."""
    blocks = ensemble_blocks(method, length)
    return [eps_kde / len(blocks)] * len(blocks)


# ---------------------------------------------------------------------------------------------
# Selection rules
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SelectionRule:
    """How the next term is chosen from clipped scores s+ = max(s, 0).

    proportional: P(w) ~ s+(w); greedy: argmax; top-K: P(w) ~ s+(w) among the K best scores;
    power-G: P(w) ~ s+(w)^G (a temperature 1/G). Rows whose clipped scores are all zero fall back to
    uniform over the allowed terms (all of V~, or the K best).
    """

    kind: str  # "proportional" | "greedy" | "top" | "power"
    k: int = 0
    power: float = 1.0

    @classmethod
    def parse(cls, spec: str) -> "SelectionRule":
        spec = spec.strip().lower()
        if spec == "proportional":
            return cls("proportional")
        if spec == "greedy":
            return cls("greedy")
        if m := re.fullmatch(r"top-?(\d+)", spec):
            k = int(m.group(1))
            if k < 1:
                raise ConfigError("top-K selection needs K >= 1")
            return cls("top", k=k)
        if m := re.fullmatch(r"power-?([0-9]*\.?[0-9]+)", spec):
            power = float(m.group(1))
            if power <= 0:
                raise ConfigError("power-G selection needs G > 0")
            return cls("power", power=power)
        raise ConfigError(f"unknown selection rule {spec!r}; use proportional, greedy, top-K or power-G")

    def __str__(self) -> str:
        return {"top": f"top-{self.k}", "power": f"power-{self.power:g}"}.get(self.kind, self.kind)

    def weights(self, scores: np.ndarray) -> np.ndarray:
        """Unnormalized selection weights (R, V) >= 0 with a positive sum in every row."""
        scores = np.asarray(scores, dtype=np.float64)
        rows, vocab = scores.shape
        if self.kind == "greedy":
            w = np.zeros_like(scores)
            w[np.arange(rows), scores.argmax(axis=1)] = 1.0
            return w
        allowed = np.ones_like(scores, dtype=bool)
        if self.kind == "top" and self.k < vocab:
            kth = np.partition(scores, vocab - self.k, axis=1)[:, vocab - self.k]
            allowed = scores >= kth[:, None]
        w = np.where(allowed, np.maximum(scores, 0.0), 0.0)
        if self.kind == "power":
            w = w**self.power
        empty = w.sum(axis=1) <= 0
        if empty.any():
            w[empty] = allowed[empty].astype(np.float64)
        return w


    def draw(self, scores: torch.Tensor, rng: np.random.Generator, rows: torch.Tensor | None = None) -> np.ndarray:
        """One term per row, on the scores' device; same law as ``weights`` + ``draw_rows``.

        ``rows`` (optional): row r draws from ``scores[rows[r]]`` (scores of distinct prefixes, shared by
        the rows that have them). top-K works on the K best of each score row only (torch.topk); uniforms
        come from ``rng`` so runs are reproducible on CPU and GPU alike.
        """
        vocab = scores.shape[1]
        if rows is None:
            rows = torch.arange(scores.shape[0], device=scores.device)
        if self.kind == "greedy":
            return scores.argmax(dim=1)[rows].cpu().numpy()
        if self.kind == "top" and self.k < vocab:
            values, index = torch.topk(scores, self.k, dim=1)
        else:
            values, index = scores, None
        w = torch.clamp(values, min=0.0)
        if self.kind == "power":
            w = w**self.power
        empty = w.sum(dim=1) <= 0
        if bool(empty.any()):
            w[empty] = 1.0
        cdf = torch.cumsum(w.to(torch.float64), dim=1)[rows]
        u = torch.as_tensor(rng.random(len(rows)), dtype=cdf.dtype, device=cdf.device) * cdf[:, -1]
        pick = torch.searchsorted(cdf, u[:, None], right=True).squeeze(1).clamp_(max=w.shape[1] - 1)
        if index is not None:
            pick = index[rows].gather(1, pick[:, None]).squeeze(1)
        return pick.cpu().numpy()


def draw_rows(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One index per row, P(j) = weights[r, j] / sum_j weights[r, j]."""
    cdf = np.cumsum(weights, axis=1)
    u = rng.random(weights.shape[0]) * cdf[:, -1]
    idx = (cdf <= u[:, None]).sum(axis=1)
    return np.minimum(idx, weights.shape[1] - 1)


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------

def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class SketchTables:
    """One sketch's public per-block phase tables on the scoring device."""

    tables: torch.Tensor  # (blocks, V, I), dtype of the scorer
    offset: torch.Tensor  # (I,) float64

    @classmethod
    def build(cls, features: RffFeatures, embeddings: np.ndarray, device: torch.device | None = None,
              dtype: torch.dtype = torch.float32) -> "SketchTables":
        device = device or default_device()
        tables = torch.as_tensor(features.block_phase_tables(embeddings), dtype=dtype, device=device)
        offset = torch.as_tensor(features.offset, dtype=torch.float64, device=device)
        return cls(tables=tables, offset=offset)

    @property
    def blocks(self) -> int:
        return int(self.tables.shape[0])

    def prefix_phases(self, prefixes: torch.Tensor) -> torch.Tensor:
        """offset + sum_j table[j, p_j] for (R, l) term ids, accumulated in float64: (R, I)."""
        rows = prefixes.shape[0]
        phase = self.offset.expand(rows, -1).clone()
        for j in range(prefixes.shape[1]):
            phase += self.tables[j, prefixes[:, j]].to(torch.float64)
        return phase


def fast_scores(sketch: SketchTables, noisy_sums: torch.Tensor, prefixes: torch.Tensor) -> torch.Tensor:
    """Scores s(P + w) = (1/I) sum_i F~_i phi_i(P + w) for every row's prefix P and every term w of V~.

    ``noisy_sums``: (R, I) the sketch of each row's class; ``prefixes``: (R, l) with l < blocks (the
    remaining blocks are zero padding). With a = phase of P and c = phase of w in block l + 1,
    cos(a + c) = cos a cos c - sin a sin c, so all R x V scores are one (R x 2I) @ (2I x V) product.
    Phases are accumulated in float64 (they are sums of up to L table entries plus the offset); the
    product runs in the tables' dtype. Returns (R, V) in the tables' dtype.
    """
    position = prefixes.shape[1]
    if position >= sketch.blocks:
        raise ConfigError(f"prefix of length {position} leaves no block for the next term in a "
                          f"{sketch.blocks}-block sketch")
    dtype = sketch.tables.dtype
    a = sketch.prefix_phases(prefixes).to(dtype)  # (R, I), summed in float64
    f = noisy_sums.to(dtype)
    left = torch.cat([f * torch.cos(a), -f * torch.sin(a)], dim=1)  # (R, 2I)
    c = sketch.tables[position]  # (V, I)
    right = torch.cat([torch.cos(c), torch.sin(c)], dim=1)  # (V, 2I)
    return (left @ right.T) * (SQRT2 / sketch.tables.shape[2])


def naive_scores(features: RffFeatures, noisy_sum: np.ndarray, embeddings: np.ndarray,
                 prefixes: np.ndarray) -> np.ndarray:
    """Reference scorer: builds every zero-padded d*B query vector [P; w; 0...] and projects it in full.

    (B, l) prefixes -> (B, V) scores. O(B * V * d * blocks * I): for tests and the benchmark only.
    """
    vocab, dim = embeddings.shape
    out = np.empty((prefixes.shape[0], vocab))
    position = prefixes.shape[1]
    for r, prefix in enumerate(prefixes):
        queries = np.zeros((vocab, features.blocks, dim))
        for j, t in enumerate(prefix):
            queries[:, j, :] = embeddings[t]
        queries[:, position, :] = embeddings
        out[r] = features.features(queries) @ noisy_sum / features.n_features
    return out


# ---------------------------------------------------------------------------------------------
# Samplers
# ---------------------------------------------------------------------------------------------

def sample_sequences(
    method: str,
    sketches: Sequence[SketchTables],
    noisy_sums: np.ndarray,
    *,
    per_class: int,
    length: int,
    rule: SelectionRule,
    rng: np.random.Generator,
) -> np.ndarray:
    """Draw ``per_class`` sequences of ``length`` V~ term ids for every class.

    ``noisy_sums``: (classes, sketches, I) released sums, one per class and sketch of the ensemble
    (``ensemble_blocks(method, length)`` gives the blocks of each). Returns (classes, per_class, length) int64.
    All classes are scored in one batch per step (the tables are shared; only F~ differs per row).
    """
    blocks = ensemble_blocks(method, length)
    if len(sketches) != len(blocks) or noisy_sums.shape[1] != len(blocks):
        raise ConfigError(f"method {method} needs {len(blocks)} sketches, got {len(sketches)} / {noisy_sums.shape[1]}")
    for sk, b in zip(sketches, blocks):
        if sk.blocks != b:
            raise ConfigError(f"sketch has {sk.blocks} blocks where the {method} ensemble needs {b}")
    n_classes = noisy_sums.shape[0]
    device = sketches[0].tables.device
    sums = torch.as_tensor(noisy_sums, dtype=torch.float64, device=device)

    if method == "independent":
        empty = torch.zeros((n_classes, 0), dtype=torch.long, device=device)
        scores = fast_scores(sketches[0], sums[:, 0], empty).cpu().numpy().astype(np.float64)  # (classes, V)
        weights = rule.weights(scores)
        out = np.empty((n_classes, per_class, length), dtype=np.int64)
        for c in range(n_classes):
            p = weights[c] / weights[c].sum()
            out[c] = rng.choice(p.shape[0], size=(per_class, length), p=p)
        return out

    rows = n_classes * per_class
    row_class = torch.arange(n_classes, device=device).repeat_interleave(per_class)
    chosen = torch.zeros((rows, 0), dtype=torch.long, device=device)
    for step in range(1, length + 1):
        k = sketch_for_step(blocks, step)
        # Rows with the same class and prefix have the same scores: score each distinct prefix once
        # (all rows share the empty prefix at step 1, and top-K keeps early steps to few prefixes).
        keys = torch.cat([row_class[:, None], chosen], dim=1)
        distinct, inverse = torch.unique(keys, dim=0, return_inverse=True)
        prefix_scores = fast_scores(sketches[k], sums[distinct[:, 0], k], distinct[:, 1:])
        nxt = rule.draw(prefix_scores, rng, rows=inverse)
        chosen = torch.cat([chosen, torch.as_tensor(nxt, device=device)[:, None]], dim=1)
    return chosen.cpu().numpy().reshape(n_classes, per_class, length)
