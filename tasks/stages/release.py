"""Stages that turn released seeds into the synthetic corpus without an LLM, and publish the release."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import pandas as pd

from privseed.tasks.config.commands import DpKpsConfig, ReleaseConfig
from privseed.tasks.data.corpus import StagedRelease
from privseed.tasks.dp.ledger import PrivacyLedger
from privseed.tasks.llm.released import PublicClassNames, load_class_names
from privseed.tasks.stages import public_stage

if TYPE_CHECKING:
    from privseed.tasks.quality import ReleaseGate


def class_names_from_config(cfg: ReleaseConfig) -> PublicClassNames | None:
    """The owner's public class names (``--class-names FILE``), checked against the declared labels when the
    config declares them (a flow that has none takes the file's labels as the declared set); None when unset."""
    path = getattr(cfg, "class_names", None)
    if not path:
        return None
    names = load_class_names(path, cfg.storage_options)
    if cfg.labels is not None:
        names.check_labels(cfg.labels)
    return names


def gate_from_config(cfg: ReleaseConfig, labels: Sequence[Any]) -> ReleaseGate | None:
    """The release gate a run's configuration asks for (``--no-gate``: None), for the declared ``labels``, with its
    document test (``--language``, ``--document-rule``, and the public class names the prompts named, which a
    document must not open with as its subject: ``--class-names``)."""
    if not cfg.gate:
        return None
    from privseed.tasks.quality import document_gate  # Great Expectations: seconds to import, only when asked

    names = class_names_from_config(cfg) if cfg.llm != "none" else None
    return document_gate(labels, llm_used=cfg.llm != "none", language=cfg.language,
                         document_rules=cfg.document_rules, class_names=names.to_dict() if names else None)


@public_stage("render-without-llm")
def render_without_llm(sequences: pd.DataFrame) -> pd.DataFrame:
    """The paper's no-LLM ablation: the released keyphrases joined by single spaces are the document."""
    synthetic = sequences.copy()
    synthetic["text"] = synthetic["keyphrases"].map(lambda phrases: " ".join(phrases))
    first = ["text", "label", "keyphrases"]
    return synthetic[[*first, *[c for c in synthetic.columns if c not in first]]]


@public_stage("publish-release", retries=2)
def publish(cfg: DpKpsConfig, synthetic: pd.DataFrame | StagedRelease, ledger: PrivacyLedger, labels: list,
            class_names: dict[str, str] | None = None, generation_report: dict | None = None) -> dict:
    """Gate and publish (``privseed.tasks.data.corpus.publish_release``: atomically, the manifest last) a frame, or the
    parts
    the generation shards wrote. ``generation_report`` (counts of synthetic rows and candidates from
    privseed.tasks.generation.rows.split_documents) goes into quality.json beside the gate's result."""
    from privseed.tasks.data.corpus import publish_release
    from privseed.tasks.generation.examples import answer_openings, answers_open_with_subject, prompt_examples
    from privseed.tasks.llm import kind_of
    config = cfg.public_dict()
    # The manifest says whether prompts named the classes, and with which public names.
    config["prompt_class_names"] = class_names if cfg.llm != "none" else None
    # ... and which examples they showed: the owner's --few-shot, the example library's kind, or none.
    config["prompt_examples"] = prompt_examples(cfg.few_shot, cfg.examples, kind_of(cfg.llm).shows_examples,
                                                cfg.doc_type) if kind_of(cfg.llm).writes_text else None
    # ... and the public words their answers opened with (the library kind's openings), if any.
    config["answer_openings"] = list(answer_openings(cfg.few_shot, cfg.examples, kind_of(cfg.llm).prefill,
                                                     cfg.doc_type))
    # ... or whether they opened with their subject, a word of their seed that reads as its class (news).
    config["answer_opens_with_subject"] = answers_open_with_subject(cfg.few_shot, cfg.examples,
                                                                    kind_of(cfg.llm).prefill, cfg.doc_type)
    return publish_release(cfg.out, synthetic, ledger=ledger, config=config, gate=gate_from_config(cfg, labels),
                           quality_extra={"generation": generation_report} if generation_report else None,
                           storage_options=cfg.storage_options, allow_insecure=cfg.allow_insecure_release,
                           class_names=class_names)
