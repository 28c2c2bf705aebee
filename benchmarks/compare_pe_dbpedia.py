"""Small matched comparison on DBPedia-14: DP-KPS vs Aug-PE vs AugPE+V~ vs SecPE with the local LLM.

Protocol (the paper's Table 2, scaled to a 2-core CPU): every method releases the same number of texts per class
(--per-class) and spends the same number of LLM calls: PE methods make N (K+1) RANDOM calls plus N K VARIATION
calls per later round (K = 1, T = 2: 3 N per class); DP-KPS gets best-of-3 candidates per seed (3 N per class).
Matched budgets: DP-KPS eps_voc 1 + eps_kde (E - 1) (pure DP), Aug-PE eps E, AugPE+V~ eps_voc 1 + (E - 1),
all with delta = 1 / (n ln n) for the public bound n <= 10,000 where a delta applies; SecPE at p = 1e-4,
r/p = 10 (its own guarantee; the per-document DP epsilon it would have with rho and sigma fixed is printed too).

Private data: --private-per-class documents per class of dbpedia14/train (seeded); SecPE's public corpus is a
disjoint --public-per-class slice of the same file with its labels dropped. Downstream: TF-IDF + logistic
regression trained on the synthetic texts only, tested on the real dbpedia14/test (2,100 documents); the same
classifier on as many real training documents is the reference.

    nice -n 10 python benchmarks/compare_pe_dbpedia.py --out /tmp/pe-compare --per-class 4
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def classify(train: pd.DataFrame, test: pd.DataFrame) -> tuple[float, float]:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score

    vec = TfidfVectorizer(sublinear_tf=True, min_df=1, ngram_range=(1, 2), stop_words="english")
    x = vec.fit_transform(train["text"].astype(str))
    clf = LogisticRegression(max_iter=2000, C=10.0).fit(x, train["label"].astype(int))
    pred = clf.predict(vec.transform(test["text"].astype(str)))
    return accuracy_score(test["label"], pred), f1_score(test["label"], pred, average="macro")


def read_release(out: str) -> tuple[pd.DataFrame, dict, dict]:
    parts = sorted(Path(out, "synthetic").glob("part-*.parquet"))
    frame = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    return frame, json.loads(Path(out, "ledger.json").read_text()), json.loads(Path(out, "manifest.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-class", type=int, default=4)
    ap.add_argument("--private-per-class", type=int, default=100)
    ap.add_argument("--public-per-class", type=int, default=50)
    ap.add_argument("--epsilon", type=float, default=6.0, help="total DP budget E")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--llm", default="local")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", nargs="+", default=["dpkps", "augpe", "augpe+v", "secpe"])
    ap.add_argument("--secpe-sigma", type=float, default=5.0,
                    help="SecPE's public noise multiplier (the run refuses if a detected secret needs more)")
    args = ap.parse_args()

    os.environ.setdefault("PREFECT_HOME", str(Path(args.out) / ".prefect"))
    from privseed.flows.dpkps import dpkps_flow
    from privseed.flows.evolution import run_augpe, run_secpe

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from privseed.tasks.evaluation.experiment import data_root

    data = data_root() / "dbpedia14"  # $PRIVSEED_DATA_ROOT (docs/datasets.md)
    train = pd.read_parquet(data / "train.parquet")
    test = pd.read_parquet(data / "test.parquet")
    rng = np.random.default_rng(20240601 + args.seed)
    priv_rows, pub_rows = [], []
    for _label, group in train.groupby("label"):
        order = rng.permutation(len(group))
        priv_rows.append(group.iloc[order[:args.private_per_class]])
        pub_rows.append(group.iloc[order[args.private_per_class:args.private_per_class + args.public_per_class]])
    private = pd.concat(priv_rows)[["text", "label"]].reset_index(drop=True)
    public = pd.concat(pub_rows)[["text"]].reset_index(drop=True)
    private.to_parquet(out / "private.parquet", index=False)
    public.to_parquet(out / "public.parquet", index=False)

    e = args.epsilon
    common = {"data": str(out / "private.parquet"), "per_class": args.per_class, "llm": args.llm,
              "doc_type": "Wikipedia article", "max_tokens": args.max_tokens, "temperature": args.temperature,
              "seed": args.seed, "gate": False}
    pe = {"iterations": 2, "variations": 1, "n_upper_bound": 10_000}
    def run_dpkps() -> str:
        """DP-KPS's DP stage as released by `privseed dpkps --llm none`, then the LLM helper's generation on the
        released keyphrases (best of 3 by term coverage). Two steps only because dpkps_flow on main does not yet
        hand V~ to generate_documents (sequences.attrs['released_vocabulary']); the prompts, cache and
        selection are exactly the generation layer's."""
        from privseed.tasks.generation.drivers import generate_seeds, seeds_from_sequences
        from privseed.tasks.generation.params import GenerationParams

        base = str(out / "dpkps-seeds")
        dpkps_flow({**common, "llm": "none", "out": base, "eps_voc": 1.0, "eps_kde": e - 1.0})
        seqs, ledger, _ = read_release(base)
        seqs["keyphrases"] = seqs["keyphrases"].map(list)
        vocab = sorted({t for k in seqs["keyphrases"] for t in k})  # every released keyphrase is a term of V~
        seeds = seeds_from_sequences(seqs[["label", "keyphrases"]], vocab, args.seed)
        params = GenerationParams(doc_type=common["doc_type"], max_tokens=args.max_tokens,
                                  temperature=args.temperature, best_of=3)
        docs = generate_seeds(seeds, args.llm, params, str(out / "dpkps-seeds" / "_state" / "llm-cache"),
                              progress=False)
        target = out / "dpkps"
        (target / "synthetic").mkdir(parents=True, exist_ok=True)
        docs.to_parquet(target / "synthetic" / "part-00000-local.parquet", index=False)
        (target / "ledger.json").write_text(json.dumps(ledger))
        (target / "manifest.json").write_text("{}")
        return str(target)

    runs = {
        "dpkps": run_dpkps,
        "augpe": lambda: run_augpe({**common, **pe, "out": str(out / "augpe"), "epsilon": e}),
        "augpe+v": lambda: run_augpe({**common, **pe, "out": str(out / "augpe-v"), "epsilon": e - 1.0,
                                      "vocab_words": True, "eps_voc": 1.0}),
        "secpe": lambda: run_secpe({**common, **pe, "out": str(out / "secpe"), "public": str(out / "public.parquet"),
                                    "p": 1e-4, "r_over_p": 10.0, "clusters": 50,
                                    "noise_multiplier": args.secpe_sigma}),
    }
    rows = []
    real = pd.concat([g.head(args.per_class) for _, g in private.groupby("label")])
    acc, f1 = classify(real, test)
    rows.append({"method": f"real documents ({args.per_class}/class)", "budget": "none (not private)", "calls": 0,
                 "tokens_out": 0, "texts": len(real), "accuracy": acc, "macro_f1": f1, "minutes": 0.0})
    for name in args.methods:
        t0 = time.time()
        path = runs[name]()
        minutes = (time.time() - t0) / 60
        frame, ledger, _manifest = read_release(path)
        acc, f1 = classify(frame, test)
        eps, delta = ledger["total"]["epsilon"], ledger["total"]["delta"]
        budget = f"eps={eps:g}, delta={delta:.2g}"
        calls = None
        evo = Path(path, "evolution.json")
        if evo.exists():
            info = json.loads(evo.read_text())
            calls = info["llm_calls"]["random"] + info["llm_calls"]["variation"]
            if name == "secpe":
                sp = info["schedule"]["secret_protection"]
                budget = (f"(p, r) = ({sp['p']:g}, {sp['r']:g}); sigma={info['schedule']['sigma']:.3g} "
                          f"(DP eps={eps:.3g} if rho, sigma fixed)")
        else:
            calls = args.per_class * frame["label"].nunique() * 3
        rows.append({"method": name, "budget": budget, "calls": calls,
                     "tokens_out": int(frame["tokens_out"].sum()) if "tokens_out" in frame else 0,
                     "texts": len(frame), "accuracy": acc, "macro_f1": f1, "minutes": minutes})
        print(json.dumps(rows[-1]), flush=True)
        if name == "dpkps":  # the no-LLM ablation: the released keyphrase sequences themselves are the texts
            seeds_frame, _, _ = read_release(str(out / "dpkps-seeds"))
            acc, f1 = classify(seeds_frame, test)
            rows.append({"method": "dpkps (keyphrases only, no LLM)", "budget": budget, "calls": 0, "tokens_out": 0,
                         "texts": len(seeds_frame), "accuracy": acc, "macro_f1": f1, "minutes": 0.0})
            print(json.dumps(rows[-1]), flush=True)
        pd.DataFrame(rows).to_json(out / "results.json", orient="records", indent=2)

    print("\n| method | budget | LLM calls | texts | accuracy | macro-F1 | wall (min) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['budget']} | {r['calls']} | {r['texts']} | {100 * r['accuracy']:.1f} % | "
              f"{100 * r['macro_f1']:.1f} % | {r['minutes']:.1f} |")


if __name__ == "__main__":
    main()
