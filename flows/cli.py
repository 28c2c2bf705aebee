"""The ``privseed`` command.

It answers at once: the command table below is plain data, every command's options come from its configuration
model (tasks/config/commands.py, which imports pydantic and nothing heavy), and a command's flow module (Prefect, Dask,
torch, GX) is imported only when that command runs, after its configuration and its input have been checked
(``privseed.tasks.config.preflight``). ``privseed --help`` builds no command's options at all; ``privseed dpkps --help``
builds dpkps's only.

Errors: every refusal is one line on stderr and exit status 2 (``PrivseedError``, argparse's own errors with a
"did you mean" for a mistyped command or flag); a bug is one line and exit status 1. ``--verbose`` adds the
traceback and Prefect's and Dask's own error logs.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import importlib.util
import logging
import os
import sys
import textwrap
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, its configuration model (a class of privseed.tasks.config.commands), the function that
    runs it (``module:function``, imported only to run it), its help for users, and whether it runs Prefect flows
    (which need Prefect's API: a temporary server for the run when none is configured)."""

    name: str
    model: str
    runner: str
    help: str
    description: str
    runs_flows: bool = True

    @property
    def module(self) -> str:
        return self.runner.split(":", 1)[0]

    def config_model(self) -> Any:
        from privseed.tasks.config import commands as config

        return getattr(config, self.model)

    def run(self, args: argparse.Namespace) -> int:
        """Validate the configuration, check the input (privseed.tasks.config.preflight), then import the flow module
        and
        run: a refused run never starts Prefect or Dask. What the run starts for itself (Prefect's temporary
        server) stops when it ends, however it ends (privseed.tasks._runtime)."""
        from privseed.tasks.config import preflight
        from privseed.tasks._runtime import ended_like_ctrl_c, temporary_prefect_server
        from privseed.tasks.config.commands import config_from_args

        cfg = config_from_args(self.config_model(), args)
        preflight.check(cfg)
        module, function = self.runner.split(":", 1)
        with ended_like_ctrl_c(), (temporary_prefect_server() if self.runs_flows else contextlib.nullcontext()):
            return int(getattr(importlib.import_module(module), function)(cfg) or 0)


#: The subcommands, in the order --help lists them.
COMMANDS: tuple[Command, ...] = (
    Command("dpkps", "DpKpsConfig", "privseed.flows.dpkps:run_from_cli",
            "DP-KPS: DP keyphrase sequences seed one LLM prompt per document",
            "Write a synthetic corpus from a private labelled corpus with DP-KPS: a differentially private vocabulary "
            "and keyphrase sequences are drawn from the corpus, and an LLM (or none) writes one document per "
            "sequence. DATA is a Parquet, CSV or JSONL file, a folder of them or a shard prefix (local or s3://); "
            "the release goes to --out, the owner's private state beside it (OUT.private). Example:\n\n"
            "  privseed dpkps corpus.parquet --out release --labels-file labels.txt --llm none"),
    Command("demo", "DemoConfig", "privseed.flows.demo:run_from_cli",
            "DP seeds made into documents on the bundled demo corpus, then evaluated (embedded defaults)",
            "Run DP-KPS on a bundled sample of DBpedia-14 (7,000 documents, 14 classes), then train a classifier on "
            "the release and score it on the bundled real test split. Nothing is downloaded."),
    Command("augpe", "AugPeConfig", "privseed.flows.evolution:run_augpe_from_cli",
            "Aug-PE baseline (add --vocab-words for AugPE+V~)",
            "Write a synthetic corpus with Aug-PE (private evolution): an LLM writes candidates, the private "
            "corpus votes for them with Gaussian noise, the winners are varied, for --iterations rounds."),
    Command("secpe", "SecPeConfig", "privseed.flows.evolution:run_secpe_from_cli",
            "SecPE baseline: (p, r)-secret protection with secret clustering",
            "Write a synthetic corpus with SecPE: private evolution that protects the secrets it detects in the "
            "private corpus ((p, r)-secret protection), voting through clusters of a public corpus (--public)."),
    Command("evaluate", "EvaluateConfig", "privseed.flows.evaluate:run_from_cli",
            "train on a synthetic release only; score on a real test set",
            "Train classifiers on a synthetic release only and score them on a real labelled test set: accuracy, "
            "macro-F1 and report.html beside the release."),
    Command("experiment", "ExperimentConfig", "privseed.flows.experiment:run_from_cli",
            "a grid of methods x epsilon x seeds, one table beside the paper",
            "Run an experiment file (experiments/*.toml): every method x epsilon x seed, each release scored, one "
            "table; options given here replace the file's settings."),
    Command("audit", "AuditConfig", "privseed.flows.audit:run_from_cli",
            "empirical privacy audit: lower bounds on each mechanism's epsilon",
            "Audit each mechanism empirically: run it on neighbouring corpora many times and bound its epsilon "
            "from below with a confidence level; a bound above the claimed epsilon prints VIOLATED.",
            runs_flows=False),  # the trials call the stages' functions, not flows
    Command("audit-release", "CanaryAuditConfig", "privseed.flows.canary:run_from_cli",
            "canary test of a whole release (LLM included): does the released text expose inserted canaries?",
            "Insert canary documents (an in-distribution prefix and a rare secret, repeated) into a sample of the "
            "corpus, run the method end to end with these settings, LLM included, and test whether the released "
            "text exposes the inserted canaries against held-out ones. Exit status 1 when it does (EXPOSED)."),
)
COMMANDS_BY_NAME = {command.name: command for command in COMMANDS}


def _installed(command: Command) -> bool:
    """Whether the command's flow module is part of this installation (found, not imported)."""
    try:
        return importlib.util.find_spec(command.module) is not None
    except ModuleNotFoundError:
        return False


def _version() -> str:
    from privseed import __version__

    return f"privseed {__version__}"


class _Version(argparse.Action):
    """``--version``, reading the version only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, nargs=0, help="show the version and exit", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(_version())
        parser.exit()


class Parser(argparse.ArgumentParser):
    """argparse, with one-line errors and a "did you mean" for a mistyped command or choice."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {_suggest(message, self)}; see {self.prog} --help", file=sys.stderr)
        self.exit(2)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """A description's paragraphs wrapped to the terminal; indented lines (an example command) kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(line if not line or line.startswith(" ") else
                         textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent)
                         for line in text.splitlines())


def _suggest(message: str, parser: argparse.ArgumentParser) -> str:
    """argparse's message with the closest valid choice of an invalid one."""
    marker = "invalid choice: "
    if marker not in message:
        return message
    for action in parser._actions:
        if action.choices and message.startswith(f"argument {argparse._get_action_name(action)}:"):
            wrong = message.split(marker, 1)[1].split(" (", 1)[0].strip("'\"")
            close = difflib.get_close_matches(wrong, [str(c) for c in action.choices], n=1, cutoff=0.6)
            if close:
                return f"{message}; did you mean {close[0]!r}?"
    return message


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line. Every command gets its options from its model, or, with ``only``, just that command (the
    others keep their name and help line: enough for ``privseed --help``; ``only=""`` builds none)."""
    parser = Parser(prog="privseed",
                    description="Differentially private synthetic text: DP seeds in, LLM-written documents out. "
                                "`privseed COMMAND --help` lists a command's options.")
    parser.add_argument("--version", action=_Version)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging, and the traceback and Prefect's and Dask's logs of an error")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS:
        if not _installed(command):  # a method not built into this installation
            continue
        sub = subparsers.add_parser(command.name, help=command.help, description=command.description,
                                    formatter_class=_HelpFormatter)
        if only is None or only == command.name:
            from privseed.tasks.config.commands import add_config_arguments

            add_config_arguments(sub, command.config_model())
        sub.set_defaults(command=command.name)
    return parser


def _chosen_command(argv: Sequence[str]) -> str:
    """The command a command line names: its first argument that is not an option ("" when none)."""
    return next((arg for arg in argv if not arg.startswith("-")), "")


def _unknown_arguments(parser: argparse.ArgumentParser, command: str, extras: list[str]) -> NoReturn:
    """argparse's "unrecognized arguments", from the command's own parser, with the closest real flag."""
    sub = _subparser(parser, command) if command else parser
    flags = [flag for action in sub._actions for flag in action.option_strings]
    hints = []
    for extra in extras:
        if extra.startswith("-"):
            close = difflib.get_close_matches(extra.split("=", 1)[0], flags, n=1, cutoff=0.6)
            if close:
                hints.append(f"{extra}: did you mean {close[0]}?")
    message = f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else "")
    sub.error(message)


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


class _DropErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


_DROP_ERRORS = _DropErrors()


def _quiet_errors_of_the_engines() -> None:
    """Without --verbose, the one line main() prints is the error's only report: Prefect's task and flow loggers
    would repeat it with a traceback for every task, flow and retry, and the Dask workers' logs once more."""
    for name in ("prefect.task_runs", "prefect.flow_runs", "prefect.engine", "prefect.flow_engine",
                 "prefect.task_engine", "distributed.worker", "distributed.scheduler", "distributed.core"):
        logging.getLogger(name).addFilter(_DROP_ERRORS)  # once per logger, however often main() runs
    # The workers of a LocalCluster log a failed task once more ("Compute Failed", with its traceback) in their own
    # processes: their logs are silenced below CRITICAL (privseed.tasks.data.cluster.dask_log_level).
    os.environ.setdefault("PRIVSEED_DASK_LOG_LEVEL", "CRITICAL")


#: Libraries whose INFO records are their own bookkeeping, not the run's progress: Great Expectations logs about 200
#: lines ("Skipping registering function ...") each time the release gate builds its context.
CHATTY_LOGGERS = ("great_expectations",)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = _chosen_command(argv)
    parser = build_parser(only=chosen if chosen in COMMANDS_BY_NAME else "")
    args, extras = parser.parse_known_args(argv)
    if extras:
        _unknown_arguments(parser, getattr(args, "command", None) or "", extras)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    from privseed.tasks._runtime import apply_offline_defaults, run_ended
    from privseed.tasks.errors import PrivseedError

    apply_offline_defaults()  # before Prefect is imported (it reads its settings once)
    if not args.verbose:
        _quiet_errors_of_the_engines()
        for name in CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        return COMMANDS_BY_NAME[args.command].run(args)
    except PrivseedError as exc:
        if args.verbose:
            traceback.print_exc()
        print(f"privseed {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        return _interrupted(exc)
    except Exception as exc:  # a bug: one line, the traceback with --verbose
        if (ended := run_ended()) is not None:  # a signal's RunEnded that a library wrapped in its own error
            return _interrupted(ended)
        if args.verbose:
            traceback.print_exc()
        print(f"privseed {args.command}: internal error: {type(exc).__name__}: {_one_line(exc)} (run with "
              "--verbose for the traceback)", file=sys.stderr)
        return 1


def _interrupted(exc: KeyboardInterrupt) -> int:
    """What a run stopped by Ctrl-C or an ending signal prints, and its exit status."""
    from privseed.tasks._runtime import RunEnded

    # A run that drew values and did not publish is refused by the same command without --run-id, which names it.
    print(f"privseed: {'ended by ' + str(exc) if isinstance(exc, RunEnded) else 'interrupted'}; the values drawn "
          "so far and the finished LLM calls are kept in the private state: the same command again names the "
          "run to resume with --run-id", file=sys.stderr)
    return exc.exit_status if isinstance(exc, RunEnded) else 130


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


if __name__ == "__main__":
    sys.exit(main())
