"""An experiment grid: datasets x LLMs x methods x (class names) x (variants) x epsilon x seeds, run the way the
paper's tables were, with every classifier trained on synthetic data only and scored on a real test split.

What a grid is (``ExperimentSpec``, ``DatasetSpec``, loaded and validated from experiments/*.toml by
``load_experiment``), which runs it holds (``grid_cells``), how a benchmark file is split into the paper's three
roles (``prepare_data``), the configuration each method's flow gets for a cell (``method_config``), and the
resumable log of finished cells (``CellLog``). The `experiment` flow (flows/experiment.py) wires these; the
table and report are in tasks/evaluation/experiment_table.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from privseed.tasks.data import corpus
from privseed.tasks import jsonable, storage
from privseed.tasks.config.commands import (BASELINE_METHODS, EXPERIMENT_METHODS, EXPERIMENT_OUT, PE_METHODS,
                                            EvaluationOptions, validate_config)
from privseed.tasks.errors import ConfigError
from privseed.tasks.data.release_reader import Release
from privseed.tasks.seeds.seed_methods import HISTOGRAM_METHODS, SEED_METHOD_NAMES

REPO = Path(__file__).resolve().parents[2]
# The histogram methods (tasks/seeds/histogram_seeds.py) are privseed's own comparator on the same pipeline; they spend
# one budget, the cell's eps_voc + eps_kde, and the paper has no numbers for them.
#: Every method the dpkps flow runs (the seed-method registry, tasks/seeds/seed_methods.py).
DPKPS_METHODS: tuple[str, ...] = SEED_METHOD_NAMES
# Private evolution (PE_METHODS: Aug-PE, AugPE+V~, SecPE). Aug-PE spends the cell's eps_voc + eps_kde on its voting
# rounds; AugPE+V~ spends eps_voc on the vocabulary V~ and eps_kde on the rounds (the same split as DP-KPS,
# Table 2); SecPE is run at the grid's (p, r), a different guarantee, so it is one cell per seed, not one per
# epsilon. The baselines (BASELINE_METHODS) train on real documents or on only-LLM texts.
METHODS = EXPERIMENT_METHODS
NO_EPSILON_METHODS = BASELINE_METHODS + ("secpe",)
LLM_METHODS = ("only-llm",) + PE_METHODS
PAPER_NUMBERS = REPO / "experiments" / "paper_numbers.csv"
#: [generation]: the LLM settings every method that prompts shares (DP-KPS with an LLM, only-LLM, the PE family),
#: including the remote API's calls in flight and the Prefect Secret block of its key.
GENERATION_KEYS = ("max_tokens", "temperature", "llm_concurrency", "llm_secret")


def data_root() -> Path:
    """Where `{data}` in experiment files points: $PRIVSEED_DATA_ROOT, the folder that holds the public corpora
    (dbpedia14/, ohsumed23/, augpe/yelp/, medabstracts/, vocab/; docs/datasets.md)."""
    env = os.environ.get("PRIVSEED_DATA_ROOT")
    if not env:
        raise ConfigError("PRIVSEED_DATA_ROOT is not set: point it at the folder that holds the public corpora "
                          "(dbpedia14/, ohsumed23/, ...; docs/datasets.md)")
    return Path(env)


@dataclass
class DatasetSpec:
    """One dataset of the grid. Binary stand-ins map `positive_column == positive_value` to 1, else 0."""

    name: str
    train: str
    test: str | None = None
    test_fraction: float = 0.3  # used only when `test` is absent (the train file is split with data_seed)
    private_per_class: int = 200
    synthetic_per_class: int = 100
    test_per_class: int | None = None
    label_column: str = "label"  # e.g. Yelp's "label1" (business category)
    positive_column: str | None = None
    positive_value: Any = None
    label_names: list[str] | None = None
    #: the declared label set (public configuration, never read from the data); binary stand-ins
    #: (positive_column) declare [0, 1] by construction
    labels: list[Any] | None = None
    # The owner's public class names (JSON/TOML/CSV, label -> name), for the grid's "with class names" cells:
    # DP-KPS gets them as --class-names, only-LLM names its topics with them. From configuration, not the data.
    class_names: str | None = None
    doc_type: str = "document"
    paper_group: str = "dbpedia14"  # which of the paper's datasets the numbers come from (dbpedia14 | medical)
    data_seed: int = 20240601
    public_size: int = 700  # SecPE's public corpus: this many unlabelled documents of the client pool


@dataclass
class ExperimentSpec:
    name: str
    datasets: list[DatasetSpec]
    methods: list[str]
    eps: list[tuple[float, float]]
    seeds: list[int]
    llm: str | list[str] = "none"  # one backend, or a list: the grid runs every method with each
    # What every cell trains (EvaluationOptions, the options of `privseed evaluate`, whose defaults these are)
    classifier: str = EvaluationOptions.model_fields["classifier"].default
    tfidf: bool = EvaluationOptions.model_fields["tfidf"].default
    coral: list[bool] = field(default_factory=lambda: [EvaluationOptions.model_fields["coral"].default])
    max_epochs: int = EvaluationOptions.model_fields["max_epochs"].default
    dpkps: dict[str, Any] = field(default_factory=dict)  # passed to DpKpsConfig (vocab, length, bandwidth, ...)
    # LLM settings shared by every method that prompts (DP-KPS with an LLM, only-llm, the PE family), so the
    # methods compare on the same model, output length and temperature.
    generation: dict[str, Any] = field(default_factory=dict)  # GENERATION_KEYS
    pe: dict[str, Any] = field(default_factory=dict)  # passed to Aug-PE and SecPE (iterations, variations, ...)
    secpe: dict[str, Any] = field(default_factory=dict)  # passed to SecPE only (p, r_over_p, clusters, secrets)
    # Table 2's protocol: every method releases synthetic_per_class texts per class AND spends the same number
    # of LLM calls. PE spends 1 + T K calls per released text, so DP-KPS gets best_of = 1 + T K candidates.
    match_calls: bool = True
    gate: bool = True  # the release gate of every method (a research grid on a weak model may switch it off)
    # Research grids that need bit-identical reruns: every method's noise from the cell's seed. Such releases are
    # NOT differentially private (stamped); they are published only with allow_insecure_release as well.
    insecure_reproducible_noise: bool = False
    allow_insecure_release: bool = False
    # DP-KPS with an LLM, without and/or with the dataset's public class names in the prompt (only-LLM always
    # names the class: it has nothing else to go on). Tables keep the two settings apart.
    class_names: list[bool] = field(default_factory=lambda: [False])
    # Named variants of DP-KPS generation, each a dict {"dpkps": {DpKpsConfig fields}, "llms": [...] (optional:
    # the backends it applies to)}; every DP-KPS cell with an LLM also runs once per variant.
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    out: str = EXPERIMENT_OUT

    @property
    def out_dir(self) -> Path:
        return Path(self.out) / self.name

    @property
    def llms(self) -> list[str]:
        return [self.llm] if isinstance(self.llm, str) else list(self.llm)


def load_experiment(path: str | None, overrides: dict[str, Any] | None = None) -> ExperimentSpec:
    """Read an experiment TOML (see experiments/*.toml) and apply overrides (the file's settings inline, and
    :func:`privseed.flows.experiment.experiment_overrides`); validate up front."""
    import tomllib

    raw: dict[str, Any] = {}
    if path:
        file = Path(path)
        if not file.exists():
            raise ConfigError(f"experiment file {path} does not exist")
        try:
            raw = tomllib.loads(file.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"cannot parse {path}: {exc}") from exc
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    per_class = overrides.pop("synthetic_per_class", None)  # applies to every [dataset]
    rounds = overrides.pop("max_regenerations", None)  # a [dpkps] setting, which only-LLM follows too
    if rounds is not None:
        overrides["dpkps"] = {**raw.get("dpkps", {}), **overrides.get("dpkps", {}), "max_regenerations": rounds}
    raw.update(overrides)
    raw.setdefault("name", Path(path).stem if path else "experiment")
    if "{data}" in json.dumps(raw):
        raw = _substitute_data_root(raw, str(data_root()))
    datasets_raw = raw.pop("dataset", raw.pop("datasets", None))
    if datasets_raw is None:
        raise ConfigError("the experiment names no [dataset]: give --config experiments/X.toml")
    if isinstance(datasets_raw, dict):
        datasets_raw = [datasets_raw]
    datasets = []
    for d in datasets_raw:
        try:
            datasets.append(DatasetSpec(**d))
        except TypeError as exc:
            raise ConfigError(f"bad [dataset] entry: {exc}") from exc
        declared_labels(datasets[-1])  # refuse a dataset without declared labels before any cell runs
        if per_class is not None:
            datasets[-1].synthetic_per_class = int(per_class)
        names = datasets[-1].class_names
        if names and path and not Path(names).is_absolute() and "://" not in names:
            datasets[-1].class_names = str(Path(path).parent / names)  # relative to the experiment file
    try:
        spec = ExperimentSpec(datasets=datasets, **{k: v for k, v in raw.items()})
    except TypeError as exc:
        raise ConfigError(f"bad experiment setting: {exc}") from exc
    spec.eps = [tuple(float(x) for x in pair) for pair in spec.eps]  # type: ignore[misc]  # pairs: checked below
    spec.coral = [bool(c) for c in (spec.coral if isinstance(spec.coral, list) else [spec.coral])]
    unknown = [m for m in spec.methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    needs_llm = [m for m in spec.methods if m in LLM_METHODS]
    if needs_llm and all(llm == "none" for llm in spec.llms):
        raise ConfigError(f"method(s) {', '.join(needs_llm)} prompt an LLM; set llm (local | anthropic:MODEL | ...)")
    if not spec.llms:
        raise ConfigError("llm is an empty list; give at least one backend (none | local | ...)")
    spec.class_names = [bool(c) for c in (spec.class_names if isinstance(spec.class_names, list)
                                          else [spec.class_names])]
    if True in spec.class_names:
        unnamed = [ds.name for ds in spec.datasets if not ds.class_names]
        if unnamed:
            raise ConfigError(f"class_names = true needs a class_names file in [dataset] {', '.join(unnamed)}")
    for name, variant in spec.variants.items():
        unknown = sorted(set(variant) - {"dpkps", "llms"})
        if unknown or not isinstance(variant.get("dpkps", {}), dict):
            raise ConfigError(f"variant {name!r}: give a [variants.{name}.dpkps] table (and optional llms), "
                              f"not {unknown}")
    unknown_generation = sorted(set(spec.generation) - set(GENERATION_KEYS))
    if unknown_generation:
        raise ConfigError(f"unknown [generation] setting(s) {unknown_generation}; choose {', '.join(GENERATION_KEYS)}")
    for section, model in (("pe", "AugPeConfig"), ("secpe", "SecPeConfig")):
        _check_section(getattr(spec, section), section, model)
    for key in ("gate", "insecure_reproducible_noise", "allow_insecure_release"):
        if key in spec.dpkps:
            raise ConfigError(f"set `{key}` at the top level, not in [dpkps] (it applies to every method)")
    if any(len(p) != 2 or min(p) <= 0 for p in spec.eps):
        raise ConfigError("eps must be a list of [eps_voc, eps_kde] pairs, each > 0")
    if not spec.seeds:
        raise ConfigError("give at least one seed")
    # what every cell trains, checked as `privseed evaluate` checks it
    validate_config(EvaluationOptions, {"classifier": spec.classifier, "tfidf": spec.tfidf,
                                        "max_epochs": spec.max_epochs})
    return spec


def declared_labels(ds: DatasetSpec) -> list[Any]:
    """The dataset's declared label set: ``labels`` of its [dataset] entry, or [0, 1] for a binary stand-in
    (``positive_column``). Never read from the data: the methods refuse to run without a declared set."""
    if ds.labels is not None:
        if not ds.labels:
            raise ConfigError(f"[dataset] {ds.name}: labels is empty; list every label, e.g. labels = [0, 1, 2]")
        return list(ds.labels)
    if ds.positive_column:
        return [0, 1]
    raise ConfigError(f"[dataset] {ds.name} declares no labels: add `labels = [...]` to its entry (e.g. labels = "
                      "[0, 1, 2] for an integer label column); the label set is configuration, "
                      "never read from the data")


# Fields an experiment sets itself for every cell; a [pe] or [secpe] section may not override them.
_CELL_FIELDS = {"data", "out", "seed", "per_class", "llm", "doc_type", "epsilon", "eps_voc", "vocab_words", "public",
                "gate", "max_tokens", "temperature", "insecure_reproducible_noise", "allow_insecure_release",
                "labels", "labels_file"}


def _check_section(values: dict[str, Any], section: str, model: str) -> None:
    """Refuse unknown or cell-owned keys in [pe] / [secpe] before any run starts (not at the first PE cell)."""
    from privseed.tasks.config import commands as config

    fields = set(getattr(config, model).model_fields)
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ConfigError(f"unknown [{section}] setting(s) {unknown}")
    owned = sorted(set(values) & _CELL_FIELDS)
    if owned:
        raise ConfigError(f"[{section}] may not set {owned}: the grid sets them per cell "
                          "(budget from eps, texts from synthetic_per_class, LLM settings from [generation])")


def calls_per_text(spec: ExperimentSpec) -> int:
    """LLM calls a PE method spends per released text: N (K+1) RANDOM + (T-1) N K VARIATION per class = N (1 + T K)."""
    from privseed.tasks.config.commands import AugPeConfig
    from privseed.tasks.pe.evolution import evolution_call_plan

    defaults = AugPeConfig.model_fields
    t = int(spec.pe.get("iterations", defaults["iterations"].default))
    k = int(spec.pe.get("variations", defaults["variations"].default))
    return evolution_call_plan(classes=1, population=1, variations=k, iterations=t)["total"]


def dpkps_best_of(spec: ExperimentSpec, llm: str | None = None) -> int:
    """DP-KPS's candidates per seed: matched to PE's calls per text when the grid compares them (Table 2)."""
    explicit = spec.dpkps.get("best_of")
    llm = spec.llms[0] if llm is None else llm
    if not (spec.match_calls and any(m in PE_METHODS for m in spec.methods)) or llm == "none":
        return int(explicit or 1)
    matched = calls_per_text(spec)
    if explicit is not None and int(explicit) != matched:
        raise ConfigError(f"[dpkps] best_of = {explicit} but match_calls needs {matched} (= 1 + T K of [pe]); "
                          "remove best_of or set match_calls = false")
    if matched > 16:
        raise ConfigError(f"match_calls needs best_of = {matched} > 16 (DP-KPS's limit): lower [pe] iterations or "
                          "variations, or set match_calls = false")
    return matched


def _substitute_data_root(value: Any, root: str) -> Any:
    """Replace `{data}` in every string of the experiment file (datasets, [dpkps] vocab paths, ...)."""
    if isinstance(value, str):
        return value.replace("{data}", root)
    if isinstance(value, list):
        return [_substitute_data_root(v, root) for v in value]
    if isinstance(value, dict):
        return {k: _substitute_data_root(v, root) for k, v in value.items()}
    return value


@dataclass
class PreparedData:
    """The private corpus (for the release), the client's unlabelled pool, and its held-out test set."""

    private_path: str
    private: pd.DataFrame
    client_pool: list[str]
    test: pd.DataFrame
    label_names: dict[str, str]
    public_path: str  # SecPE's public corpus: unlabelled documents of the client pool (text column only)


def balanced_sample(df: pd.DataFrame, per_class: int | None, rng: np.random.Generator) -> pd.DataFrame:
    if per_class is None:
        return df
    parts = []
    for _, group in df.groupby("label", sort=True):
        take = min(per_class, len(group))
        parts.append(group.iloc[np.sort(rng.choice(len(group), size=take, replace=False))])
    return pd.concat(parts)


def prepare_data(ds: DatasetSpec, work: Path) -> PreparedData:
    """Split public benchmark data into the three roles of the paper's protocol, with a fixed data seed.

    private: `private_per_class` labelled documents per class (the data owner's corpus);
    client pool: the remaining training documents, unlabelled (Deep CORAL's D_B), disjoint from test;
    test: the real test split (or a seeded split of the file when the dataset ships no test split).
    """
    rng = np.random.default_rng(ds.data_seed)
    raw_train = corpus.read_columns(ds.train)
    if ds.test:
        raw_test = corpus.read_columns(ds.test)
    else:
        order = rng.permutation(len(raw_train))
        n_test = int(round(len(raw_train) * ds.test_fraction))
        raw_test, raw_train = raw_train.iloc[order[:n_test]], raw_train.iloc[order[n_test:]]

    def labelled(df: pd.DataFrame) -> pd.DataFrame:
        if ds.positive_column:
            column = df[ds.positive_column]
            positive = column.astype(str) == str(ds.positive_value)
            return pd.DataFrame({"text": df["text"].astype(str), "label": positive.astype(int)})
        return pd.DataFrame({"text": df["text"].astype(str), "label": df[ds.label_column]})

    train, test = labelled(raw_train).reset_index(drop=True), labelled(raw_test).reset_index(drop=True)
    if ds.label_names:
        names = {str(i): n for i, n in enumerate(ds.label_names)}
    elif "label_name" in raw_train.columns and not ds.positive_column:
        pairs = raw_train[["label", "label_name"]].drop_duplicates("label")
        names = {str(k): str(v) for k, v in pairs.itertuples(index=False)}
    else:
        names = {}
    private = balanced_sample(train, ds.private_per_class, rng)
    test = balanced_sample(test, ds.test_per_class, rng).reset_index(drop=True)
    test_texts = set(test["text"])
    client_pool = [t for t in train.drop(index=private.index)["text"] if t not in test_texts]
    private = private.reset_index(drop=True)
    # Drawn after the splits above, so adding it left every earlier private/test split unchanged.
    take = min(ds.public_size, len(client_pool))
    public = pd.DataFrame({"text": [client_pool[i] for i in np.sort(rng.choice(len(client_pool), size=take,
                                                                                 replace=False))]})
    folder = work / "data" / ds.name
    # Concurrent grids share these files: each is written atomically.
    path = corpus.write_parquet(str(folder / "private.parquet"), private)
    public_path = corpus.write_parquet(str(folder / "public.parquet"), public)
    return PreparedData(path, private, client_pool, test, names, public_path)


def cell_id(dataset: str, method: str, eps: tuple[float, float] | None, seed: int, llm: str,
            class_names: bool = False, variant: str = "") -> str:
    """The run's id (and folder under runs/). Class names and variants are marked on the method, so cells
    of grids that had neither keep their ids."""
    eps_part = "noeps" if eps is None else f"eps{eps[0]:g}+{eps[1]:g}"
    marks = (f"+{variant}" if variant else "") + ("+names" if class_names and method != "only-llm" else "")
    return f"{dataset}/{method}{marks}/{llm.replace(':', '_').replace('/', '_')}/{eps_part}/seed{seed}"


@dataclass(frozen=True)
class GridCell:
    """One run of the grid: a method on a dataset at a budget and seed, with one LLM, with or without the
    public class names in its prompts, in one generation variant ("" = the defaults)."""

    ds: DatasetSpec
    method: str
    eps: tuple[float, float] | None
    seed: int
    llm: str
    class_names: bool = False
    variant: str = ""

    @property
    def id(self) -> str:
        return cell_id(self.ds.name, self.method, self.eps, self.seed, self.llm, self.class_names, self.variant)


def grid_cells(spec: ExperimentSpec) -> list[GridCell]:
    """Every run of the grid, in order: datasets x LLMs x methods x (class names) x (variants) x eps x seeds.
    Methods that prompt an LLM are skipped for ``none``; only-LLM always names the class; class names and
    variants apply to DP-KPS with an LLM only."""
    plan = []
    for ds in spec.datasets:
        for llm in spec.llms:
            for method in spec.methods:
                if method in LLM_METHODS and llm == "none":
                    continue
                dpkps_llm = method in DPKPS_METHODS and llm != "none"
                names = [True] if method == "only-llm" else spec.class_names if dpkps_llm else [False]
                variants = [""] + [v for v, d in spec.variants.items() if llm in d.get("llms", [llm])] \
                    if dpkps_llm else [""]
                for with_names in dict.fromkeys(names):
                    for variant in variants:
                        for eps in ([None] if method in NO_EPSILON_METHODS else spec.eps):
                            for seed in spec.seeds:
                                plan.append(GridCell(ds, method, eps, seed, llm, with_names, variant))
    return plan



def grid_vocabulary(spec: ExperimentSpec) -> dict[str, Any]:
    """The public vocabulary V of the grid's DP-KPS settings: the phrase view and the coherence metric of cells
    that have no release manifest to read it from (the `real` and `only-llm` baselines)."""
    return {"vocab": spec.dpkps.get("vocab", "english"), "vocab_top": spec.dpkps.get("vocab_top", 50_000)}


def method_flow(method: str) -> str:
    """Which flow writes a method's release: ``dpkps``, ``augpe`` or ``secpe``."""
    if method in DPKPS_METHODS:
        return "dpkps"
    if method in ("augpe", "augpe+v"):
        return "augpe"
    if method == "secpe":
        return "secpe"
    raise ConfigError(f"method {method!r} writes no release")


def method_config(spec: ExperimentSpec, cell: GridCell, data: PreparedData, out: str) -> dict[str, Any]:
    """The configuration (a dict its flow validates) of the release a cell's method writes to ``out``.

    Every method gets the same texts per class, LLM, [generation] settings and release gate; the budget split
    is the one written next to PE_METHODS."""
    ds, method, eps = cell.ds, cell.method, cell.eps
    common = {"data": data.private_path, "out": out, "seed": cell.seed, "per_class": ds.synthetic_per_class,
              "llm": cell.llm, "doc_type": ds.doc_type, "gate": spec.gate, **spec.generation,
              "insecure_reproducible_noise": spec.insecure_reproducible_noise,
              "allow_insecure_release": spec.allow_insecure_release,
              "labels": [str(label) for label in declared_labels(ds)]}
    run_id = started_run(out)
    if run_id is not None:
        common["run_id"] = run_id
    flow = method_flow(method)
    if flow == "secpe":
        return {**spec.pe, **spec.secpe, **common, "public": data.public_path}
    if eps is None:
        raise ConfigError(f"method {method!r} needs an (eps_voc, eps_kde) pair")
    if flow == "dpkps":
        budget = {"epsilon": eps[0] + eps[1]} if method in HISTOGRAM_METHODS else {}
        extra = dict(spec.variants[cell.variant].get("dpkps", {})) if cell.variant else {}
        if cell.class_names:
            extra["class_names"] = ds.class_names
        return {**spec.dpkps, **common, **extra, "method": method, "eps_voc": eps[0], "eps_kde": eps[1],
                "best_of": dpkps_best_of(spec, cell.llm), **budget}
    budget = ({"epsilon": eps[0] + eps[1]} if method == "augpe" else
              {"epsilon": eps[1], "vocab_words": True, "eps_voc": eps[0],
               **{k: spec.dpkps[k] for k in ("vocab", "vocab_top", "first_terms", "vocab_size") if k in spec.dpkps}})
    return {**spec.pe, **common, **budget}


def started_run(out: str) -> str | None:
    """The run a cell's release already started in its private state (``OUT.private/runs/<id>``), or None.

    A cell writes one release, so its state holds one run at most; a cell that was interrupted, or whose release
    was removed to be written again, resumes that run: every drawn value is re-read and nothing is charged twice
    (tasks/dp/ledger.py), and the LLM answers already made come from the call cache. A state with several runs
    was not written by the grid and is not guessed at: the cell starts a new run."""
    from privseed.tasks.dp.identity import default_state_uri

    runs = [uri.rstrip("/").rsplit("/", 1)[-1] for uri in storage.listdir(storage.join(default_state_uri(out), "runs"))]
    return runs[0] if len(runs) == 1 else None


#: Beside a cell's release: the wall time its method took to write it, so a resumed grid still knows it.
RELEASE_SECONDS = "_release_seconds.json"


def record_release_seconds(run_dir: Path, seconds: float) -> None:
    storage.write_bytes(str(run_dir / RELEASE_SECONDS), json.dumps({"release_s": seconds}).encode())


def recorded_release_seconds(run_dir: Path) -> float:
    """The recorded wall time of a cell's release; NaN for a release written before times were recorded."""
    path = run_dir / RELEASE_SECONDS
    return float(json.loads(path.read_text())["release_s"]) if path.exists() else float("nan")


class CellLog:
    """``cells.jsonl`` of a grid: one JSON line per finished (cell, classifier, Deep CORAL) score, appended as
    each cell finishes. A re-run skips the cells it names, and several processes may fill one grid."""

    def __init__(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "cells.jsonl"

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def finished(self) -> set[str]:
        return {record["cell"] for record in self.records()}

    def append(self, records: list[dict[str, Any]]) -> None:
        with self.path.open("a") as handle:
            for record in records:
                handle.write(jsonable.dumps(record) + "\n")


def round_timings(release: Release | None, state: str | None = None) -> dict[str, float]:
    """Mean seconds per voting round of a PE run: its histogram step, embedding and LLM calls. The flows keep these
    out of the release (the histogram step grows with the private corpus size) and write them to the operator's
    private state, ``state`` (default: the run's ``--state``, else ``OUT.private`` beside the release)."""
    if release is None:
        return {}
    from privseed.tasks.pe.evolution import OPERATOR_TIMINGS
    from privseed.tasks.dp.identity import default_state_uri

    state = state or default_state_uri(release.path)  # manifests name no state (owner's path)
    info_uri = storage.join(state, OPERATOR_TIMINGS)
    if not storage.exists(info_uri):
        return {}
    rounds = json.loads(storage.read_bytes(info_uri)).get("rounds", [])
    if not rounds:
        return {}
    return {key: float(np.mean([r[key] for r in rounds])) for key in ("histogram_s", "embed_s", "llm_s")}



def spec_dict(spec: ExperimentSpec) -> dict[str, Any]:
    """The grid's settings as plain data (the report's configuration section)."""
    return asdict(spec)


