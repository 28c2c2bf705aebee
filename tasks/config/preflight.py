"""The checks of a command's input that need no private pass, run before Prefect or Dask start.

A run that would fail on a missing file, an unknown format, a missing column, an empty corpus, a missing model
file or missing credentials fails here in seconds, with one line naming the problem and the fix, instead of after
a Prefect server and a Dask cluster have started. So does a run that would spend the budget where the owner did not
mean to: into a --out that holds other files than a privseed release's, or beside an unfinished run of the private
state without --run-id or --new-run. What is read: the input's listing, Parquet footers (column names, row-group
sizes), the header and rows of a CSV or JSON Lines file (which have no footer; counted, not kept), the release
folder's listing and manifest.json, the private state's list of runs, and public files the configuration names. No
check looks at a private row's content, and none is written anywhere. The flows repeat what they need (a
deployment's run does not pass here).

``check(cfg)`` dispatches on the configuration's class (:data:`CHECKS`); a command without checks passes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from privseed.tasks.config.commands import DemoConfig, EvaluateConfig, ExperimentConfig, ReleaseConfig, SecPeConfig
from privseed.tasks.config.options import EmbeddingOptions, GenerationOptions, VocabularyOptions
from privseed.tasks.errors import ConfigError, CorpusError, UnfinishedRunError


def check_private_corpus(cfg: ReleaseConfig) -> None:
    """DATA: exists, every file of a known format, the text and label columns present, at least one row. For
    Parquet this is what the flow's planning stage reads (footers only), so it costs well under a second."""
    from privseed.tasks.data.units import plan_corpus

    plan_corpus(cfg.data, cfg.text_column, cfg.label_column, cfg.storage_options)


def check_llm(llm: str, secret: str | None = None, *, sends: bool = True) -> None:
    """What the backend kind of ``llm`` checks for itself (tasks/llm/kinds.py ``BackendKind.preflight``: a local
    model's file exists, a remote API has a key unless the run ``sends`` nothing). A backend this process already
    serves for the spec (``privseed.tasks.llm.service.register_backend``: a custom client, a test double) needs
    nothing."""
    from privseed.tasks.llm.kinds import kind_of, parse_llm_spec
    from privseed.tasks.llm.service import has_backend

    spec = parse_llm_spec(llm)
    if has_backend(spec):
        return
    kind_of(spec).check(spec, secret, sends=sends)


def check_public_file(flag: str, path: str | None, storage_options: dict[str, Any] | None = None) -> None:
    """A file the configuration names (few-shot examples, class names, a vocabulary, a prompt template) exists."""
    from privseed.tasks import storage

    if path and not storage.exists(path, storage_options):
        raise ConfigError(f"{flag} {path} does not exist")


def _looks_like_path(value: str) -> bool:
    return "/" in value or "." in value


#: The documents a release folder holds beside its manifest and parts (tasks/data/corpus.py ``publish_release``;
#: evolution.json: private evolution's summary; report.html: ``privseed evaluate --report-in-release``).
RELEASE_DOCUMENTS = ("ledger.json", "quality.json", "README.md", "evolution.json", "report.html")
#: The suffix of a file written atomically, before its rename (privseed.tasks.storage.write_atomic).
TEMPORARY_SUFFIX = ".tmp-"


def check_release_folder(cfg: ReleaseConfig) -> None:
    """--out is new, empty, a privseed release (its manifest.json says so) or what an unfinished privseed run left;
    a folder of other files (the corpus's own folder, a home folder) is refused before anything is written there,
    naming some of them: the release and the README written for its recipient would sit among them."""
    from privseed.tasks import storage
    from privseed.tasks.data.corpus import LEGACY_QUARANTINE_DIR, MANIFEST, MANIFEST_FORMAT, RELEASES_DIR, SYNTHETIC_DIR

    # A folder without a manifest that holds nothing else is what a run that did not finish left: resumed there.
    release_names = {MANIFEST, SYNTHETIC_DIR, RELEASES_DIR, LEGACY_QUARANTINE_DIR, *RELEASE_DOCUMENTS}

    fs, path = storage.filesystem(cfg.out, cfg.storage_options)
    if storage.with_retries(lambda: fs.isfile(path), what=f"checking {cfg.out}"):
        raise ConfigError(f"--out {cfg.out} is a file; give a folder for the release (a new one, or a release's)")
    names = [uri.rstrip("/").rsplit("/", 1)[-1] for uri in storage.listdir(cfg.out, cfg.storage_options)]
    if MANIFEST in names:
        try:
            manifest = json.loads(storage.read_bytes(storage.join(cfg.out, MANIFEST), cfg.storage_options))
        except (ValueError, UnicodeDecodeError):
            manifest = None
        if isinstance(manifest, dict) and manifest.get("format") == MANIFEST_FORMAT:
            return
        foreign = [MANIFEST]  # not privseed's
    else:
        foreign = sorted(n for n in names if n.split(TEMPORARY_SUFFIX, 1)[0] not in release_names)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ConfigError(f"--out {cfg.out} holds files that are not a privseed release ({shown}): the release and "
                          "its README for the recipient would be written among them; give a new or empty folder")


def check_no_unfinished_run(cfg: ReleaseConfig) -> None:
    """Refuse a run that would silently start beside a run of the same private state that drew values and did
    not publish (killed, crashed): the command must say which it means, ``--run-id ID`` (resume: the drawn values
    are re-read, nothing is charged again) or ``--new-run`` (charges the budget again)."""
    from privseed.tasks.dp.ledger import unfinished_runs

    if cfg.run_id is not None or cfg.new_run or not cfg.charges:
        return
    runs = unfinished_runs(cfg.state_uri, cfg.storage_options)
    if runs:
        latest, more = runs[-1], (f" (and {len(runs) - 1} earlier)" if len(runs) > 1 else "")
        raise UnfinishedRunError(
            f"the private state {cfg.state_uri} holds run {latest}{more}, which drew values and did not publish: "
            f"resume it with --run-id {latest} (its drawn values are re-read, nothing is charged again), or start "
            "a new run with --new-run (which charges the budget again)")


def check_approval_server(cfg: ReleaseConfig) -> None:
    """``--require-approval`` pauses the run until a person answers in the Prefect UI: it needs a Prefect server they
    can reach (PREFECT_API_URL), not the temporary one that lives and dies with the run (tasks/stages/approval.py)."""
    if not cfg.require_approval:
        return
    from prefect.settings import PREFECT_API_URL  # only for this option: a refused run must not wait for Prefect

    if not PREFECT_API_URL.value():
        raise ConfigError("--require-approval needs a Prefect server a person can reach: set PREFECT_API_URL (e.g. "
                          "http://127.0.0.1:4200/api after `prefect server start`; docs/operations.md, \"A release "
                          "that waits for a person\")")


def check_release_input(cfg: ReleaseConfig) -> None:
    if cfg.writes_release:
        check_release_folder(cfg)
        check_no_unfinished_run(cfg)
    check_llm(cfg.llm, cfg.llm_secret, sends=not getattr(cfg, "dry_run", False))
    options = cfg.storage_options
    check_approval_server(cfg)
    if isinstance(cfg, GenerationOptions):
        check_public_file("--few-shot", cfg.few_shot, options)
        check_public_file("--class-names", cfg.class_names, options)
        if _looks_like_path(cfg.prompt_template):
            check_public_file("--prompt-template", cfg.prompt_template, options)
    if isinstance(cfg, VocabularyOptions) and cfg.vocab != "english":
        check_public_file("--vocab", cfg.vocab, options)
    if isinstance(cfg, EmbeddingOptions) and cfg.embedding_model != "minilm":
        check_public_file("--embedding-model", cfg.embedding_model, options)
    if isinstance(cfg, SecPeConfig):
        from privseed.tasks.data.corpus import column_names

        columns = column_names(cfg.public, options)
        if cfg.public_text_column not in columns:
            raise CorpusError(f"--public {cfg.public} has no column {cfg.public_text_column!r}; its columns are "
                              f"{columns} (set --public-text-column)")
        if cfg.secrets not in ("words", "pii"):
            check_public_file("--secrets", cfg.secrets, options)
    check_private_corpus(cfg)


def check_evaluation_input(cfg: EvaluateConfig) -> None:
    """The release has a manifest; the test set (and the client documents) exist with their columns."""
    from privseed.tasks.data.corpus import column_names, read_manifest

    read_manifest(cfg.synthetic)
    for flag, path, needed in (("--test", cfg.test, (cfg.text_column, cfg.label_column)),
                               ("--client", cfg.client, (cfg.text_column,))):
        if path is None:
            continue
        columns = column_names(path)
        missing = [c for c in needed if c not in columns]
        if missing:
            raise CorpusError(f"{flag} {path} has no column {', '.join(map(repr, missing))}; its columns are "
                              f"{columns} (set --text-column / --label-column)")


def check_experiment_input(cfg: ExperimentConfig) -> None:
    if cfg.config_path is None:  # a command line has no inline grid
        raise ConfigError("--config: give the experiment file, e.g. --config experiments/dbpedia14_nollm.toml")
    if not os.path.exists(cfg.config_path):
        raise ConfigError(f"--config {cfg.config_path} does not exist")


def check_demo_input(cfg: DemoConfig) -> None:
    if cfg.llm != "none":
        check_llm(cfg.llm)


#: What is checked before each command's run, by its configuration's class (the first that matches).
CHECKS: tuple[tuple[type, Callable[[Any], None]], ...] = (
    (ReleaseConfig, check_release_input),
    (EvaluateConfig, check_evaluation_input),
    (ExperimentConfig, check_experiment_input),
    (DemoConfig, check_demo_input),
)


def check(cfg: Any) -> None:
    """Every check of :data:`CHECKS` that applies to ``cfg``; a PrivseedError names the first problem."""
    for kind, checks in CHECKS:
        if isinstance(cfg, kind):
            checks(cfg)
            return
