"""The ``privseed`` command. Each flow module registers its own subcommands with ``register_cli``."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

import privseed.tasks._runtime  # noqa: F401  (offline settings before prefect is imported)
from privseed import __version__
from privseed.tasks.errors import PrivseedError

# Flow modules that add subcommands, in the order they appear in --help.
COMMAND_MODULES = ("privseed.flows.dpkps", "privseed.flows.demo", "privseed.flows.evolution", "privseed.flows.evaluate",
                   "privseed.flows.experiment", "privseed.flows.audit", "privseed.flows.canary")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="privseed",
        description="Differentially private synthetic text: DP seeds in, LLM-written documents out.",
    )
    parser.add_argument("--version", action="version", version=f"privseed {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # a method not built into this installation
                continue
            raise
        module.register_cli(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except PrivseedError as exc:
        print(f"privseed: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("privseed: interrupted; released values and finished LLM calls are kept, re-run to resume",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
