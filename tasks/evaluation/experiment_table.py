"""The experiment's table and report: mean and spread over seeds per setting, the paper's number for the same
setting beside it (experiments/paper_numbers.csv), as markdown, CSV and an HTML report with figures."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from privseed.tasks.quality import metrics
from privseed.tasks.evaluation import report
from privseed.tasks.seeds.seed_methods import SEED_METHODS
from privseed.tasks.evaluation.experiment import (BASELINE_METHODS, DPKPS_METHODS, HISTOGRAM_METHODS, PE_METHODS,
                                                  ExperimentSpec, spec_dict)


def paper_lookup(paper: pd.DataFrame, *, group: str, method: str, llm: str, coral: bool,
                  eps: tuple[float, float] | None) -> tuple[float, str]:
    """The paper's number for the same setting, and its table/row; NaN when the paper has none."""
    llm_key = "none" if llm == "none" else "yes"
    seed_method = SEED_METHODS.get(method)
    sampler = seed_method.paper_sampler if seed_method and seed_method.paper_sampler else method
    rows = paper[(paper["dataset"] == group) & (paper["llm"] == llm_key)
                 & (paper["da"].isin(["any", "yes" if coral else "no"]))]
    if method in HISTOGRAM_METHODS:  # privseed's own comparator: not in the paper
        return float("nan"), ""
    if method in BASELINE_METHODS:
        rows = rows[rows["sampler"] == method]
    else:
        if eps is None:
            return float("nan"), ""
        rows = rows[(rows["eps_voc"] == eps[0]) & (rows["eps_kde"] == eps[1])]
        exact = rows[rows["sampler"] == sampler]
        # "any" rows are DP-KPS numbers whose sampler the paper leaves open; a PE method has only its own rows.
        rows = exact if len(exact) or method in PE_METHODS else rows[rows["sampler"] == "any"]
    if rows.empty:
        return float("nan"), ""
    first = rows.iloc[0]
    return float(first["accuracy"]), f"{first['table']}, {first['row']}, {first['column']}"


def aggregate_cells(cells: pd.DataFrame, paper: pd.DataFrame, groups: dict[str, str]) -> pd.DataFrame:
    """Mean and sample sd over seeds per (dataset, method, llm, coral, classifier, eps), paper beside."""
    keys = ["dataset", "method", "variant", "llm", "class_names", "coral", "classifier", "eps_voc", "eps_kde"]
    cells = cells.assign(eps_voc=cells["eps_voc"].fillna(-1), eps_kde=cells["eps_kde"].fillna(-1),
                         class_names=cells["class_names"].fillna(False).astype(bool) if "class_names" in cells
                         else (cells["method"] == "only-llm"),
                         variant=cells["variant"].fillna("") if "variant" in cells else "")
    rows = []
    for key, g in cells.groupby(keys, sort=False):
        rec = dict(zip(keys, key))
        eps = None if rec["eps_voc"] < 0 else (rec["eps_voc"], rec["eps_kde"])
        rec["eps_voc"], rec["eps_kde"] = (eps if eps else (float("nan"), float("nan")))
        rec["eps_total"] = float("nan") if eps is None else eps[0] + eps[1]
        for metric in ("accuracy", "macro_f1", "fid", "distinct_2", "coherence"):
            m, s = metrics.mean_and_spread(g[metric].tolist() if metric in g else [])
            rec[f"{metric}_mean"], rec[f"{metric}_std"] = m, s
        rec["values"] = [float(v) for v in g.sort_values("seed")["accuracy"]]  # per seed, for the figures
        rec["seeds"] = int(len(g))
        rec["llm_calls"] = float(g["llm_calls"].mean())
        rec["texts"] = float(g["n_train"].mean())
        rec["budget"] = str(g["budget"].iloc[0]) if "budget" in g and g["budget"].notna().any() else ""
        for gen in ("coverage", "degenerate_rate", "tokens_per_s", "release_s"):
            values = pd.to_numeric(g[gen], errors="coerce") if gen in g else pd.Series(dtype=float)
            rec[gen] = float(values.mean()) if values.notna().any() else float("nan")
        for timing in ("histogram_s_per_round", "llm_s_per_round"):
            values = pd.to_numeric(g[timing], errors="coerce") if timing in g else pd.Series(dtype=float)
            rec[timing] = float(values.mean()) if values.notna().any() else float("nan")
        value, cite = paper_lookup(paper, group=groups[rec["dataset"]], method=rec["method"], llm=rec["llm"],
                                    coral=bool(rec["coral"]), eps=eps)
        rec["paper_accuracy"], rec["paper_source"] = value, cite
        rows.append(rec)
    table = pd.DataFrame(rows)
    order = {m: i for i, m in enumerate(("real", *DPKPS_METHODS, *PE_METHODS, "only-llm"))}
    table["_rank"] = table["method"].map(lambda m: order.get(m, len(order)))
    table["_with_llm"] = table["llm"] != "none"  # the seeds alone first
    return (table.sort_values(["dataset", "classifier", "coral", "_rank", "eps_total", "_with_llm", "llm",
                               "class_names", "variant"], na_position="first", kind="stable")
            .drop(columns=["_rank", "_with_llm"]).reset_index(drop=True))


def _pct(value: float) -> str:
    return "–" if value is None or np.isnan(value) else f"{100 * value:.0f}"


def _num(value: float, fmt: str = "{:.0f}") -> str:
    return "–" if value is None or np.isnan(value) else fmt.format(value)


def table_markdown(table: pd.DataFrame) -> str:
    """The experiment table in markdown: ours as mean ± sd (percent) over seeds, the paper's beside."""
    lines = ["| dataset | method | LLM | class names in prompt | DA | classifier | eps_voc + eps_kde "
             "| guarantee (ledger) | texts | LLM calls | accuracy % (mean ± sd) | macro-F1 % | coherence % "
             "| seed coverage % | degenerate % | tokens/s | release s | seeds | paper % | paper source |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples(index=False):
        eps = "–" if np.isnan(r.eps_total) else f"{r.eps_voc:g} + {r.eps_kde:g} = {r.eps_total:g}"
        paper = "–" if np.isnan(r.paper_accuracy) else f"{r.paper_accuracy:.1f}"
        budget = getattr(r, "budget", "") or "–"
        texts = getattr(r, "texts", float("nan"))
        coh = getattr(r, "coherence_mean", float("nan"))
        coherence = "–" if not np.isfinite(coh) else f"{100 * coh:.1f}"
        variant = getattr(r, "variant", "") or ""
        lines.append(f"| {r.dataset} | {r.method}{f' ({variant})' if variant else ''} | {r.llm} "
                     f"| {'yes' if getattr(r, 'class_names', False) else 'no'} "
                     f"| {'yes' if r.coral else 'no'} | {r.classifier} | {eps} "
                     f"| {budget} | {'–' if np.isnan(texts) else f'{texts:g}'} | {r.llm_calls:g} "
                     f"| {100 * r.accuracy_mean:.1f} ± {100 * r.accuracy_std:.1f} "
                     f"| {100 * r.macro_f1_mean:.1f} ± {100 * r.macro_f1_std:.1f} | {coherence} "
                     f"| {_pct(getattr(r, 'coverage', float('nan')))} "
                     f"| {_pct(getattr(r, 'degenerate_rate', float('nan')))} "
                     f"| {_num(getattr(r, 'tokens_per_s', float('nan')), '{:.1f}')} "
                     f"| {_num(getattr(r, 'release_s', float('nan')))} | {r.seeds} | {paper} "
                     f"| {r.paper_source or '–'} |")
    return "\n".join(lines) + "\n"


def cells_table_rows(cells: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for r in cells.to_dict("records"):
        rec = {k: r[k] for k in ("cell", "classifier", "accuracy", "macro_f1", "fid", "distinct_2",
                                 "duplicate_rate", "coherence", "coverage", "degenerate_rate", "tokens_per_s",
                                 "release_s", "llm_calls", "budget", "histogram_s_per_round", "llm_s_per_round",
                                 "seconds")
               if k in r}
        rec["report"] = r.get("report", "")
        out.append(rec)
    return out


def build_experiment_report(spec: ExperimentSpec, table: pd.DataFrame, cells: pd.DataFrame,
                            paper: pd.DataFrame, groups: dict[str, str],
                            n_classes: dict[str, int] | None = None) -> str:
    figures: dict[str, str] = {}
    n_classes = n_classes or {}
    for (dataset, classifier, llm, coral), rows in table.groupby(["dataset", "classifier", "llm", "coral"], sort=False):
        if "class_names" in rows and rows["class_names"].any():  # the plot's bars name the setting
            rows = rows.assign(method=[m + (f" ({v})" if v else "") + (" + names" if n and m != "only-llm" else "")
                                       for m, v, n in zip(rows["method"], rows["variant"], rows["class_names"])])
        group = groups[dataset]
        llm_key = "none" if llm == "none" else "yes"
        p = paper[(paper["dataset"] == group) & (paper["llm"] == llm_key)
                  & (paper["da"].isin(["any", "yes" if coral else "no"]))]
        p = p.assign(label=p["table"] + " " + p["column"],
                     eps_total=p["eps_voc"].astype(float) + p["eps_kde"].astype(float))
        title = f"{dataset}: {classifier}, LLM {llm}{', Deep CORAL' if coral else ''}"
        figures[f"Methods side by side, {title}: accuracy (mean ± sd, dots are seeds) and the LLM calls each spent"] = \
            report.figure_to_data_uri(report.plot_method_comparison(
                rows, chance=1.0 / n_classes[dataset] if n_classes.get(dataset) else None, title=title))
        if rows["eps_total"].nunique() > 1:  # a curve needs at least two budgets
            figures[f"Accuracy vs epsilon, {title} (ours: mean ± sd over seeds; paper: hollow squares)"] = \
                report.figure_to_data_uri(report.plot_accuracy_vs_epsilon(rows, p[["label", "eps_total", "accuracy"]],
                                                                          title=title))
    display = []
    for r in table.to_dict("records"):
        display.append({
            "dataset": r["dataset"], "method": r["method"] + (f" ({r['variant']})" if r.get("variant") else ""),
            "LLM": r["llm"], "class names in prompt": "yes" if r.get("class_names") else "no",
            "DA": "yes" if r["coral"] else "no",
            "classifier": r["classifier"],
            "eps": "–" if np.isnan(r["eps_total"]) else f"{r['eps_voc']:g}+{r['eps_kde']:g}",
            "accuracy %": f"{100 * r['accuracy_mean']:.1f} ± {100 * r['accuracy_std']:.1f}",
            "macro-F1 %": f"{100 * r['macro_f1_mean']:.1f} ± {100 * r['macro_f1_std']:.1f}",
            "guarantee": r.get("budget") or "–", "texts": r.get("texts"), "LLM calls": r["llm_calls"],
            "FID": round(r["fid_mean"], 4), "seed coverage %": _pct(r.get("coverage", float("nan"))),
            "degenerate %": _pct(r.get("degenerate_rate", float("nan"))),
            "tokens/s": _num(r.get("tokens_per_s", float("nan")), "{:.1f}"),
            "release s": _num(r.get("release_s", float("nan"))), "seeds": r["seeds"],
            "paper %": "–" if np.isnan(r["paper_accuracy"]) else f"{r['paper_accuracy']:.1f}",
            "paper source": r["paper_source"] or "–",
        })
    used = paper[paper["dataset"].isin(set(groups.values()))]
    summary = (f"{len(cells['cell'].unique())} runs: {len(spec.datasets)} dataset(s) x {len(spec.methods)} method(s) "
               f"x {len(spec.eps)} epsilon setting(s) x {len(spec.seeds)} seed(s), LLM {', '.join(spec.llms)}"
               f"{', with and without public class names' if len(spec.class_names) > 1 else ''}. "
               "Every classifier is trained on synthetic data only and scored on the real test set.")
    if spec.insecure_reproducible_noise:
        from privseed.tasks.dp.mechanisms import INSECURE_STAMP

        summary = (f"{INSECURE_STAMP}: every release of this grid drew its noise from the cell's public seed "
                   "(insecure_reproducible_noise); the epsilons below are not guarantees. " + summary)
    return report.render_experiment_report(
        title=f"privseed experiment: {spec.name}", table_markdown=table_markdown(table), table_rows=display,
        figures=figures, paper_rows=used.astype(object).where(used.notna(), "").to_dict("records"),
        cells=cells_table_rows(cells),
        config=spec_dict(spec), summary=summary)
