"""Parse and lint privseed's infrastructure and deployment files; exit 1 naming every problem.

    python infra/validate.py            # from the repository root

Checks (no Docker, kubectl or helm needed; `docker compose config` runs too when docker is installed):
- infra/compose.yaml: the required services, pinned images, depends_on targets that exist, ports bound
  to 127.0.0.1, credentials only as ${VARIABLES} that infra/.env.example names.
- infra/k8s/: every manifest has apiVersion/kind/metadata.name; the DaskCluster (dask-kubernetes operator)
  has scheduler and worker containers with pinned images, a scheduler service on 8786 that selects this
  cluster; the autoscaler names it; kustomization resources exist; no Secret with data is committed;
  the Prefect Helm values pin the Prefect version of pyproject.toml and point the worker at a pool.
- deployments/prefect.yaml: unique names, entrypoints `file.py:function` that exist and are decorated
  with @flow, parameters as mappings, valid cron schedules that are inactive, a work pool.
"""

from __future__ import annotations

import ast
import datetime
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
REQUIRED_SERVICES = ("prefect-server", "prefect-worker", "dask-scheduler", "dask-worker", "minio")
SECRET_NAME = re.compile(r"(SECRET|PASSWORD|TOKEN|API_KEY|ACCESS_KEY|CREDENTIAL)", re.I)
INTERPOLATION = re.compile(r"^\$\{([A-Z_][A-Z0-9_]*)(?:(?::?[-?])[^}]*)?\}$")


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


def check_compose(path: Path, env_example: Path | None = None) -> list[str]:
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


def check_k8s(folder: Path, prefect_version: str) -> list[str]:
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
                    if not _pinned(str(container.get("image", ""))):
                        problems.append(f"{where} {role} image {container.get('image')!r} is not pinned")
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
    return problems


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
    return problems


def pinned_prefect_version(pyproject: Path) -> str:
    match = re.search(r'"prefect==([0-9.]+)"', pyproject.read_text())
    return match.group(1) if match else "?"


def validate(repo: Path = REPO) -> list[str]:
    problems = check_compose(repo / "infra" / "compose.yaml", repo / "infra" / ".env.example")
    problems += check_k8s(repo / "infra" / "k8s", pinned_prefect_version(repo / "pyproject.toml"))
    problems += check_deployments(repo / "deployments" / "prefect.yaml", repo)
    dockerfile = repo / "infra" / "Dockerfile"
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                if not (repo / source).exists():
                    problems.append(f"Dockerfile copies {source}, which does not exist")
    return problems


def main(argv: Iterable[str] | None = None) -> int:
    problems = validate()
    for problem in problems:
        print(f"problem: {problem}")
    if problems:
        return 1
    print("infra and deployments: ok (compose, k8s manifests and Helm values, prefect.yaml)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
