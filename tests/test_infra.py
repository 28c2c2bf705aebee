"""infra/validate.py passes on the repository's files and catches each kind of broken file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "infra"))
import validate  # noqa: E402  (infra/validate.py is a script, not a package)


def test_repository_infra_and_deployments_validate():
    result = subprocess.run([sys.executable, "infra/validate.py"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok" in result.stdout


def test_compose_has_the_whole_stack_with_pinned_images():
    compose = yaml.safe_load((REPO / "infra" / "compose.yaml").read_text())
    services = compose["services"]
    assert set(validate.REQUIRED_SERVICES) <= set(services)
    assert services["dask-worker"]["deploy"]["replicas"] >= 2
    assert "dask-worker" in services["dask-worker"]["command"][0] or services["dask-worker"]["command"][0] == "dask"
    assert "minio" in services["minio"]["image"]
    env = services["prefect-worker"]["environment"]
    assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert env["AWS_SECRET_ACCESS_KEY"].startswith("${")


@pytest.fixture
def compose_copy(tmp_path):
    target = tmp_path / "compose.yaml"
    shutil.copy(REPO / "infra" / "compose.yaml", target)
    shutil.copy(REPO / "infra" / ".env.example", tmp_path / ".env.example")
    return target


def _rewrite(path: Path, mutate) -> None:
    document = yaml.safe_load(path.read_text())
    mutate(document)
    path.write_text(yaml.safe_dump(document))


@pytest.mark.parametrize("mutate, expected", [
    (lambda c: c["services"].pop("minio"), "service 'minio' is missing"),
    (lambda c: c["services"]["minio"].update(image="minio/minio:latest"), "unpinned image"),
    (lambda c: c["services"]["minio"]["environment"].update(MINIO_ROOT_PASSWORD="hunter2hunter2"),
     "MINIO_ROOT_PASSWORD to a literal value"),
    (lambda c: c["services"]["prefect-worker"]["environment"].update(ANTHROPIC_API_KEY="${SOME_OTHER_KEY}"),
     "does not list"),
    (lambda c: c["services"]["dask-worker"].update(depends_on=["scheduler"]), "unknown service 'scheduler'"),
    (lambda c: c["services"]["minio"].update(ports=["9000:9000"]), "every interface"),
])
def test_compose_problems_are_named(compose_copy, mutate, expected):
    _rewrite(compose_copy, mutate)
    problems = validate.check_compose(compose_copy, compose_copy.parent / ".env.example")
    assert any(expected in p for p in problems), problems


@pytest.fixture
def k8s_copy(tmp_path):
    target = tmp_path / "k8s"
    shutil.copytree(REPO / "infra" / "k8s", target)
    return target


def _rewrite_docs(path: Path, mutate) -> None:
    docs = validate.load_yaml_documents(path)
    mutate(docs)
    path.write_text(yaml.safe_dump_all(docs))


def test_k8s_copy_is_clean(k8s_copy):
    assert validate.check_k8s(k8s_copy, "3.8.8") == []


@pytest.mark.parametrize("file, mutate, expected", [
    ("daskcluster.yaml", lambda d: d[0]["spec"]["scheduler"]["service"]["selector"].update(
        {"dask.org/cluster-name": "other"}), "does not select its own cluster"),
    ("daskcluster.yaml", lambda d: d[1]["spec"].update(cluster="nope"), "scales unknown cluster 'nope'"),
    ("daskcluster.yaml", lambda d: d[0]["spec"]["worker"]["spec"]["containers"][0].update(image="dask:latest"),
     "not pinned"),
    ("daskcluster.yaml", lambda d: d.pop(0), "no DaskCluster"),
    ("privseed-config.yaml", lambda d: d[0]["data"].update(AWS_SECRET_ACCESS_KEY="x"), "belong in a Secret"),
    ("privseed-config.yaml", lambda d: d.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                                                 "stringData": {"k": "v"}}), "commits secret values"),
    ("prefect-worker-values.yaml", lambda d: d[0]["worker"]["image"].update(prefectTag="3-latest"),
     "does not pin prefect 3.8.8"),
    ("kustomization.yaml", lambda d: d[0]["resources"].append("missing.yaml"), "missing.yaml, which does not exist"),
])
def test_k8s_problems_are_named(k8s_copy, file, mutate, expected):
    _rewrite_docs(k8s_copy / file, mutate)
    problems = validate.check_k8s(k8s_copy, "3.8.8")
    assert any(expected in p for p in problems), problems


@pytest.fixture
def deployments_copy(tmp_path):
    target = tmp_path / "prefect.yaml"
    target.write_text(yaml.safe_dump(yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())))
    return target


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["deployments"][0]["schedules"][0].update(active=True), "is active"),
    (lambda d: d["deployments"][0]["schedules"][0].update(cron="61 * * * *"), "invalid cron"),
    (lambda d: d["deployments"][0].update(entrypoint="flows/dpkps.py:register_cli"), "no @flow function"),
    (lambda d: d["deployments"][0].update(entrypoint="flows/nope.py:x"), "does not exist"),
    (lambda d: d["deployments"].append(dict(d["deployments"][0])), "is used twice"),
    (lambda d: d["deployments"][0].pop("work_pool"), "no work_pool.name"),
])
def test_deployment_file_problems_are_named(deployments_copy, mutate, expected):
    assert validate.check_deployments(deployments_copy, REPO) == []
    _rewrite(deployments_copy, mutate)
    problems = validate.check_deployments(deployments_copy, REPO)
    assert any(expected in p for p in problems), problems
