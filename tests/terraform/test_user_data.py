"""How hosts get Tide: the user data of workers and control-plane hosts, rendered by
Terraform's own templatefile, installs the deployed wheel only after checking its SHA-256,
and nothing anywhere installs Tide by a bare name from a public index (the name `tide` on
PyPI is another project).

Rendering needs the terraform binary (no provider: nothing is downloaded); the install
step is then run with stand-ins for python, pip and S3.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.infra.fleet.wheel_files import WHEEL_NAME, make_wheel
from tide_fleet.infra.fleet.fleet_config import AwsConfig

MODULES = ROOT / "terraform/modules"
TEMPLATES = {
    "worker": MODULES / "worker_pool/templates/user_data.sh.tftpl",
    "host": MODULES / "control_plane/templates/host.sh.tftpl",
}
SHA = "ab" * 32
URI = f"s3://acme-123456789012-us-east-1/releases/{SHA}/{WHEEL_NAME}"
WHEEL_VARS = {"tide_wheel_s3_uri": URI, "tide_wheel_sha256": SHA, "tide_wheel_file": WHEEL_NAME}
COMMON = {"python": "python3", "env_file": "REDIS_URL='redis://r:6379/0'",
          "env_ssm_parameter": "", "region": "us-east-1", **WHEEL_VARS}  # fmt: skip
TEMPLATE_VARS: dict[str, dict[str, Any]] = {
    "worker": {**COMMON, "model": "", "model_is_s3": False, "model_local": "",
               "pool_name": "small", "worker_argv": "--pool small --buckets short",
               "stop_timeout_s": 295, "asg_name": "acme-small", "hook_name": "tide-drain"},
    "host": {**COMMON, "role": "controller", "files": {},
             "services": {"tide-controller": "/opt/tide/venv/bin/tide controller"}},
}  # fmt: skip
# Packages the bootstrap itself fetches by name, before Tide: pip and boto3 (to read S3).
INDEX_PACKAGES = {"pip", "boto3"}


def render(tmp: Path, overrides: dict[str, Any] | None = None) -> dict[str, str]:
    """Both templates through `templatefile`, in a configuration without providers."""
    exe = shutil.which("terraform")
    if exe is None:
        pytest.skip("terraform is not installed (not on PATH)")
    tmp.mkdir(parents=True, exist_ok=True)
    outputs = "".join(
        f'output "{k}" {{\n  value = templatefile({json.dumps(str(p))}, var.{k})\n}}\n'
        f'variable "{k}" {{\n  type = any\n}}\n'
        for k, p in TEMPLATES.items()
    )
    (tmp / "main.tf").write_text(outputs)
    values = {k: {**v, **(overrides or {})} for k, v in TEMPLATE_VARS.items()}
    (tmp / "terraform.tfvars.json").write_text(json.dumps(values))
    env = {"PATH": "/usr/bin:/bin", "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1",
           "HOME": str(tmp)}  # fmt: skip
    for args in (["init", "-input=false"], ["apply", "-input=false", "-auto-approve"]):
        proc = subprocess.run([exe, *args, "-no-color"], cwd=tmp, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run([exe, "output", "-json"], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return {k: v["value"] for k, v in json.loads(proc.stdout).items()}


def install_block(script: str) -> str:
    """The install step of a bootstrap: from `wheel=` to the `fi` closing it."""
    match = re.search(r"^wheel=.*?^fi$", script, re.M | re.S)
    assert match is not None, "no install step (wheel=... if ... fi) in the user data"
    return match.group(0)


def assert_installs_the_deployed_build(script: str, sha: str, uri: str) -> None:
    """Shared by the moto apply test (tests/terraform/test_terraform.py)."""
    block = install_block(script)
    wheel = f"/opt/tide/{uri.rsplit('/', 1)[1]}"
    assert f"wheel='{wheel}'" in block
    steps = [
        "/opt/tide/venv/bin/pip install --quiet --upgrade pip boto3",
        f"'{uri}' \"$wheel\" <<'PY'",
        f"echo '{sha}  '\"$wheel\" | sha256sum --check --status",
        "exit 1",
        '/opt/tide/venv/bin/pip install --quiet --force-reinstall --no-deps "$wheel"',
        '/opt/tide/venv/bin/pip install --quiet "$wheel"',
        f"echo '{sha}' >/opt/tide/wheel.sha256",
    ]
    positions = [block.find(s) for s in steps]
    assert -1 not in positions, [s for s, i in zip(steps, positions, strict=True) if i < 0]
    assert positions == sorted(positions), "install steps out of order"
    assert f"\"$(cat /opt/tide/wheel.sha256 2>/dev/null)\" != '{sha}'" in block
    assert_pip_installs_local_files(script, f"user data for {uri}")


def assert_pip_installs_local_files(text: str, where: str) -> None:
    """Every `pip install` line installs a local file (or pip/boto3 for the bootstrap)."""
    shell_vars = dict(re.findall(r"^(\w+)='([^']*)'$", text, re.M))
    for line in text.splitlines():
        if "pip install" not in line:
            continue
        args = shlex.split(line.split("pip install", 1)[1].split("#")[0])
        for arg in (a for a in args if not a.startswith("-")):
            value = shell_vars.get(arg[1:], arg) if arg.startswith("$") else arg
            assert value in INDEX_PACKAGES or value.startswith("/"), (
                f"{where}: `{line.strip()}` installs {arg!r} from a package index by name"
            )


def test_rendered_user_data_installs_the_deployed_wheel(tmp_path: Path) -> None:
    rendered = render(tmp_path)
    for name, script in rendered.items():
        assert_installs_the_deployed_build(script, SHA, URI)
        proc = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
        assert proc.returncode == 0, f"{name} user data is not valid bash: {proc.stderr}"
    # One install step for every host kind.
    assert install_block(rendered["worker"]) == install_block(rendered["host"])


# --- the install step, run with stand-ins --------------------------------------------------

PYTHON_STUB = """#!/bin/bash
# `python -m venv DIR`: a venv whose pip logs its arguments (a wheel install adds bin/tide) and
# whose python "downloads" $SERVED_WHEEL to its last argument.
set -e
dir="$3"
mkdir -p "$dir/bin"
cat >"$dir/bin/pip" <<SH
#!/bin/bash
echo "pip \\$*" >>"$LOG"
case "\\$*" in *.whl*) touch "$dir/bin/tide"; chmod +x "$dir/bin/tide" ;; esac
SH
cat >"$dir/bin/python" <<'SH'
#!/bin/bash
cat >/dev/null
echo "download $3 $4" >>"$LOG"
cp "$SERVED_WHEEL" "$4"
SH
chmod +x "$dir/bin/pip" "$dir/bin/python"
"""


def run_install(
    tmp: Path, script: str, served: Path, log: Path
) -> subprocess.CompletedProcess[str]:
    """The install step of `script` with /opt/tide at tmp/opt, S3 serving `served`."""
    opt = tmp / "opt"
    opt.mkdir(exist_ok=True)
    block = install_block(script).replace("/opt/tide", str(opt))
    return subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + block],
        env={"PATH": "/usr/bin:/bin", "LOG": str(log), "SERVED_WHEEL": str(served)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_install_step_checks_the_hash_and_reinstalls_another_build(tmp_path: Path) -> None:
    stub = tmp_path / "python3"
    stub.write_text(PYTHON_STUB)
    stub.chmod(0o755)
    build = make_wheel(tmp_path / "dist")
    sha = hashlib.sha256(build.read_bytes()).hexdigest()
    log, opt = tmp_path / "log", tmp_path / "opt"
    uri = f"s3://acme-bucket/releases/{sha}/{WHEEL_NAME}"
    over = {"python": str(stub), "tide_wheel_s3_uri": uri, "tide_wheel_sha256": sha}
    script = render(tmp_path / "tf", over)["worker"]

    # A fresh host: download, check, then install that file (Tide, then its dependencies).
    assert run_install(tmp_path, script, build, log).returncode == 0
    local = opt / WHEEL_NAME
    assert log.read_text().splitlines() == [
        "pip install --quiet --upgrade pip boto3",
        f"download {uri} {local}",
        f"pip install --quiet --force-reinstall --no-deps {local}",
        f"pip install --quiet {local}",
    ]
    assert (opt / "wheel.sha256").read_text().strip() == sha

    # The same build again: nothing to do.
    log.unlink()
    assert run_install(tmp_path, script, build, log).returncode == 0
    assert not log.exists()

    # Another build deployed: the recorded hash differs, so the host reinstalls.
    new = make_wheel(tmp_path / "new", body="# rebuilt\n")
    new_sha = hashlib.sha256(new.read_bytes()).hexdigest()
    over |= {"tide_wheel_sha256": new_sha}
    rerendered = render(tmp_path / "tf2", over)["worker"]
    assert run_install(tmp_path, rerendered, new, log).returncode == 0
    assert f"pip install --quiet --force-reinstall --no-deps {local}" in log.read_text()
    assert (opt / "wheel.sha256").read_text().strip() == new_sha


def test_install_step_stops_on_a_download_that_is_not_the_deployed_build(
    tmp_path: Path,
) -> None:
    stub = tmp_path / "python3"
    stub.write_text(PYTHON_STUB)
    stub.chmod(0o755)
    deployed = make_wheel(tmp_path / "dist")
    sha = hashlib.sha256(deployed.read_bytes()).hexdigest()
    tampered = make_wheel(tmp_path / "bucket", body="import os  # not what was deployed\n")
    over = {"python": str(stub), "tide_wheel_sha256": sha}
    for name, script in render(tmp_path / "tf", over).items():
        log = tmp_path / f"{name}.log"
        proc = run_install(tmp_path, script, tampered, log)
        assert proc.returncode == 1, name
        assert "tide bootstrap stopped:" in proc.stdout, proc.stdout + proc.stderr
        assert f"not the deployed {sha}; nothing installed" in proc.stdout
        lines = log.read_text().splitlines()
        installs = [line for line in lines if line.startswith("pip") and ".whl" in line]
        assert installs == [], f"{name} installed a wheel whose hash differs: {installs}"
        assert not (tmp_path / "opt/wheel.sha256").exists()


# --- no package fetched by bare name ---------------------------------------------------------


def scanned_files() -> list[Path]:
    files = [ROOT / "fleet.example.toml", *sorted((ROOT / "infra/fleet").glob("*.py"))]
    for pattern in ("**/*.tf", "**/*.tftpl"):
        files += [p for p in sorted((ROOT / "terraform").glob(pattern))
                  if ".terraform" not in p.parts]  # fmt: skip
    return files


def test_no_default_installs_a_package_by_name_from_an_index() -> None:
    files = scanned_files()
    assert any(p.suffix == ".tftpl" for p in files) and any(p.suffix == ".tf" for p in files)
    for path in files:
        assert_pip_installs_local_files(path.read_text(), str(path.relative_to(ROOT)))
    # Nothing defaults to a package name or a build: the hosts' Tide comes from the operator.
    for path in (ROOT / "terraform").glob("**/variables.tf"):
        blocks = re.findall(r'^variable "(tide_\w+)" \{(.*?)^\}', path.read_text(), re.M | re.S)
        for name, body in blocks:
            assert "default" not in body, f"{path.relative_to(ROOT)}: {name} has a default"
    assert "tide_package" not in AwsConfig.model_fields
    for name, field in AwsConfig.model_fields.items():
        if name.startswith("tide_"):
            assert field.default is None, f"AwsConfig.{name} defaults to {field.default!r}"
