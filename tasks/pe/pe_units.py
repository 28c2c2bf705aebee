"""Aug-PE's and SecPE's private work, one work unit at a time, on the Dask workers.

Each function here receives a work unit (``privseed.tasks.data.units``: a shard URI and some of its Parquet row groups)
and
small public arguments, reads the unit's private documents from storage on the worker, embeds them there and
returns only a part of a statistic that adds up across units: Aug-PE's per-candidate vote counts, SecPE's
per-(class, cluster) counts and sums of sampled points, SecPE's secret incidence. The parts are summed on the
cluster (``privseed.tasks.data.units.map_reduce_units``) before the noise is drawn once through the ledger, so neither
the
driver nor the scheduler ever holds a private document or its embedding.

Embeddings of a unit are kept in the worker process's memory for the run (``unit_embeddings``): a module
variable, never a Dask result (Dask may spill results to disk) and never a Prefect result; the flow forgets
them on every worker when the run ends (``forget_run``). A worker that has not seen the unit, or is over
``CACHE_BYTES``, embeds it again.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import sparse

from privseed.tasks.pe import evolution as ev
from privseed.tasks.dp.mechanisms import NoiseSource
from privseed.tasks.data.units import WorkUnit, read_unit

#: Embeddings one worker process keeps between rounds (float32, 1.5 KB per document with MiniLM); units beyond
#: it are embedded again in every round.
CACHE_BYTES = 2 * 2**30


@dataclass(frozen=True)
class PrivateUnits:
    """The private corpus as work units, and what a worker needs to read and embed one: URIs, column names and
    public settings, never a row. ``run`` is random and names this run's entries in the workers' caches."""

    units: tuple[WorkUnit, ...]
    text_column: str
    label_column: str
    storage_options: dict[str, Any]
    model: str
    labels: tuple[str, ...]
    run: str


_cache: dict[tuple[str, str, tuple[int, ...]], tuple[np.ndarray, np.ndarray]] = {}
_cache_lock = threading.Lock()


def unit_embeddings(unit: WorkUnit, spec: PrivateUnits) -> tuple[np.ndarray, np.ndarray]:
    """The unit's documents embedded (float32, unit rows) and their class indices in ``spec.labels``, read in
    record batches; from this process's cache when this run embedded the unit here before."""
    from privseed.tasks.data.embedding import embed_texts

    key = (spec.run, unit.uri, unit.row_groups)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    vectors, classes = [], []
    for batch in read_unit(unit, spec.text_column, spec.label_column, spec.storage_options):
        vectors.append(embed_texts(batch["text"].tolist(), spec.model))
        classes.append(ev.class_index(spec.labels, batch["label"]))
    embedded = (np.concatenate(vectors), np.concatenate(classes))
    with _cache_lock:
        if sum(e.nbytes for e, _ in _cache.values()) + embedded[0].nbytes <= CACHE_BYTES:
            _cache[key] = embedded
    return embedded


def forget_run(run: str) -> int:
    """Drop this process's cached embeddings of run ``run``; returns how many units were dropped."""
    with _cache_lock:
        keys = [k for k in _cache if k[0] == run]
        for k in keys:
            del _cache[k]
    return len(keys)


def unit_class_votes(unit: WorkUnit, spec: PrivateUnits, candidate_emb: np.ndarray,
                     voting_class: np.ndarray) -> np.ndarray:
    """Aug-PE's exact votes of the unit's documents (``ev.class_votes``: each votes once, for its nearest
    candidate of its class). Counts over disjoint units add up to the corpus's."""
    embeddings, classes = unit_embeddings(unit, spec)
    return ev.class_votes(embeddings, classes, candidate_emb, voting_class)


@dataclass(frozen=True)
class SampledUnit:
    """One unit of a SecPE round: its documents' sampling probabilities rho (private, in row order) and the
    noise source of its Bernoulli mask."""

    unit: WorkUnit
    rho: np.ndarray
    sampling: NoiseSource

    def __repr__(self) -> str:  # logged when a read is retried: the shard, never rho
        return repr(self.unit)


def unit_cluster_sums(item: SampledUnit, spec: PrivateUnits, clusters: ev.PublicClusters,
                      radius: float) -> ev.ClusterSums:
    """SecPE's exact per-(class, cluster) counts and sums of the unit's sampled documents: each joins with
    probability rho_i (the mask is drawn here and never leaves the worker), is clipped to R and joins its nearest
    public centre."""
    embeddings, classes = unit_embeddings(item.unit, spec)
    if item.rho.shape != (embeddings.shape[0],):
        raise ValueError("the unit's rows changed between secret detection and a round")
    sampled = item.sampling.bernoulli(item.rho)
    return ev.cluster_sums(clusters, embeddings, classes, sampled, radius=radius, classes=len(spec.labels))


@dataclass(frozen=True)
class SecretDetector:
    """Which secrets SecPE protects: ``kind`` "words" or "file" with the public ``terms`` (one column each), or
    "pii" (a column per distinct detected value). PII values leave a unit only as HMAC digests under ``key``, a
    random key of the run that stays in memory."""

    kind: str
    terms: tuple[str, ...] = ()
    key: bytes = b""

    def incidence(self, texts: Sequence[str]) -> tuple[sparse.csr_matrix, list[str] | None]:
        """(documents x secrets) incidence of ``texts``; for PII also the digests of its (local) columns."""
        if self.kind == "words":
            return ev.word_secret_incidence(texts, self.terms), None
        if self.kind == "file":
            return ev.file_secret_incidence(texts, self.terms), None
        incidence, keys = ev.incidence_from_keys(ev.pii_secret_keys(texts))
        return incidence, [hmac.new(self.key, k.encode(), hashlib.sha256).hexdigest() for k in keys]


def unit_secret_incidence(unit: WorkUnit, spec: PrivateUnits, detector: SecretDetector
                          ) -> list[tuple[sparse.csr_matrix, list[str] | None]]:
    """The unit's secret incidence (rows in the unit's row order), as a list of one part: the units' lists
    concatenate in unit order on the cluster (``map_reduce_units``) into what ``stack_incidence`` takes."""
    texts = [text for batch in read_unit(unit, spec.text_column, spec.label_column, spec.storage_options)
             for text in batch["text"]]
    return [detector.incidence(texts)]


def stack_incidence(parts: Sequence[tuple[sparse.csr_matrix, list[str] | None]]) -> sparse.csr_matrix:
    """The corpus's incidence from its units' parts, in unit order. Parts with column digests (PII) are mapped
    to one column per distinct digest, in the order first seen (the order one pass over the corpus would give)."""
    if all(keys is None for _, keys in parts):
        return sparse.vstack([part for part, _ in parts], format="csr")
    columns: dict[str, int] = {}
    blocks = []
    for part, keys in parts:
        mapping = np.array([columns.setdefault(k, len(columns)) for k in keys or []], dtype=np.int64)
        coo = part.tocoo()
        blocks.append((coo.row, mapping[coo.col] if coo.nnz else coo.col, part.shape[0]))
    rows, cols, offset = [], [], 0
    for r, c, n in blocks:
        rows.append(r + offset)
        cols.append(c)
        offset += n
    row, col = np.concatenate(rows), np.concatenate(cols)
    return sparse.csr_matrix((np.ones(row.size), (row, col)), shape=(offset, len(columns)))
