"""The command line as a user meets it: it answers at once, and every bad input is one line on stderr, exit status 2,
before Prefect, Dask or torch is imported (so before any server or cluster starts)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
#: Modules whose import starts (or prepares) the heavy machinery: none may be imported to answer --help or to refuse
#: a bad input.
HEAVY = ("prefect", "dask", "distributed", "torch", "scipy", "sklearn", "great_expectations", "sentence_transformers")


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300,
                          cwd=REPO)


_RUN = """
import contextlib, io, json, sys
from privseed.flows.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exit:
            code = exit.code
    results.append({"argv": argv, "code": code, "err": err.getvalue()})
heavy = sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)
print(json.dumps({"results": results, "heavy": heavy}))
"""


def run_cli(*commands: list[str]) -> tuple[list[dict], list[str]]:
    """Each command line through privseed.flows.cli.main in one fresh process: (exit code and stderr of each, the
    heavy modules that process imported)."""
    done = _python(_RUN, json.dumps([list(map(str, c)) for c in commands]), json.dumps(HEAVY))
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return answer["results"], answer["heavy"]


def test_help_and_version_import_nothing_heavy():
    code = ("import sys; from privseed.flows.cli import main\n"
            "for argv in (['--help'], ['--version'], ['dpkps', '--help'], ['evaluate', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules))")
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "HEAVY []"
    assert "privseed 0." in done.stdout and "--eps-kde" in done.stdout and "--synthetic" in done.stdout


def test_help_shows_required_flags_as_required():
    """Issue 31: "required flags show as optional". The usage line names what a run needs, without brackets, and a
    "required" section lists it first; the rest are [options]."""
    code = ("import sys; from privseed.flows.cli import main\n"
            "try:\n    main([sys.argv[1], '--help'])\nexcept SystemExit:\n    pass\n")
    dpkps = _python(code, "dpkps").stdout
    assert dpkps.startswith("usage: privseed dpkps DATA --out OUT (--labels A,B,... | --labels-file FILE) [options]\n")
    required = dpkps.split("\nrequired:\n", 1)[1].split("\n\n", 1)[0]
    assert "--out OUT" in required and "(required)" in required and "(required: --labels or --labels-file)" in required
    assert "--eps-kde" not in required and "--eps-kde" in dpkps
    evaluate = _python(code, "evaluate").stdout
    assert evaluate.startswith("usage: privseed evaluate --synthetic OUT --test PATH [options]\n")
    assert "[--synthetic" not in evaluate and "[--test" not in evaluate
    demo = _python(code, "demo").stdout  # nothing required: every flag is an option
    assert demo.startswith("usage: privseed demo [options]\n") and "\nrequired:" not in demo


def test_a_missing_required_flag_is_one_line_that_names_it():
    results, heavy = run_cli(["evaluate", "--test", "t.parquet"])
    assert results[0]["code"] == 2 and heavy == []
    assert results[0]["err"].strip() == (
        "privseed evaluate: error: invalid configuration: --synthetic: a value is required (on the command line, "
        "as `synthetic` in the --config file or as PRIVSEED_SYNTHETIC)")


def test_a_run_keeps_great_expectations_bookkeeping_off_the_terminal(tmp_path):
    """A dpkps run printed about 200 INFO lines of Great Expectations' own ("Skipping registering function ...")
    among its 260 lines of stderr; --verbose keeps them."""
    code = ("import logging, sys; from privseed.flows.cli import main\n"
            "main(sys.argv[1:])\n"
            "print('LEVEL', logging.getLogger('great_expectations').getEffectiveLevel())")
    missing = ["dpkps", str(tmp_path / "missing.parquet"), "--out", str(tmp_path / "out"), "--labels", "a,b"]
    assert _python(code, *missing).stdout.strip().splitlines()[-1] == f"LEVEL {logging.WARNING}"
    assert _python(code, "-v", *missing).stdout.strip().splitlines()[-1] == f"LEVEL {logging.DEBUG}"


def test_importing_privseed_changes_no_process_wide_setting():
    code = ("import logging, os; before = dict(os.environ)\n"
            "import privseed, privseed.flows.dpkps, privseed.flows.evaluate, privseed.tasks.stages\n"
            # scikit-learn's own import sets KMP_DUPLICATE_LIB_OK / KMP_INIT_AT_FORK: not privseed's doing
            "changed = sorted(k for k in set(os.environ) | set(before) if os.environ.get(k) != before.get(k)\n"
            "                 and not k.startswith('KMP_'))\n"
            "quiet = [n for n in ('httpx', 'botocore') if logging.getLogger(n).level]\n"
            "print('CHANGED', changed, quiet)")
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "CHANGED [] []"


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory) -> dict[str, tuple[list[str], str]]:
    """Each bad input of issue 31 and the words its one line must hold."""
    tmp = tmp_path_factory.mktemp("bad")
    frame = pd.DataFrame({"text": ["a football club", "a river valley", "an album"] * 2, "label": [0, 1, 2] * 2})
    frame.to_csv(tmp / "as-csv.parquet", index=False)
    frame.iloc[:0].to_parquet(tmp / "empty.parquet")
    (tmp / "empty.csv").write_text("text,label\n")
    frame.rename(columns={"label": "y"}).to_parquet(tmp / "wrong-column.parquet")
    frame.rename(columns={"text": "body"}).to_csv(tmp / "wrong-column.csv", index=False)
    frame.to_parquet(tmp / "good.parquet")
    (tmp / "notes.txt").write_text("a football club\n")
    out = ["--out", str(tmp / "out"), "--labels", "0,1,2"]
    return {
        "missing": (["dpkps", tmp / "missing.parquet", *out], "missing.parquet does not exist"),
        "empty parquet": (["dpkps", tmp / "empty.parquet", *out], "is empty"),
        "empty csv": (["dpkps", tmp / "empty.csv", *out], "is empty"),
        "csv named parquet": (["dpkps", tmp / "as-csv.parquet", *out],
                              "looks like CSV text, not Parquet; name it .csv"),
        "wrong column": (["dpkps", tmp / "wrong-column.parquet", *out], "no column 'label'"),
        "wrong column csv": (["dpkps", tmp / "wrong-column.csv", *out], "no column 'text'"),
        "other format": (["dpkps", tmp / "notes.txt", *out], "cannot read .txt files"),
        "missing model": (["dpkps", tmp / "good.parquet", *out, "--llm", "local:/nonexistent.gguf"],
                          "the model file /nonexistent.gguf does not exist"),
        "no labels": (["dpkps", tmp / "good.parquet", "--out", tmp / "out"], "no label set declared"),
        "epsilon 0": (["dpkps", tmp / "good.parquet", *out, "--eps-kde", "0"], "--eps-kde: epsilon must be > 0"),
        "mistyped flag": (["dpkps", tmp / "good.parquet", *out, "--eps-kdx", "1"], "did you mean --eps-kde?"),
        "mistyped command": (["dpkp", tmp / "good.parquet"], "did you mean 'dpkps'?"),
        "bad choice": (["dpkps", tmp / "good.parquet", *out, "--mechanism", "laplase"], "did you mean 'laplace'?"),
        "secpe public": (["secpe", tmp / "good.parquet", *out, "--public", tmp / "missing-public.parquet",
                         "--noise-multiplier", "3"],
                         "missing-public.parquet does not exist"),
        "evaluate no release": (["evaluate", "--synthetic", tmp / "nowhere", "--test", tmp / "good.parquet"],
                                "manifest.json is missing"),
        "evaluate test column": (["evaluate", "--synthetic", tmp / "nowhere", "--test", tmp / "wrong-column.csv"],
                                 "manifest.json is missing"),
        "anthropic key": (["dpkps", tmp / "good.parquet", *out, "--llm", "anthropic:claude-x"],
                          "set ANTHROPIC_API_KEY"),
    }


def test_every_bad_input_is_one_line_and_exit_2_before_prefect_starts(bad_inputs, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    names = list(bad_inputs)
    results, heavy = run_cli(*(bad_inputs[name][0] for name in names))
    for name, result in zip(names, results):
        expected = bad_inputs[name][1]
        lines = result["err"].strip().splitlines()
        assert result["code"] == 2, f"{name}: exit {result['code']}, {result['err']}"
        assert len(lines) == 1, f"{name}: {len(lines)} lines on stderr:\n{result['err']}"
        assert expected in lines[0], f"{name}: {lines[0]!r} does not say {expected!r}"
        assert lines[0].startswith("privseed"), lines[0]
    assert heavy == [], f"refusing bad input imported {heavy}"
    assert not any((Path(p).parent / "out").exists() or (Path(p).parent / "out.private").exists()
                   for p in [bad_inputs["missing"][0][1]])  # nothing written by a refused run


def test_the_traceback_only_with_verbose(bad_inputs):
    argv = bad_inputs["wrong column"][0]
    quiet, verbose = run_cli(argv, ["-v", *argv])[0]
    assert "Traceback" not in quiet["err"] and "Traceback" in verbose["err"]
    assert verbose["err"].strip().splitlines()[-1] == quiet["err"].strip()
