"""report.html for one evaluated release and for an experiment grid.

Pure rendering: dicts/arrays in, one self-contained HTML string out (figures are inline base64 PNGs,
no external CSS, JS or fonts, so the file reads offline and can be mailed). Only released values
(synthetic documents, their seeds, the ledger, the manifest) and the client's own aggregate scores
appear in a report; no private document and no client test document is ever printed.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: reports render on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from numpy.typing import ArrayLike  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from privseed.tasks import jsonable  # noqa: E402
from privseed.tasks.generation.examples import envelope_warning  # noqa: E402
from privseed.tasks.llm import parse_llm_spec  # noqa: E402
from privseed.tasks.seeds.seed_methods import SEED_METHODS  # noqa: E402

REAL_COLOR = "#1f77b4"
SYNTHETIC_COLOR = "#d62728"
#: A method keeps its colour in every figure: the seed methods' from their registry, the baselines' and PE's here.
FIXED_METHOD_COLORS = {**{name: method.color for name, method in SEED_METHODS.items()}, "real": "#222222",
                       "only-llm": "#ff7f0e", "augpe": "#2ca02c", "augpe+v": "#17becf", "secpe": "#8c564b"}
METHOD_COLORS = ["#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"]

RUN_SECTIONS = ("summary", "scores", "figures", "corpus", "usage", "ledger", "config", "examples")
EXPERIMENT_SECTIONS = ("summary", "table", "figures", "paper", "cells", "config")

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#222}
h1{font-size:1.6em;margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3} td.num{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#666;font-size:.9em} img{max-width:100%;height:auto;border:1px solid #eee;margin:.4em 0}
pre{background:#f7f7f7;padding:.8em;overflow-x:auto;font-size:.82em;max-height:32em}
.seed{font-family:monospace;font-size:.88em;color:#555} .grid{display:flex;flex-wrap:wrap;gap:1em}
.grid figure{margin:0;flex:1 1 480px} figcaption{font-size:.88em;color:#555}
"""


# ---------------------------------------------------------------- figures
def figure_to_data_uri(fig: Figure, dpi: int = 110) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def project_2d(real: np.ndarray, synthetic: np.ndarray, *, method: str = "tsne", seed: int = 0,
               max_points: int = 600) -> tuple[np.ndarray, np.ndarray]:
    """2-D coordinates of (a seeded subsample of) real and synthetic embeddings, jointly projected."""
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    rng = np.random.default_rng(seed)
    r = real[rng.permutation(len(real))[:max_points]] if len(real) > max_points else real
    s = synthetic[rng.permutation(len(synthetic))[:max_points]] if len(synthetic) > max_points else synthetic
    both = np.vstack([r, s]).astype(np.float64)
    if method == "tsne" and len(both) > 10:
        perplexity = float(min(30.0, max(5.0, (len(both) - 1) / 4)))
        xy = TSNE(n_components=2, init="pca", perplexity=perplexity, random_state=seed).fit_transform(both)
    else:
        xy = PCA(n_components=2, random_state=seed).fit_transform(both)
    return xy[: len(r)], xy[len(r):]


def plot_embedding_map(real_xy: np.ndarray, synthetic_xy: np.ndarray, *, method: str,
                       synthetic_name: str = "synthetic") -> Figure:
    fig, ax = plt.subplots(figsize=(6.2, 5.2))
    ax.scatter(real_xy[:, 0], real_xy[:, 1], s=9, alpha=0.55, c=REAL_COLOR, label=f"real test ({len(real_xy)})",
               edgecolors="none")
    ax.scatter(synthetic_xy[:, 0], synthetic_xy[:, 1], s=9, alpha=0.55, c=SYNTHETIC_COLOR,
               label=f"{synthetic_name} ({len(synthetic_xy)})", edgecolors="none", marker="^")
    ax.set_title(f"Real vs synthetic sentence embeddings ({'t-SNE' if method == 'tsne' else 'PCA'})")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.legend(loc="best", frameon=True, markerscale=2)
    fig.tight_layout()
    return fig


def plot_length_histograms(real_lengths: ArrayLike, synthetic_lengths: ArrayLike, *,
                           real_label: str = "real test") -> Figure:
    real_lengths = np.asarray(real_lengths)
    synthetic_lengths = np.asarray(synthetic_lengths)
    hi = int(max(np.percentile(real_lengths, 99) if len(real_lengths) else 1,
                 np.percentile(synthetic_lengths, 99) if len(synthetic_lengths) else 1, 10))
    bins = np.linspace(0, hi, min(40, hi) + 1).tolist()
    fig, ax = plt.subplots(figsize=(6.2, 4.0))
    ax.hist(real_lengths, bins=bins, alpha=0.55, color=REAL_COLOR, density=True,
            label=f"{real_label} (median {np.median(real_lengths):.0f})")
    ax.hist(synthetic_lengths, bins=bins, alpha=0.55, color=SYNTHETIC_COLOR, density=True,
            label=f"synthetic (median {np.median(synthetic_lengths):.0f})")
    ax.set_xlabel("words per document")
    ax.set_ylabel("share of documents")
    ax.set_title("Document length")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_confusion(matrix: np.ndarray, label_names: Sequence[str], *, title: str) -> Figure:
    """Row-normalized confusion matrix (rows: true class, columns: predicted class), counts annotated."""
    matrix = np.asarray(matrix, dtype=np.float64)
    rows = matrix.sum(axis=1, keepdims=True)
    share = np.divide(matrix, rows, out=np.zeros_like(matrix), where=rows > 0)
    n = len(label_names)
    size = max(4.5, 0.45 * n + 2.5)
    fig, ax = plt.subplots(figsize=(size + 1.0, size))
    im = ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xticklabels(label_names, rotation=60, ha="right", fontsize=8)
    ax.set_yticklabels(label_names, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    for i in range(n):
        for j in range(n):
            if matrix[i, j] > 0:
                ax.text(j, i, f"{int(matrix[i, j])}", ha="center", va="center", fontsize=6.5,
                        color="white" if share[i, j] > 0.55 else "#333")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
    fig.tight_layout()
    return fig


def plot_training_curve(history: Sequence[Mapping[str, float]], *, title: str) -> Figure:
    fig, ax = plt.subplots(figsize=(6.2, 3.6))
    epochs = [h["epoch"] for h in history]
    ax.plot(epochs, [h["train_loss"] for h in history], color="#555", label="train loss (synthetic)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    if history and "val_accuracy" in history[0]:
        ax2 = ax.twinx()
        ax2.plot(epochs, [h["val_accuracy"] for h in history], color=SYNTHETIC_COLOR,
                 label="validation accuracy (synthetic split)")
        ax2.set_ylabel("accuracy")
        ax2.set_ylim(0, 1.02)
        lines = ax.get_lines() + ax2.get_lines()
        ax.legend(lines, [str(ln.get_label()) for ln in lines], loc="center right", fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def plot_accuracy_vs_epsilon(table: pd.DataFrame, paper: pd.DataFrame | None = None, *,
                             metric: str = "accuracy", title: str = "") -> Figure:
    """One line per method: mean over seeds with a +-1 sd band; the paper's numbers as hollow markers.

    table columns: method, eps_total, <metric>_mean, <metric>_std (rows without eps, e.g. 'real', become
    horizontal reference lines). paper columns: label, eps_total, accuracy (percent).
    """
    fig, ax = plt.subplots(figsize=(7.0, 4.6))
    methods = list(dict.fromkeys(table["method"]))
    for k, method in enumerate(methods):
        rows = table[table["method"] == method].sort_values("eps_total")
        color = FIXED_METHOD_COLORS.get(method, METHOD_COLORS[k % len(METHOD_COLORS)])
        mean = rows[f"{metric}_mean"].to_numpy(dtype=float) * 100
        std = rows[f"{metric}_std"].fillna(0).to_numpy(dtype=float) * 100
        eps = rows["eps_total"].to_numpy(dtype=float)
        if np.isnan(eps).all():
            ax.axhline(mean[0], color=color, ls=":", lw=1.5, label=f"{method} ({mean[0]:.1f}%)")
            continue
        ax.errorbar(eps, mean, yerr=std, color=color, marker="o", capsize=3, lw=1.8, label=f"{method} (ours)")
    if paper is not None and len(paper):
        for label, rows in paper.groupby("label", sort=False):
            rows = rows.sort_values("eps_total")
            eps = rows["eps_total"].to_numpy(dtype=float)
            if np.isnan(eps).all():
                ax.axhline(float(rows["accuracy"].iloc[0]), color="#999", ls="--", lw=1,
                           label=f"paper: {label} ({float(rows['accuracy'].iloc[0]):.1f}%)")
                continue
            ax.plot(eps, rows["accuracy"], ls="--", marker="s", mfc="none", color="#777", lw=1, alpha=0.8,
                    label=f"paper: {label}")
    if {"eps_voc", "eps_kde"} <= set(table.columns):
        ticks = table.dropna(subset=["eps_total"]).drop_duplicates("eps_total").sort_values("eps_total")
        if len(ticks):
            ax.set_xticks(ticks["eps_total"].to_numpy(dtype=float))
            ax.set_xticklabels([f"{t:g}\n({v:g}+{k:g})" for t, v, k in
                                ticks[["eps_total", "eps_voc", "eps_kde"]].itertuples(index=False)])
    ax.set_xlabel("total epsilon (eps_voc + eps_kde)")
    ax.set_ylabel(f"{metric.replace('_', ' ')} on the real test set (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(title or f"{metric} vs privacy budget")
    ax.legend(fontsize=7.5, loc="lower right", ncol=1)
    fig.tight_layout()
    return fig


def plot_method_comparison(table: pd.DataFrame, *, metric: str = "accuracy", chance: float | None = None,
                           title: str = "") -> Figure:
    """One bar per (method, budget): mean over seeds with a +-1 sd whisker, each seed's value as a dot when the
    table carries them, and the LLM calls spent under the bar: the side-by-side view of Table 2.

    table columns: method, eps_voc, eps_kde, <metric>_mean, <metric>_std, llm_calls, seeds; optional
    `values` (list of per-seed values)."""
    rows = table.reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 2), 4.6))
    labels = []
    for k, r in rows.iterrows():
        color = FIXED_METHOD_COLORS.get(r["method"], METHOD_COLORS[k % len(METHOD_COLORS)])
        mean, std = 100 * float(r[f"{metric}_mean"]), 100 * float(np.nan_to_num(r[f"{metric}_std"]))
        ax.bar(k, mean, yerr=std, color=color, alpha=0.85, capsize=4, width=0.7)
        ax.text(k, mean + std + 1.5, f"{mean:.1f}", ha="center", fontsize=8)
        values = r.get("values")
        if isinstance(values, (list, tuple, np.ndarray)) and len(values) > 1:
            ax.scatter(np.full(len(values), k) + np.linspace(-0.15, 0.15, len(values)), 100 * np.asarray(values),
                       s=12, color="black", zorder=3)
        budget = "" if np.isnan(float(r["eps_voc"])) else f"\neps {float(r['eps_voc']):g}+{float(r['eps_kde']):g}"
        labels.append(f"{r['method']}{budget}\n{float(r['llm_calls']):g} calls")
    if chance is not None:
        ax.axhline(100 * chance, color="#999", ls="--", lw=1, label=f"chance ({100 * chance:.1f}%)")
        ax.legend(fontsize=8, loc="upper right")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel(f"{metric.replace('_', ' ')} on the real test set (%)")
    ax.set_ylim(0, 100)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title or f"{metric} by method (mean ± sd over seeds)")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- HTML pieces
def _esc(value: Any) -> str:
    return html.escape(str(value))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if np.isnan(value):
            return "–"
        return f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
    return str(value)


def html_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "<p class='muted'>(none)</p>"
    columns = list(columns or dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{_esc(c)}</th>" for c in columns)
    body = []
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c, "")
            cls = " class='num'" if isinstance(v, (int, float, np.number)) and not isinstance(v, bool) else ""
            cells.append(f"<td{cls}>{_esc(_fmt(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _figure_block(uri: str, caption: str) -> str:
    return f"<figure><img src='{uri}' alt='{_esc(caption)}'><figcaption>{_esc(caption)}</figcaption></figure>"


def _section(section_id: str, title: str, body: str) -> str:
    return f"<section id='{section_id}'><h2>{_esc(title)}</h2>{body}</section>"


def _page(title: str, subtitle: str, sections: Sequence[str]) -> str:
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_esc(title)}</h1><p class='muted'>{_esc(subtitle)}</p>{''.join(sections)}</body></html>"
    )


def ledger_rows(ledger: Mapping[str, Any] | Sequence[Any] | None) -> tuple[list[dict[str, Any]], str]:
    """Flatten a ledger.json into table rows (one per release) plus a one-line total."""
    if not ledger:
        return [], "no ledger in this release"
    entries = ledger.get("entries", ledger.get("releases", [])) if isinstance(ledger, Mapping) else ledger
    rows = []
    keep = ("name", "stage", "mechanism", "partition", "epsilon", "delta", "sensitivity", "scale", "noise_source",
            "secure", "seed", "time")
    for e in entries or []:
        if isinstance(e, Mapping):
            rows.append({k: e[k] for k in keep if k in e} | (
                {"params": jsonable.dumps(e["params"], sort_keys=True)[:160]} if "params" in e else {}))
    total = ""
    if isinstance(ledger, Mapping):
        t = ledger.get("total", ledger.get("totals"))
        if isinstance(t, Mapping):
            first = [k for k in ("epsilon", "delta") if k in t]
            total = ", ".join(f"{k} = {_fmt(t[k])}" for k in first)
            rest = [f"{k}: {_total_detail(v)}" for k, v in t.items() if k not in first]
            total += f" ({'; '.join(rest)})" if rest else ""
        elif isinstance(t, (list, tuple)) and len(t) == 2:
            total = f"epsilon = {_fmt(t[0])}, delta = {_fmt(t[1])}"
        elif t is not None:
            total = str(t)
    return rows, total


def _total_detail(value: Any) -> str:
    """A detail of a ledger's total in words: a guarantee by its statement, a flag as yes / no, a mapping as
    ``key=value`` pairs (never a Python dict's repr)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        if "statement" in value:
            return str(value["statement"])
        return ", ".join(f"{k}={_total_detail(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_total_detail(v) for v in value) or "none"
    return _fmt(value)


def ledger_stage_rows(ledger: Mapping[str, Any] | Sequence[Any] | None) -> list[dict[str, Any]]:
    """One row per stage of a ledger.json, its partitions (one release per class) collapsed: the releases and
    partitions it holds, its mechanisms and noise sources, and the (epsilon, delta) the stage costs as the ledger
    composes it (privseed.tasks.dp.ledger.compose_entries: the maximum over partitions of the sum within each)."""
    from privseed.tasks.dp.ledger import compose_entries

    if not ledger:
        return []
    entries = ledger.get("entries", ledger.get("releases", [])) if isinstance(ledger, Mapping) else ledger
    stages: dict[str, list[Mapping[str, Any]]] = {}
    for e in entries or []:
        if isinstance(e, Mapping) and "epsilon" in e:
            stages.setdefault(str(e.get("stage") or e.get("name", "?")), []).append(e)

    def listed(values: Sequence[Any]) -> str:
        return ", ".join(dict.fromkeys(str(v) for v in values if v not in (None, ""))) or "–"

    rows = []
    for stage, group in stages.items():
        epsilon, delta = compose_entries([{"delta": 0.0, **e, "stage": stage} for e in group])
        partitions = {e.get("partition") for e in group} - {None}
        secure = {bool(e.get("secure", True)) for e in group}
        rows.append({"stage": stage, "releases": len(group),
                     "partitions": len(partitions) if partitions else "–",
                     "mechanism": listed([e.get("mechanism") for e in group]),
                     "epsilon": float(epsilon), "delta": float(delta),
                     "noise source": listed([e.get("noise_source") for e in group]),
                     "secure": "yes" if secure == {True} else "NO"})
    return rows


def insecure_stamp(*documents: Mapping[str, Any] | None) -> str | None:
    """The NOT DIFFERENTIALLY PRIVATE stamp when a ledger.json or manifest.json carries it, else None."""
    for document in documents:
        if isinstance(document, Mapping):
            privacy = document["privacy"] if isinstance(document.get("privacy"), Mapping) else {}
            total = document["total"] if isinstance(document.get("total"), Mapping) else {}
            if document.get("stamp") or privacy.get("secure") is False or total.get("secure") is False:
                from privseed.tasks.dp.mechanisms import INSECURE_STAMP

                return str(document.get("stamp") or INSECURE_STAMP)
    return None


def _stamp_banner(stamp: str) -> str:
    return (f"<div style='border:3px solid #b00020;background:#fde7ea;color:#b00020;padding:0.8em;"
            f"font-size:1.3em;font-weight:bold'>{_esc(stamp)}: this release's noise was drawn from the public "
            "--seed (--insecure-reproducible-noise). It is reproducible by anyone who reads the manifest and "
            "gives no privacy guarantee; the epsilon below is not a guarantee.</div>")


#: The fidelity and diversity metrics of Naeem et al. (2020), in the order the report shows them.
PRDC_METRICS = ("precision", "recall", "density", "coverage")


def _prdc_block(fidelity: Mapping[str, float] | None) -> str:
    if not fidelity:
        return ""
    k = int(fidelity.get("nearest_k", 5))
    return ("<h3>Fidelity and diversity of the synthetic corpus</h3>" + html_table(
        [{k_: float(fidelity[k_]) for k_ in PRDC_METRICS if k_ in fidelity}])
            + f"<p class='muted'>On the MiniLM embeddings of the real test set and the synthetic corpus, with "
            f"k = {k} nearest neighbours (Naeem et al. 2020, as the <code>prdc</code> package defines them). "
            "Precision: share of synthetic documents inside the real data's neighbourhoods (fidelity); recall: "
            "share of real documents inside the synthetic data's (diversity); density: how many real "
            "neighbourhoods hold a synthetic document, over k (about 1 when synthetic documents look like real "
            "ones); coverage: share of real documents with a synthetic one in their neighbourhood.</p>")


def _metric_rows(by_corpus: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per metric, one column per corpus: a dozen metrics fit the page's width this way round."""
    metrics = dict.fromkeys(k for values in by_corpus.values() for k in values)
    return [{"metric": m, **{name: values.get(m, "") for name, values in by_corpus.items()}} for m in metrics]


def _warnings_banner(warnings: Sequence[Mapping[str, str]]) -> str:
    """The findings a reader must see before any score (privseed.tasks.evaluation.evaluation.classifier_warnings)."""
    if not warnings:
        return ""
    items = "".join(f"<li>{_esc(w['message'])}</li>" for w in warnings)
    return ("<div id='warnings' style='border:2px solid #b26a00;background:#fff4e0;padding:.5em 1em;margin:1em 0'>"
            f"<b>Read this before the scores</b><ul style='margin:.3em 0'>{items}</ul></div>")


#: The pair the embedded model's envelope was measured with (TF-IDF + LR trained on the documents, and on their
#: seeds alone), as tasks/evaluation/evaluation.py names the score and the reference line (it imports this module).
ENVELOPE_SCORE, ENVELOPE_REFERENCE = "TF-IDF + LR", "seeds alone"


def envelope_finding(manifest: Mapping[str, Any] | None, scores: Mapping[str, Mapping[str, Any]],
                     references: Sequence[Mapping[str, Any]]) -> dict[str, str] | None:
    """Issue 48's honest envelope in the report: the line a DP-KPS run logged before generation when the embedded
    model wrote a kind of document it was measured to write poorly, or never measured on (``envelope_warning``:
    the library's measured figure and the backends that do better), with this evaluation's own figure, its
    documents against their seeds alone (both TF-IDF + LR on the same test split). None when the release's
    configuration (public: its manifest) is inside the envelope or not the embedded model's."""
    config = (manifest or {}).get("config") or {}
    if config.get("method") not in SEED_METHODS or not config.get("llm") or not config.get("doc_type"):
        return None
    spec = parse_llm_spec(str(config["llm"]))
    warning = envelope_warning(spec.kind, spec.model, str(config["doc_type"]))
    if warning is None:
        return None
    documents = (scores.get(ENVELOPE_SCORE) or {}).get("accuracy")
    seeds = next((r["accuracy"] for r in references if r.get("reference") == ENVELOPE_REFERENCE), None)
    if documents is not None and seeds is not None:
        verdict = ("trail" if documents < seeds else "match or beat")
        warning += (f". This release: its documents {100 * documents:.1f} % against {100 * seeds:.1f} % for their "
                    f"seeds alone (TF-IDF + LR on this test split): they {verdict} their seeds")
    return {"classifier": "", "kind": "envelope", "message": warning[:1].upper() + warning[1:] + "."}


def _percent(value: Any) -> Any:
    return round(100 * float(value), 1) if isinstance(value, (int, float)) and value == value else value


def _references_block(references: Sequence[Mapping[str, Any]]) -> str:
    """The lines to read the classifiers' accuracy against (``evaluation.reference_lines``)."""
    if not references:
        return ""
    rows = [{"reference": r["reference"], "accuracy %": _percent(r["accuracy"]),
             "macro-F1 %": _percent(r["macro_f1"]) if "macro_f1" in r else "–", "what": r.get("what", "")}
            for r in references]
    return ("<h3 id='references'>Reference lines</h3>" + html_table(rows)
            + "<p class='muted'>The same test split, scored the same way: chance, the release's seeds alone (no "
            "LLM text), and real documents when they were given (<code>--real-train</code>). A synthetic corpus "
            "earns its LLM calls where it beats the seeds alone, and is as good as real data where it reaches the "
            "real documents' line.</p>")


def _per_class_block(per_class: Mapping[str, Sequence[Mapping[str, Any]]], distrust: str) -> str:
    """Precision, recall, F1 and support per class: the first classifier's table open, the others folded."""
    if not per_class:
        return ""
    tables = []
    for k, (label, rows) in enumerate(per_class.items()):
        table = html_table([{"class": r["class"], "precision %": _percent(r["precision"]),
                             "recall %": _percent(r["recall"]), "F1 %": _percent(r["f1"]),
                             "support": r["support"]} for r in rows])
        tables.append(f"<p><b>{_esc(label)}</b></p>{table}" if k == 0 else
                      f"<details><summary>{_esc(label)}</summary>{table}</details>")
    return ("<h3 id='per-class'>Per class</h3>" + (f"<p><b>{_esc(distrust)}</b></p>" if distrust else "")
            + "".join(tables) + "<p class='muted'>Recall: share of a class's real test documents the classifier "
            "finds; precision: share of its answers for a class that are right; support: the class's test "
            "documents.</p>")


def _real_vs_synthetic_block(result: Mapping[str, Any]) -> str:
    """How well synthetic texts are told from real ones, and how their lengths differ, in words."""
    distinguishability = result.get("distinguishability") or {}
    auc = distinguishability.get("auc")
    sentences = [distinguishability.get("sentence"), (result.get("lengths") or {}).get("sentence")]
    if not any(sentences):
        return ""
    return ("<h3 id='real-vs-synthetic'>Real vs synthetic</h3>" + "".join(f"<p>{_esc(t)}</p>" for t in sentences if t)
            + ("<p class='muted'>AUC of TF-IDF + logistic regression trained to tell the synthetic corpus from the "
               "real test split's texts, stratified k-fold cross-validated: near 1, the synthetic documents carry "
               "words or phrasing real ones do not (or lack theirs), whatever the classifiers' accuracy.</p>"
               if auc is not None else ""))


# ---------------------------------------------------------------- the run report
def render_run_report(result: Mapping[str, Any], *, figures: Mapping[str, str],
                      ledger: Mapping[str, Any] | None, manifest: Mapping[str, Any] | None,
                      examples: Sequence[Mapping[str, Any]]) -> str:
    """HTML for one evaluation. `figures` maps a caption to a data URI; `examples` are release rows."""
    scores = result.get("scores", {})
    score_rows = [{"classifier": name, **{k: v for k, v in s.items() if k in (
        "accuracy", "macro_f1", "n_train", "n_test", "validation_size", "best_epoch", "seconds")}}
        for name, s in scores.items()]
    best = max(score_rows, key=lambda r: r.get("accuracy", 0), default=None)
    summary = (
        f"<p>Trained on <b>{_esc(result.get('n_train', '?'))}</b> synthetic documents from "
        f"<code>{_esc(result.get('synthetic', ''))}</code> and scored on <b>{_esc(result.get('n_test', '?'))}</b> "
        f"real test documents (<code>{_esc(result.get('test', ''))}</code>; "
        f"view: {_esc(result.get('test_view', 'text'))}). "
        f"Privacy spent by the release: <b>{_esc(result.get('privacy', 'see ledger'))}</b>.</p>"
    )
    if result.get("guarantee"):
        summary += f"<p id='guarantee'>{_esc(result['guarantee'])}</p>"
    if best:
        summary += (f"<p>Best classifier: <b>{_esc(best['classifier'])}</b>, accuracy "
                    f"<b>{100 * best['accuracy']:.1f}%</b>, macro-F1 {100 * best.get('macro_f1', 0):.1f}%.</p>")
    if result.get("references"):
        summary += ("<p>To read it against: " + "; ".join(
            f"{_esc(r['reference'])} <b>{100 * r['accuracy']:.1f}%</b>" for r in result["references"]) + ".</p>")
    summary += "".join(f"<p>{_esc(t)}</p>" for t in (
        result.get("distrust"), (result.get("distinguishability") or {}).get("sentence"),
        (result.get("lengths") or {}).get("sentence")) if t)
    fidelity = result.get("prdc")
    if fidelity:
        summary += ("<p>Synthetic vs real test embeddings: " + ", ".join(
            f"{k} <b>{fidelity[k]:.2f}</b>" for k in PRDC_METRICS if k in fidelity) + ".</p>")
    prompt_names = ((manifest or {}).get("config") or {}).get("prompt_class_names")
    if prompt_names:
        # JSON keys come back as strings in text order ("10" before "2"): list integer labels in their own order
        listed = ", ".join(f"{k}: {v}" for k, v in sorted(
            prompt_names.items(), key=lambda kv: (0, int(kv[0]), "") if str(kv[0]).lstrip("-").isdigit()
            else (1, 0, str(kv[0]))))
        summary += ("<p><b>Prompts named the class</b>: the data owner declared these public class names "
                    f"(--class-names), and each prompt carried its seed's: {_esc(listed)}.</p>")
    elif manifest and "prompt_class_names" in (manifest.get("config") or {}):
        summary += "<p>Prompts named no class (only the document type and the released keyphrases).</p>"
    openings = ((manifest or {}).get("config") or {}).get("answer_openings")
    if openings:
        summary += ("<p><b>Answers opened with public words</b>: each one started from an opening of its document "
                    "kind in the example library, drawn from the run's public seed: "
                    f"{_esc(', '.join(dict.fromkeys(openings)))}.</p>")
    if ((manifest or {}).get("config") or {}).get("answer_opens_with_subject"):
        summary += ("<p><b>Answers opened with their subject</b>: each one started from a word of its released seed "
                    "that reads as its class (or, for a seed with none, one of its class's strongest), capitalised, "
                    "as a news story opens with who or what it is about.</p>")
    if result.get("client"):
        summary += (f"<p>Deep CORAL used {_esc(result.get('n_client', '?'))} unlabelled client documents "
                    f"(<code>{_esc(result['client'])}</code>), disjoint from the test set.</p>")
    envelope = envelope_finding(manifest, scores, result.get("references") or [])
    summary = _warnings_banner([*(result.get("warnings") or []), *([envelope] if envelope else [])]) + summary
    stamp = insecure_stamp(ledger, manifest)
    if stamp:
        summary = _stamp_banner(stamp) + summary
    sections = [
        _section("summary", "Summary", summary),
        _section("scores", "Downstream accuracy (trained on synthetic data only) and fidelity",
                 html_table(score_rows) + "<p class='muted'>Early stopping uses a split of the synthetic "
                 "data only, and only when that split holds at least two documents per class; test labels are "
                 "read once, after all training. TF-IDF + logistic regression (scikit-learn) is an independent "
                 "evaluator reported beside ours.</p>" + _references_block(result.get("references") or [])
                 + _per_class_block(result.get("per_class") or {}, result.get("distrust") or "")
                 + _real_vs_synthetic_block(result) + _prdc_block(fidelity)),
        _section("figures", "Figures", "<div class='grid'>" + "".join(
            _figure_block(uri, cap) for cap, uri in figures.items()) + "</div>"),
        _section("corpus", "Corpus: fidelity and diversity", html_table(_metric_rows(result.get("corpus", {})))
            + (f"<p>FID (sentence embeddings, real test vs synthetic): <b>{_fmt(result['fid'])}</b> "
               "(lower is closer).</p>" if result.get("fid") is not None else "")),
        _section("usage", "LLM calls and tokens", html_table([result.get("usage", {})])),
    ]
    rows, total = ledger_rows(ledger)
    sections.append(_section("ledger", "Privacy ledger (ledger.json)",
                             (f"<p>{_esc(result['guarantee'])}</p>" if result.get("guarantee") else "")
                             + (f"<p>Composed total: <b>{_esc(total)}</b></p>" if total else "")
                             + html_table(ledger_stage_rows(ledger))
                             + "<p class='muted'>One row per stage; a stage's releases on disjoint partitions "
                             "(one per class) compose in parallel, stages add up.</p>"
                             + f"<details><summary>every release ({len(rows)})</summary>" + html_table(rows)
                             + "</details><details><summary>raw ledger.json</summary><pre>"
                             + _esc(jsonable.dumps(ledger, indent=2, sort_keys=True)) + "</pre></details>"))
    sections.append(_section("config", "Configuration (manifest.json)",
                             "<details><summary>manifest.json</summary><pre>"
                             + _esc(jsonable.dumps(manifest, indent=2, sort_keys=True)) + "</pre></details>"))
    ex_html = []
    for ex in examples:
        seed = ex.get("keyphrases")
        seed_txt = ", ".join(map(str, seed)) if seed is not None and len(seed) else "(no seed phrases)"
        extra = f" · generation seed {ex['seed']}" if ex.get("seed") is not None else ""
        ex_html.append(f"<tr><td>{_esc(ex.get('label_name', ex.get('label', '')))}</td>"
                       f"<td><div class='seed'>[{_esc(seed_txt)}]{_esc(extra)}</div>"
                       f"{_esc(ex.get('text', ''))}</td></tr>")
    sections.append(_section("examples", "Example synthetic documents with their seeds",
                             "<table><thead><tr><th>class</th><th>seed keyphrases → document</th></tr></thead>"
                             f"<tbody>{''.join(ex_html)}</tbody></table>" if ex_html else "<p>(empty release)</p>"))
    title = "privseed evaluation report" + (f" ({stamp})" if stamp else "")
    return _page(title, result.get("title", ""), sections)


# ---------------------------------------------------------------- the experiment report
def render_experiment_report(*, title: str, table_markdown: str, table_rows: Sequence[Mapping[str, Any]],
                             figures: Mapping[str, str], paper_rows: Sequence[Mapping[str, Any]],
                             cells: Sequence[Mapping[str, Any]], config: Mapping[str, Any],
                             summary: str) -> str:
    sections = [
        _section("summary", "Summary", f"<p>{_esc(summary)}</p>"),
        _section("table", "Results (mean ± sd over seeds) beside the paper", html_table(table_rows)
                 + "<details><summary>markdown</summary><pre>" + _esc(table_markdown) + "</pre></details>"),
        _section("figures", "Figures", "<div class='grid'>" + "".join(
            _figure_block(uri, cap) for cap, uri in figures.items()) + "</div>"),
        _section("paper", "The paper's numbers used here (with their table and row)", html_table(paper_rows)),
        _section("cells", "Every run of the grid", html_table(cells)),
        _section("config", "Experiment configuration",
                 "<pre>" + _esc(jsonable.dumps(config, indent=2, sort_keys=True)) + "</pre>"),
    ]
    return _page(title, "privseed experiment report", sections)
