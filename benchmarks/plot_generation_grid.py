"""The generation grid's figure for experiments/results/generation.md: per setting (LLM, class names, method),
accuracy of the two classifiers trained on the release only, and the documents' seed-term coverage and degenerate
rate.

    python benchmarks/plot_generation_grid.py experiments/results/dbpedia14-generation-cpu/table.csv \
        docs/img/generation_grid.png [--chance 0.0714]
    python benchmarks/plot_generation_grid.py --out docs/img/generation_names_20pc.png --chance 0.0714 \
        --title "..." experiments/results/dbpedia14-generation-cpu-20pc-names/table.csv \
        experiments/results/dbpedia14-generation-cpu-20pc-names-qwen/table.csv

Reads experiments' table.csv files (privseed experiment writes them; several grids are drawn as one, in the
order given); plots what they hold, nothing else. Each row's label says how many seeds its mean is over.
"""
from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def setting_name(row: pd.Series) -> str:
    llm = {"none": "seeds only (--llm none)", "local": "SmolLM2-135M"}.get(row["llm"], row["llm"].replace("local:", ""))
    if row["method"] == "only-llm":
        return f"only-LLM, {llm}"
    variant = f" ({row['variant']})" if isinstance(row.get("variant"), str) and row["variant"] else ""
    names = " + class names" if row.get("class_names") and row["llm"] != "none" else ""
    return f"DP-KPS, {llm}{variant}{names}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", metavar="TABLE [OUT]",
                    help="one or more table.csv files, then the image to write (unless --out is given)")
    ap.add_argument("--out", default=None, help="the image to write")
    ap.add_argument("--chance", type=float, default=None, help="chance accuracy line (1 / classes)")
    ap.add_argument("--title", default="DP-KPS generation on DBPedia-14 at eps 1 + 10: what the LLM makes of "
                                        "the DP seeds")
    args = ap.parse_args()
    tables, out = (args.paths, args.out) if args.out else (args.paths[:-1], args.paths[-1])
    if not tables:
        ap.error("give at least one table.csv and the image to write")
    table = pd.concat([pd.read_csv(t) for t in tables], ignore_index=True)
    table["setting"] = table.apply(lambda row: f"{setting_name(row)} [{int(row['seeds'])} seed"
                                               f"{'s' if int(row['seeds']) != 1 else ''}]", axis=1)
    settings = list(dict.fromkeys(table["setting"]))
    classifiers = list(dict.fromkeys(table["classifier"]))
    fig, (acc_ax, gen_ax) = plt.subplots(1, 2, figsize=(13, 0.55 * len(settings) + 2.2),
                                         gridspec_kw={"width_ratios": [3, 2]})
    y = np.arange(len(settings))
    height = 0.8 / max(1, len(classifiers))
    for i, clf in enumerate(classifiers):
        rows = table[table["classifier"] == clf].set_index("setting").reindex(settings)
        acc_ax.barh(y + i * height, 100 * rows["accuracy_mean"], height, xerr=100 * rows["accuracy_std"].fillna(0),
                    label=clf, capsize=2)
    if args.chance:
        acc_ax.axvline(100 * args.chance, color="grey", ls=":", label="chance")
    acc_ax.set_yticks(y + height * (len(classifiers) - 1) / 2, settings, fontsize=8)
    acc_ax.invert_yaxis()
    acc_ax.set_xlabel("accuracy on the real test split, % (mean ± sd over seeds)")
    acc_ax.legend(fontsize=8, loc="lower right")
    first = table.drop_duplicates("setting").set_index("setting").reindex(settings)
    gen_ax.barh(y - 0.2, 100 * first["coverage"], 0.4, label="seed-term coverage")
    gen_ax.barh(y + 0.2, 100 * first["degenerate_rate"], 0.4, label="degenerate (not a document)")
    gen_ax.set_yticks(y, [""] * len(settings))
    gen_ax.set_ylim(acc_ax.get_ylim())  # same rows as the accuracy panel (rows without an LLM have no bars)
    gen_ax.set_xlim(0, 100)
    gen_ax.set_xlabel("% of documents (LLM rows only)")
    gen_ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(args.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}: {len(settings)} settings x {len(classifiers)} classifiers")


if __name__ == "__main__":
    main()
