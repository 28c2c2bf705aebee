"""deployments/: prefect.yaml parses into runnable deployments, and a served deployment runs once on a
real local Prefect server on 127.0.0.1, triggered the way a user does it (``prefect deployment run --watch``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml


REPO = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).with_name("prefect"))
sys.path.insert(0, str(REPO / "deployments"))
import serve  # noqa: E402  (deployments/serve.py is a script)


def test_prefect_yaml_parses_into_deployments_for_every_method():
    specs = serve.load_deployment_specs()
    entrypoints = {spec["entrypoint"] for spec in specs}
    assert {"flows/dpkps.py:dpkps_flow", "flows/evolution.py:augpe_flow", "flows/evolution.py:secpe_flow",
            "flows/evaluate.py:evaluate", "flows/experiment.py:experiment"} <= entrypoints
    document = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    assert document["prefect-version"] == "3.8.8"
    for spec in specs:
        assert spec["work_pool"]["name"] == "privseed-local"
        assert spec["schedules"] and all(s["active"] is False for s in spec["schedules"])
    deployments = serve.runner_deployments(specs)
    assert [d.name for d in deployments] == [s["name"] for s in specs]
    for deployment, spec in zip(deployments, specs):
        assert deployment.parameters == spec["parameters"]
        assert all(s.active is False for s in deployment.schedules)
        assert deployment.schedules[0].schedule.cron == spec["schedules"][0]["cron"]


def test_deployment_parameters_are_valid_configurations():
    from prefect.flows import load_flow_from_entrypoint

    from privseed.tasks.config.commands import (AugPeConfig, DpKpsConfig, EvaluateConfig, ExperimentConfig, SecPeConfig,
                                                validate_config)

    # every flow a deployment names takes its configuration as one typed parameter, its model (a dict validates)
    models = {"dpkps_flow": DpKpsConfig, "augpe_flow": AugPeConfig, "secpe_flow": SecPeConfig,
              "evaluate": EvaluateConfig, "experiment": ExperimentConfig}
    for spec in serve.load_deployment_specs():
        flow = load_flow_from_entrypoint(spec["entrypoint"])
        flow.validate_parameters(spec["parameters"])  # names and types against the flow's signature
        validate_config(models[spec["entrypoint"].rsplit(":", 1)[1]], spec["parameters"]["config"])
        for value in _paths(spec["parameters"]):
            assert (REPO / value).exists() or value.startswith(("runs/", "s3://")), f"{spec['name']}: {value}"


def _paths(parameters: dict) -> list[str]:
    """Parameter values that name repository files (inputs the deployment reads)."""
    found = []
    for key, value in parameters.items():
        if isinstance(value, dict):
            found += _paths(value)
        elif key.startswith("dask_tls_"):
            continue  # the compose stack's mount (/tls, made by infra/make_tls.py), not a repository file
        elif isinstance(value, str) and ("/" in value) and not value.startswith(("tcp://", "tls://")):
            found.append(value)
    return found


@pytest.mark.parametrize("entrypoint, model", [
    ("flows/dpkps.py:dpkps_flow", "DpKpsConfig"), ("flows/evolution.py:augpe_flow", "AugPeConfig"),
    ("flows/evolution.py:secpe_flow", "SecPeConfig"), ("flows/evaluate.py:evaluate", "EvaluateConfig"),
    ("flows/experiment.py:experiment", "ExperimentConfig")])
def test_flow_parameters_are_typed_with_every_option(entrypoint, model):
    """A deployment's form is built from this schema: every option of the command's model with its type,
    default, choices and help, and no other key (a typo is refused when the run is submitted)."""
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema

    from privseed.tasks.config import commands as config_module

    schema = parameter_schema(load_flow_from_entrypoint(entrypoint).fn).model_dump()
    assert schema["properties"]["config"]["$ref"].endswith("/" + model) and "config" in schema["required"]
    typed = schema["definitions"][model]
    fields = getattr(config_module, model).model_fields
    assert set(typed["properties"]) == set(fields)
    assert typed["additionalProperties"] is False
    for name, field in fields.items():
        shown = typed["properties"][name]
        assert shown.get("description") == field.description, name
        assert "type" in shown or "anyOf" in shown or "enum" in shown or "$ref" in shown, name
    if model == "DpKpsConfig":
        assert typed["properties"]["method"]["enum"][:1] == ["independent"]
        for budget in ("eps_voc", "eps_kde", "epsilon"):  # the server refuses epsilon 0 at submission
            assert typed["properties"][budget]["exclusiveMinimum"] == 0


def test_unknown_deployment_name_is_refused():
    with pytest.raises(SystemExit, match="no deployment named nope"):
        serve.runner_deployments(serve.load_deployment_specs(), ["nope"])


def _dpkps_runs(env: dict) -> list[str]:
    """The ids of the dpkps flow runs on the session's server (other tests' runs included)."""
    listed = subprocess.run([PREFECT, "flow-run", "ls", "--flow-name", "dpkps", "--limit", "200"],
                            env={**env, "COLUMNS": "300"}, capture_output=True, text=True, timeout=60)
    return sorted(line.split()[1] for line in listed.stdout.splitlines() if line.startswith("│"))


def _stop(process: subprocess.Popen) -> None:
    """SIGINT first (a Prefect worker/runner ignores SIGTERM for a while), then kill the process group."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


@pytest.fixture
def local_server(prefect_harness, tmp_path):
    """The session's local Prefect server (the same API app `prefect server start` runs, on 127.0.0.1);
    yields the environment a client process (serve.py, the prefect CLI) needs to reach it."""
    from prefect.settings import get_current_settings

    url = str(get_current_settings().api.url)
    assert url.startswith("http://127.0.0.1:")
    return {**os.environ, "PREFECT_API_URL": url, "PREFECT_HOME": str(tmp_path / "prefect-client")}


@pytest.mark.slow
def test_served_deployment_runs_once_on_a_local_server(local_server, tmp_path, tiny_corpus):
    corpus = tmp_path / "corpus.parquet"
    tiny_corpus.to_parquet(corpus, index=False)
    out = tmp_path / "release"
    log = tmp_path / "serve.log"
    runner = subprocess.Popen([sys.executable, "deployments/serve.py", "--only", "dpkps-demo"], cwd=REPO,
                              stdout=log.open("wb"), stderr=subprocess.STDOUT, env=local_server,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "Your deployments are being served" not in log.read_text():
            assert runner.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "serve.py did not register its deployment:\n" + log.read_text()[-3000:]
            time.sleep(1)

        # Sequences of the paper's length 10: with --llm none a text is its sequence, and on this tiny corpus a
        # class's noisy KDE can sit on one term, so at length 5 two equal sequences (and a failed duplicate-rate
        # gate) came up in about one run in six; at length 10 it is under one in a hundred.
        config = {"data": str(corpus), "out": str(out), "llm": "none", "per_class": 4, "length": 10,
                  "method": "independent", "vocab_top": 20000, "vocab_size": 40, "n_features": 64, "n_workers": 1,
                  "seed": 3,
                  "labels": ["0", "1", "2"]}
        triggered = subprocess.run(
            [PREFECT, "deployment", "run", "dpkps/dpkps-demo", "--params", json.dumps({"config": config}),
             "--watch", "--watch-timeout", "400"],
            cwd=REPO, env=local_server, capture_output=True, text=True, timeout=450,
        )
        shown = triggered.stdout + triggered.stderr
        assert triggered.returncode == 0, shown + "\n--- serve.log ---\n" + log.read_text()[-4000:]
        assert "Flow run finished successfully in 'Completed'" in shown, shown
        assert "publish-release" in shown  # --watch shows every task run of the flow

        # The server checks a submitted run against the flow's typed schema: epsilon 0 and an unknown option
        # are refused before any run exists, and the message names the field.
        before = _dpkps_runs(local_server)
        for bad, named in (({**config, "eps_voc": 0}, "eps_voc"), ({**config, "eps_vocab": 1.0}, "eps_vocab")):
            refused = subprocess.run(
                [PREFECT, "deployment", "run", "dpkps/dpkps-demo", "--params", json.dumps({"config": bad})],
                cwd=REPO, env=local_server, capture_output=True, text=True, timeout=120)
            said = refused.stdout + refused.stderr
            assert refused.returncode != 0 and named in said, said
        assert _dpkps_runs(local_server) == before  # no run was created for either
    finally:
        _stop(runner)

    wide = {**local_server, "COLUMNS": "300"}  # the CLI's tables cut their cells to the terminal's width
    artifacts = subprocess.run([PREFECT, "artifact", "ls"], env=wide, capture_output=True, text=True, timeout=60)
    for key in ("release-ledger", "release-link"):
        assert key in artifacts.stdout, artifacts.stdout

    from privseed.tasks.data.corpus import read_release

    manifest, synthetic = read_release(str(out))
    assert manifest["rows"] == len(synthetic) == 12  # 3 classes x per_class 4, from the run's parameters
    assert (out / "ledger.json").exists() and (out / "quality.json").exists()
    assert json.loads((out / "quality.json").read_text())["success"] is True

    inspected = subprocess.run([PREFECT, "deployment", "inspect", "dpkps/dpkps-demo"], env=local_server,
                               capture_output=True, text=True, timeout=60)
    assert "'active': False" in inspected.stdout  # the cron schedule ships inactive
    assert "'enforce_parameter_schema': True" in inspected.stdout
    from privseed.tasks.config.commands import DpKpsConfig

    for name in DpKpsConfig.model_fields:  # every option of the command line is a typed field of the form
        assert f"'{name}': {{" in inspected.stdout, name
    assert "'cron': '0 3 * * *'" in inspected.stdout
