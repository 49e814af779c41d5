"""Static checks of the container images (no Docker engine needed).

The Dockerfiles are parsed for what a reviewer would check by hand (non-root USER, entrypoints,
what gets copied and installed, no network beyond package indexes); the trainer entrypoint is run
for real with stub ``accelerate``/``trl``/``vllm`` executables on PATH; the image's version pins are
compared with pyproject.toml.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
TRAINER_DOCKERFILE = REPO / "trainer_image" / "Dockerfile"
OPERATOR_DOCKERFILE = REPO / "operator" / "Dockerfile"
ENTRYPOINT = REPO / "trainer_image" / "entrypoint.sh"
REQUIREMENTS = REPO / "trainer_image" / "requirements.txt"
DOCKERFILES = [TRAINER_DOCKERFILE, OPERATOR_DOCKERFILE]
BASH = shutil.which("bash")


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        op, _, rest = line.partition(" ")
        out.append((op.upper(), rest.strip()))
    assert not pending, f"{dockerfile}: dangling line continuation"
    return out


def last(dockerfile: Path, op: str) -> str:
    values = [rest for o, rest in instructions(dockerfile) if o == op]
    assert values, f"{dockerfile.relative_to(REPO)} has no {op}"
    return values[-1]


# --------------------------------------------------------------------------- Dockerfiles


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_final_user_is_not_root(dockerfile):
    user = last(dockerfile, "USER").split(":")[0]
    assert user not in {"root", "0", ""}, user
    # nothing after the last USER switches back to root
    ops = instructions(dockerfile)
    idx = max(i for i, (o, _) in enumerate(ops) if o == "USER")
    assert all(o != "USER" for o, _ in ops[idx + 1 :])


def test_operator_user_matches_chart_run_as_user():
    import yaml

    values = yaml.safe_load((REPO / "charts" / "atlas-operator" / "values.yaml").read_text())
    uid = last(OPERATOR_DOCKERFILE, "USER").split(":")[0]
    assert int(uid) == values["securityContext"]["runAsUser"] == values["podSecurityContext"]["runAsUser"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_network_beyond_package_indexes(dockerfile):
    runs = " ".join(rest for op, rest in instructions(dockerfile) if op == "RUN")
    for forbidden in (
        r"\bgit\s+clone\b",
        r"\bcurl\b",
        r"\bwget\b",
        r"huggingface-cli",
        r"\bhf\s+download\b",
        r"snapshot_download",
        r"git\+https?://",
        r"--index-url",
        r"--extra-index-url",
    ):
        assert not re.search(forbidden, runs), f"{dockerfile.name}: RUN uses {forbidden}"
    assert not [rest for op, rest in instructions(dockerfile) if op == "ADD"], "use COPY, not ADD (no remote URLs)"


def _dockerignore_allows(path: str) -> bool:
    """Evaluate .dockerignore (last matching pattern wins; `!` re-includes) for a context path."""
    allowed = True
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatch(p, pattern[3:]) for p in parts)
        else:
            hit = any(fnmatch.fnmatch(p, pattern) for p in prefixes)
        if hit:
            allowed = negate
    return allowed


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_copy_sources_exist_and_are_in_the_build_context(dockerfile):
    copies = [rest for op, rest in instructions(dockerfile) if op == "COPY"]
    assert copies
    for rest in copies:
        args = [a for a in rest.split() if not a.startswith("--")]
        for src in args[:-1]:
            assert (REPO / src).exists(), f"{dockerfile.name}: COPY {src}: no such path in the repo"
            assert _dockerignore_allows(src), f"{dockerfile.name}: COPY {src}: excluded by .dockerignore"


def test_dockerignore_keeps_local_junk_out():
    for path in (".venv/bin/python", ".git/HEAD", "tests/test_cli.py", "atlas_core/__pycache__/x.pyc", "outputs/x"):
        assert not _dockerignore_allows(path), path


def test_operator_dockerfile():
    ops = instructions(OPERATOR_DOCKERFILE)
    assert ops[0] == ("FROM", "python:3.11-slim")
    assert json.loads(last(OPERATOR_DOCKERFILE, "ENTRYPOINT")) == ["atlas"]
    assert json.loads(last(OPERATOR_DOCKERFILE, "CMD")) == ["operator"]
    runs = " ".join(rest for op, rest in ops if op == "RUN")
    extras = re.findall(r"\.\[([\w,-]+)\]", runs)
    assert extras == ["operator"], f"operator image must install only the operator extra, got {extras}"
    assert "torch" not in runs and "requirements.txt" not in runs


def test_trainer_dockerfile():
    ops = instructions(TRAINER_DOCKERFILE)
    text = TRAINER_DOCKERFILE.read_text()
    base = re.search(r"^ARG CUDA_IMAGE=(\S+)", text, re.M)
    assert base and base.group(1).startswith("nvidia/cuda:"), "CUDA base image"
    copied = {rest.split()[-2] for op, rest in ops if op == "COPY"}
    for needed in (
        "atlas_core",
        "accelerate",
        "reward_system",
        "trainer_image/requirements.txt",
        "trainer_image/entrypoint.sh",
    ):
        assert needed in copied, f"trainer image does not COPY {needed}"
    assert any("pyproject.toml" in rest for op, rest in ops if op == "COPY")
    runs = " ".join(rest for op, rest in ops if op == "RUN")
    assert re.search(r"\.\[train\]", runs), "trainer image must install .[train]"
    assert "-r /opt/atlas/requirements.txt" in runs
    assert json.loads(last(TRAINER_DOCKERFILE, "ENTRYPOINT")) == ["/usr/local/bin/atlas-entrypoint"]
    exposed = set(" ".join(rest for op, rest in ops if op == "EXPOSE").split())
    assert {"9400", "8000", "51216"} <= exposed


# --------------------------------------------------------------------------- pins


def _pins(lines) -> dict[str, Requirement]:
    reqs = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            reqs[req.name.lower()] = req
    return reqs


def test_requirements_pins_match_pyproject():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    train = _pins(pyproject["project"]["optional-dependencies"]["train"])
    image = _pins(REQUIREMENTS.read_text().splitlines())
    for name in ("trl", "transformers", "deepspeed"):
        assert str(image[name].specifier) == str(train[name].specifier), (name, image[name], train[name])
        assert str(train[name].specifier).startswith("=="), f"pyproject no longer pins {name}"
    for name in ("torch", "accelerate"):  # pinned in the image, within pyproject's range
        (spec,) = image[name].specifier
        assert spec.operator == "==", f"image must pin {name}"
        assert train[name].specifier.contains(spec.version), (name, spec, train[name])
    # torch agrees with constraints.txt (what CPU development and CI run)
    constraints = _pins((REPO / "constraints.txt").read_text().splitlines())
    assert image["torch"].specifier == constraints["torch"].specifier


def test_vllm_pin_is_in_trls_supported_range():
    image = _pins(REQUIREMENTS.read_text().splitlines())
    (spec,) = image["vllm"].specifier
    assert spec.operator == "=="
    # TRL 1.16.0 (trl/import_utils.py is_vllm_available) supports vLLM 0.22.0 … 0.31.0
    assert Version("0.22.0") <= Version(spec.version) <= Version("0.31.0"), spec


# --------------------------------------------------------------------------- entrypoint


def test_entrypoint_syntax_and_mode():
    assert BASH, "bash is required"
    subprocess.run([BASH, "-n", str(ENTRYPOINT)], check=True)
    assert os.access(ENTRYPOINT, os.X_OK), "entrypoint.sh must be executable"
    assert ENTRYPOINT.read_text().startswith("#!/usr/bin/env bash\n")


@pytest.fixture
def stub_path(tmp_path) -> Path:
    """A PATH holding only stub accelerate/trl/vllm/atlas that print their name, pid and argv."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("accelerate", "trl", "vllm", "atlas"):
        stub = bindir / tool
        stub.write_text(
            "#!/bin/sh\n"
            f'printf "%s\\n" "tool={tool}" "pid=$$"\n'
            'for a in "$@"; do printf "arg=%s\\n" "$a"; done\n'
            'exit "${STUB_EXIT:-0}"\n'
        )
        stub.chmod(0o755)
    return bindir


def run_entrypoint(stub_path: Path, *args: str, exit_code: int = 0) -> tuple[subprocess.CompletedProcess, dict]:
    env = {"PATH": f"{stub_path}:/usr/bin:/bin", "STUB_EXIT": str(exit_code)}
    proc = subprocess.Popen(
        [BASH, str(ENTRYPOINT), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    out, err = proc.communicate(timeout=30)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    parsed: dict = {"args": []}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key == "arg":
            parsed["args"].append(value)
        else:
            parsed[key] = value
    parsed["launcher_pid"] = proc.pid
    return done, parsed


# The rollout role runs what TRL 1.16's deprecated `trl vllm-serve` runs (trl/scripts/vllm_serve.py): vllm serve with
# its weight-transfer and logprob flags (checked against TRL's own build_command in test_render_servers.py).
TRL_SERVER_FLAGS = ["--weight-transfer-config", '{"backend": "nccl"}', "--logprobs-mode", "processed_logprobs",
                    "--max-logprobs", "-1"]  # fmt: skip  # a command line: each flag beside its value


@pytest.mark.parametrize(
    ("role", "tool", "prefix", "suffix"),
    [
        ("train", "accelerate", ["launch"], []),
        ("rollout", "vllm", ["serve"], TRL_SERVER_FLAGS),
        ("serve", "vllm", ["serve"], []),
    ],
)
def test_entrypoint_roles(stub_path, role, tool, prefix, suffix):
    user_args = ["--config_file", "accelerate/deepspeed_zero3.yaml", "-m", "atlas_core.cli.train", "a b  c", ""]
    proc, out = run_entrypoint(stub_path, role, *user_args)
    assert proc.returncode == 0, proc.stderr
    assert out["tool"] == tool
    assert out["args"] == prefix + user_args + suffix  # spaces and empty arguments preserved, role word dropped
    assert int(out["pid"]) == out["launcher_pid"], "the role must exec (signals reach the server directly)"


def test_entrypoint_passes_other_commands_through(stub_path):
    proc, out = run_entrypoint(stub_path, "atlas", "demo", "--steps", "3")
    assert proc.returncode == 0, proc.stderr
    assert out["tool"] == "atlas" and out["args"] == ["demo", "--steps", "3"]
    assert int(out["pid"]) == out["launcher_pid"]


def test_entrypoint_propagates_exit_status(stub_path):
    proc, _ = run_entrypoint(stub_path, "train", "x.py", exit_code=3)
    assert proc.returncode == 3


def test_entrypoint_without_arguments_prints_usage(stub_path):
    proc, out = run_entrypoint(stub_path)
    assert proc.returncode == 64
    assert "rollout" in proc.stderr and "tool" not in out
    proc, _ = run_entrypoint(stub_path, "--help")
    assert proc.returncode == 0 and "vllm serve" in proc.stderr and "--weight-transfer-config" not in proc.stderr


def test_entrypoint_unknown_command_fails(stub_path):
    proc, _ = run_entrypoint(stub_path, "definitely-not-a-command-xyz")
    assert proc.returncode == 127


def test_the_bundled_rim_configs_ship_in_the_wheel(tmp_path):
    """reward_system/ is package data: the wheel the images install carries every bundled config, where
    atlas_contract.checks looks for it (the reward_system package, not a folder beside the source tree)."""
    import zipfile

    from atlas_contract.checks import bundled_reward_configs

    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("atlas_k8s-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert bundled_reward_configs()
    for config in bundled_reward_configs():
        assert f"reward_system/{config}.yaml" in names
    assert "atlas_cli/main.py" in names and "atlas_contract/checks.py" in names
