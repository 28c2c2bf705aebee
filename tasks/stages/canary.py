"""The stages of the whole-pipeline canary test (`privseed audit-release`; the math is in tasks/evaluation/canary.py).

plant canaries (read the owner's corpus, keep a sample per class, add the inserted canaries, write the copy to
the audit's temporary folder) -> [the method's own flow on the copy] -> judge the release -> write the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from privseed.tasks.evaluation import canary
from privseed.tasks import jsonable, storage
from privseed.tasks.config.commands import CanaryAuditConfig
from privseed.tasks.dp.ledger import public_rng
from privseed.tasks.stages import private_stage, public_stage, stage_logger
from privseed.tasks.seeds.vocabulary import load_vocabulary, tokenize


@dataclass(frozen=True)
class PlantedCorpus:
    path: str  # the corpus with the inserted canaries (the audit's private copy)
    canaries: tuple[canary.Canary, ...]
    documents: int  # real documents kept
    vocabulary_size: int


def sample_per_label(frame: pd.DataFrame, labels: Sequence[str], per_label: int | None,
                     rng: np.random.Generator) -> pd.DataFrame:
    """At most ``per_label`` rows of every declared label (all rows when None), drawn with ``rng``."""
    keep = []
    as_text = frame["label"].astype(str)
    for label in labels:
        rows = np.flatnonzero((as_text == label).to_numpy())
        if per_label is not None and rows.size > per_label:
            rows = np.sort(rng.choice(rows, size=per_label, replace=False))
        keep.append(rows)
    return frame.iloc[np.concatenate(keep) if keep else []].reset_index(drop=True)


def canary_prefixes(frame: pd.DataFrame, labels: Sequence[str], pairs: int, words: int,
                    rng: np.random.Generator) -> dict[str, list[tuple[str, ...]]]:
    """Per label, ``pairs`` prefixes: the first ``words`` words of documents of the label drawn with ``rng``."""
    prefixes: dict[str, list[tuple[str, ...]]] = {}
    as_text = frame["label"].astype(str)
    for label in labels:
        texts = frame.loc[as_text == label, "text"].tolist()
        texts = [t for t in texts if isinstance(t, str) and t.split()]
        chosen = rng.choice(len(texts), size=min(pairs, len(texts)), replace=False).tolist() if texts else []
        prefixes[label] = [tuple(texts[i].split()[:words]) for i in chosen]
    return prefixes


def plant(frame: pd.DataFrame, cfg: CanaryAuditConfig, vocabulary_terms: Sequence[str]) -> tuple[pd.DataFrame,
                                                                                                   list[canary.Canary]]:
    """The sampled corpus with the inserted canaries appended (columns text, label; labels keep their type), and
    every canary. Public randomness (``--seed``) draws the sample, the prefixes, the secrets and the split."""
    labels = [str(label) for label in cfg.labels or []]
    sample = sample_per_label(frame, labels, cfg.sample_per_class, public_rng(cfg.seed, "canary", "sample"))
    prefixes = canary_prefixes(sample, labels, cfg.canary_pairs, cfg.prefix_words,
                               public_rng(cfg.seed, "canary", "prefixes"))
    corpus_words = {t for text in sample["text"].dropna() for t in tokenize(str(text))}
    candidates = canary.secret_candidates(vocabulary_terms, exclude=corpus_words)
    canaries = canary.make_canaries(prefixes, candidates, cfg.canary_pairs, cfg.secret_words,
                                    public_rng(cfg.seed, "canary", "secrets"))
    label_value = {str(v): v for v in sample["label"].unique()}
    rows = pd.DataFrame([(text, label_value[label]) for text, label in canary.canary_rows(canaries, cfg.repetitions)],
                        columns=["text", "label"])
    planted = pd.concat([sample, rows.astype({"label": sample["label"].dtype})], ignore_index=True)
    return planted, canaries


@private_stage("plant-canaries")
def plant_canaries(cfg: CanaryAuditConfig, work: str) -> PlantedCorpus:
    """Read the owner's corpus, keep a sample per class, add the inserted canaries, write the copy under ``work``."""
    frame = pd.read_parquet(cfg.data, columns=[cfg.text_column, cfg.label_column],
                            storage_options=storage.resolve_storage_options(cfg.data, cfg.storage_options) or None)
    frame = frame.rename(columns={cfg.text_column: "text", cfg.label_column: "label"})
    vocabulary = load_vocabulary(cfg.vocab, cfg.vocab_top or 50_000) if cfg.vocab == "english" else \
        load_vocabulary(cfg.vocab)
    planted, canaries = plant(frame, cfg, vocabulary.terms)
    path = str(Path(work) / "corpus-with-canaries.parquet")
    planted.to_parquet(path, index=False)
    inserted = sum(c.inserted for c in canaries)
    stage_logger().info("canary test: %d canaries inserted %d times each, %d held out, in %d classes",
                        inserted, cfg.repetitions, len(canaries) - inserted, len({c.label for c in canaries}))
    return PlantedCorpus(path, tuple(canaries), len(planted) - inserted * cfg.repetitions, len(vocabulary))


#: The columns of a release that hold released text.
RELEASED_TEXT_COLUMNS = ("text", "keyphrases")


def released_texts(synthetic: pd.DataFrame) -> list[str]:
    """Every released text of the synthetic corpus: the documents and, where present, the seeds (in their order)."""
    texts: list[str] = []
    for column in RELEASED_TEXT_COLUMNS:
        if column not in synthetic:
            continue
        for value in synthetic[column]:
            if isinstance(value, str):
                texts.append(value)
            elif value is not None and not (isinstance(value, float) and np.isnan(value)):
                texts.append(" ".join(str(v) for v in value))
    return texts


@public_stage("judge-canaries")
def judge_canaries(planted: PlantedCorpus, release: str, cfg: CanaryAuditConfig) -> canary.CanaryVerdict:
    """Score every canary against the released text of ``release`` and test inserted against held out."""
    synthetic = pd.read_parquet(storage.join(release, "synthetic"))
    return canary.judge_release(planted.canaries, released_texts(synthetic), planted.vocabulary_size,
                                public_rng(cfg.seed, "canary", "permutations"), alpha=cfg.alpha)


def report_document(verdict: canary.CanaryVerdict, manifest: Mapping[str, Any], meta: Mapping[str, Any]) -> dict:
    """canary-audit.json: the verdict, the release's privacy claim and rows, and every canary with its scores."""
    return {**meta, **verdict.summary(), "sentence": verdict.sentence(),
            "release": {"rows": manifest.get("rows"), "privacy": manifest.get("privacy")},
            "canaries": [{"label": e.canary.label, "inserted": e.canary.inserted, "text": e.canary.text,
                          "secret_words_released": e.secret_words_released,
                          "longest_verbatim": e.longest_verbatim, "score": round(e.score, 4)}
                         for e in verdict.exposures]}


def plot_canaries(verdict: canary.CanaryVerdict, path: str, title: str) -> None:
    """Membership scores of inserted and held-out canaries (strip plot), the verdict in the title (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    jitter = public_rng(0, "canary", "plot")
    for row, (inserted, color) in enumerate(((False, "#4c72b0"), (True, "#c44e52"))):
        scores = [e.score for e in verdict.group(inserted)]
        ax.scatter(scores, row + jitter.uniform(-0.15, 0.15, len(scores)), s=18, color=color, alpha=0.8)
    ax.set_yticks([0, 1], ["held out", "inserted"])
    ax.set_xlabel("membership score: log P(secret) under the release's bigram model")
    s = verdict.summary()
    ax.set_title(f"{title}\n{s['verdict']}: AUC {s['auc']:.2f}, p = {s['p_value']:.2g}", fontsize=9,
                 color="#c44e52" if verdict.exposed else "#333333")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: The canary test's report with every canary's text (a real document's first words): the private state's.
REPORT_JSON = "canary-audit.json"
#: The plot of the scores (no text): the owner's --out.
REPORT_PLOT = "canary-audit.png"


@public_stage("write-canary-report")
def write_canary_report(verdict: canary.CanaryVerdict, manifest: Mapping[str, Any], cfg: CanaryAuditConfig,
                        meta: Mapping[str, Any]) -> dict[str, str]:
    """canary-audit.json into the private state (``cfg.state_uri``, ``OUT.private`` beside ``--out``): it holds the
    canaries, whose prefixes are the first words of private documents, and the number of real documents kept, so
    it never goes into ``--out``, which may be a folder the owner shares (a release folder, even). canary-audit.png
    (the scores and the verdict, no text) into ``--out``."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    document = report_document(verdict, manifest, meta)
    json_uri, plot_path = storage.join(cfg.state_uri, REPORT_JSON), out / REPORT_PLOT
    storage.write_bytes(json_uri, (jsonable.dumps(document, indent=2, sort_keys=True) + "\n").encode())
    epsilon = (manifest.get("privacy") or {}).get("epsilon")
    plot_canaries(verdict, str(plot_path), f"privseed audit-release: {cfg.method}, epsilon {epsilon:g}, "
                  f"llm {cfg.llm}, {cfg.repetitions} repetitions" if epsilon is not None else "privseed audit-release")
    return {"json": json_uri, "plot": str(plot_path)}
