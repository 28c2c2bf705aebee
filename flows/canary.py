"""`privseed audit-release`: the whole-pipeline canary test a data owner runs before sharing a release.

    sample the corpus, insert canaries -> DP-KPS (or a histogram method), LLM included, on that copy
        -> exposure of the canaries in the released text -> canary-audit.json (the private state, OUT.private: it
           holds the canaries, first words of private documents), canary-audit.png (--out), a verdict

A canary is an in-distribution prefix (the first words of a real document of its class) followed by a secret of
rare public-vocabulary words; of each pair of canaries public randomness inserts one (--repetitions times) and
holds the other out. The verdict tests whether the inserted canaries' secrets are likelier in the release than
the held-out ones' (a bigram membership score, the Canary's Echo design of Meeus et al. 2024): EXPOSED when the
permutation p-value is at most --alpha, and the command then exits with status 1. It also reports verbatim
n-gram overlap. The audit's own release (of the corpus with canaries) is written to a temporary folder and
deleted: it is never a release to share. docs/privacy.md, "Canary test", shows a secure run and one without
noise (an epsilon of 1e9), which it flags.
"""

from __future__ import annotations

import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

from prefect import flow

from privseed import __version__
from privseed.flows.dpkps import dpkps_flow
from privseed.tasks._runtime import apply_offline_defaults
from privseed.tasks.config.commands import TYPED_FLOW, CanaryAuditConfig, flow_config
from privseed.tasks.stages.canary import judge_canaries, plant_canaries, write_canary_report


@flow(name="audit-release", log_prints=True, **TYPED_FLOW)
def canary_audit_flow(config: CanaryAuditConfig) -> dict:
    """The canary test end to end; ``config`` is typed (a dict of fields is accepted). Returns the report
    document's verdict fields and the paths of the report."""
    apply_offline_defaults()  # a run started by a deployment worker: the models and GX stay offline
    cfg = flow_config(CanaryAuditConfig, config)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="privseed-canary-") as work:
        planted = plant_canaries(cfg, work)
        release = str(Path(work) / "release")
        manifest = dpkps_flow(cfg.release_config(planted.path, release, str(Path(work) / "state")))
        verdict = judge_canaries(planted, release, cfg)
    meta = {"command": "privseed audit-release " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["audit-release"]
            else None, "privseed_version": __version__,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "method": cfg.method, "llm": cfg.llm, "per_class": cfg.per_class, "repetitions": cfg.repetitions,
            "canary_pairs_per_class": cfg.canary_pairs, "secret_words": cfg.secret_words,
            "real_documents": planted.documents, "seconds": round(time.perf_counter() - started, 1)}
    paths = write_canary_report(verdict, manifest, cfg, meta)
    return {**verdict.summary(), "sentence": verdict.sentence(), **paths, "seconds": meta["seconds"],
            "epsilon": manifest["privacy"]["epsilon"]}


# ---------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------
def run_from_cli(cfg: CanaryAuditConfig) -> int:
    """``privseed audit-release`` (privseed.flows.cli has validated and checked the configuration)."""
    result = canary_audit_flow(cfg)
    print(result["sentence"])
    print(f"wrote {result['json']} and {result['plot']} ({result['seconds']:.0f} s)")
    if result["verdict"] == "EXPOSED":
        print("privseed audit-release: the release exposes the inserted canaries: do not share a release made with "
              "these settings", file=sys.stderr)
        return 1
    return 0
