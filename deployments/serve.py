"""Serve privseed's deployments from this process: no work pool, no worker.

    python deployments/serve.py                      # every deployment in deployments/prefect.yaml
    python deployments/serve.py --only dpkps-demo    # just one (repeatable)

Run it from the repository root with PREFECT_API_URL pointing at a server (``prefect server start``);
the deployments appear in the UI, and a run triggered there or with ``prefect deployment run
'dpkps/dpkps-demo'`` executes in this process. deployments/prefect.yaml is the one definition of names,
entrypoints, parameters and (inactive) schedules; this script reads it instead of repeating it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
DEFAULT_FILE = REPO / "deployments" / "prefect.yaml"


def load_deployment_specs(path: Path = DEFAULT_FILE) -> list[dict[str, Any]]:
    """The ``deployments`` list of a prefect.yaml, anchors resolved."""
    document = yaml.safe_load(path.read_text())
    specs = document.get("deployments") or []
    if not specs:
        raise SystemExit(f"{path} defines no deployments")
    return specs


def runner_deployments(specs: list[dict[str, Any]], only: list[str] | None = None) -> list[Any]:
    """``RunnerDeployment`` objects for ``flow.serve``-style serving, built from prefect.yaml specs."""
    from prefect.flows import load_flow_from_entrypoint
    from prefect.schedules import Cron

    chosen = [s for s in specs if not only or s["name"] in only]
    missing = sorted(set(only or []) - {s["name"] for s in specs})
    if missing:
        raise SystemExit(f"no deployment named {', '.join(missing)}; known: {', '.join(s['name'] for s in specs)}")
    deployments = []
    for spec in chosen:
        flow = load_flow_from_entrypoint(spec["entrypoint"])
        schedules = [Cron(s["cron"], timezone=s.get("timezone"), active=bool(s.get("active", True)))
                     for s in spec.get("schedules") or []]
        deployments.append(flow.to_deployment(
            name=spec["name"],
            parameters=spec.get("parameters") or {},
            schedules=schedules,
            description=spec.get("description"),
            tags=spec.get("tags"),
        ))
    return deployments


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefect-file", type=Path, default=DEFAULT_FILE)
    parser.add_argument("--only", action="append", help="serve only this deployment (repeatable)")
    parser.add_argument("--limit", type=int, default=1, help="flow runs executed at the same time (default 1)")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(REPO))  # entrypoints are paths relative to the repository root
    from privseed.tasks._runtime import apply_offline_defaults

    apply_offline_defaults()  # before Prefect is imported: it reads its settings once
    from prefect import serve

    deployments = runner_deployments(load_deployment_specs(args.prefect_file), args.only)
    serve(*deployments, limit=args.limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
