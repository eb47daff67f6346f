# Tide developer entry points. `make up` starts a local Tide; `make test` runs every test.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_PIN ?= torch==2.13.0
MODEL ?= dummy:tiny

.PHONY: install up test lint fmt typecheck bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_PIN)"
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Until the job service lands, `make up` runs one generation on the default model.
up: $(STAMP)
	$(BIN)/tide generate --model $(MODEL) --prompt "Once upon a time" --max-tokens 32

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP) lint typecheck
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python scripts/bench_engine.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
