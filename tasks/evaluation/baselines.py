"""The experiment's two reference points that release no DP seeds: ``real`` (the same classifier trained on as
many real private documents) and ``only-llm`` (the paper's Appendix C.2.3 ablation: unseeded prompts that name the
class, so no private data reaches the LLM)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from privseed.tasks.errors import ConfigError
from privseed.tasks.evaluation.experiment import DatasetSpec, PreparedData, balanced_sample, declared_labels

#: The packaged unseeded prompt template of the only-LLM baseline (tasks/llm/prompts/only_llm.yaml).
ONLY_LLM_TEMPLATE = "only_llm"


def real_baseline(data: PreparedData, per_class: int, seed: int) -> pd.DataFrame:
    """The same classifier trained on as many real documents (drawn from the private split)."""
    sample = balanced_sample(data.private, per_class, np.random.default_rng(seed))
    return sample.assign(keyphrases=[[] for _ in range(len(sample))]).reset_index(drop=True)


def only_llm_label_names(ds: DatasetSpec, data: PreparedData) -> dict[str, str]:
    """The topics of only-LLM's prompts: the dataset's public class-names file when it has one (the same names
    DP-KPS gets with class names, so the two compare fairly), else the benchmark's label names."""
    if ds.class_names:
        from privseed.tasks.llm.released import load_class_names

        names = load_class_names(ds.class_names)
        names.check_labels(declared_labels(ds))  # the declared set: configuration, never read from the data
        return names.to_dict()
    return data.label_names


def only_llm_corpus(llm: str, doc_type: str, label_names: Mapping[str, str], labels: Sequence[Any], per_class: int,
                    seed: int, cache_uri: str, max_tokens: int = 160, temperature: float = 1.0, *,
                    max_regenerations: int | None = None, max_rewrites: int | None = None,
                    llm_concurrency: int | None = None, llm_secret: str | None = None,
                    storage_options: dict | None = None, progress: bool = False) -> pd.DataFrame:
    """Unseeded prompts to the LLM: per_class documents per class, no private data involved at all.

    The prompt is the packaged ``only_llm`` template naming each class by ``label_names`` (public: the dataset's
    class-names file or the benchmark's label names; a label without a name is named by itself). Calls go through
    privseed.tasks.generation.drivers's one path to a backend (concurrency, the API key's Secret block, the call cache
    under
    ``cache_uri``, whose folder also keeps Anthropic's batch state), so a re-run sends only the calls that never
    finished. Call seeds come from the public ``public_rng(seed, "only-llm")``. Answers are cleaned, judged and
    regenerated like a DP-KPS release's (``generate_unseeded``): rows that are still not documents after the
    regeneration rounds (``max_regenerations``, default GenerationParams') are dropped, so both arms of the
    comparison are scored on documents only; ``max_rewrites`` rounds ask again for a repetitive document."""
    from privseed.tasks.generation.drivers import generate_unseeded
    from privseed.tasks.generation.params import GenerationParams
    from privseed.tasks.llm.service import llm_spec
    from privseed.tasks.dp.ledger import public_rng
    from privseed.tasks.llm.released import PublicClassNames

    if llm == "none":
        raise ConfigError("the only-llm method needs an LLM (--llm local or anthropic:MODEL)")
    names = PublicClassNames(tuple((str(label), str(label_names.get(str(label), label))) for label in labels),
                             source="the experiment's label names")
    params = GenerationParams(doc_type=doc_type, template=ONLY_LLM_TEMPLATE, max_tokens=max_tokens,
                              temperature=temperature, class_names=names)
    if max_regenerations is not None:
        params = dataclasses.replace(params, max_regenerations=max_regenerations)
    if max_rewrites is not None:
        params = dataclasses.replace(params, max_rewrites=max_rewrites)
    spec = llm_spec(llm, state_uri=cache_uri, storage_options=storage_options, llm_concurrency=llm_concurrency,
                    llm_secret=llm_secret)
    call_seeds = public_rng(seed, "only-llm").integers(0, 2**31 - 1, size=len(labels) * per_class)
    return generate_unseeded(labels, per_class, spec, params, cache_uri, call_seeds.tolist(), storage_options,
                             progress)
