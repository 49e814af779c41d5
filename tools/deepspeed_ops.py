"""DeepSpeed's CPU ops compiled into this environment's DeepSpeed, from a wheel built once per machine.

``cpu_adam`` (the optimizer of the zero3-offload preset) and ``deepspeed_shm_comm`` (the shared-memory collectives of
a CPU world) are C++ that DeepSpeed otherwise compiles on first use (JIT, under ``~/.cache/torch_extensions``). That
build is keyed to the environment's paths and file times, so every fresh environment — each clean clone's
``make install`` — compiled both again inside the first test that used them (about a minute on 2 cores).

Here the DeepSpeed wheel with both ops is built once (``pip wheel``, ``DS_BUILD_CPU_ADAM=1 DS_BUILD_SHM_COMM=1``;
about 3 minutes on 2 cores) into ``$ATLAS_CACHE_DIR/deepspeed-ops/<key>/`` and installed from there; the key is
DeepSpeed's, torch's and Python's versions, the compiler and this CPU's flags (the ops are built ``-march=native``).
DeepSpeed then loads them as it loads any pre-built op (``installed_ops``). When they cannot be built (no compiler,
no network for the source), it says so in one line and DeepSpeed compiles them on first use, as before.

    python -m tools.deepspeed_ops      # make install runs it
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from atlas_contract.cache import cache_root

OPS = {"cpu_adam": "DS_BUILD_CPU_ADAM", "deepspeed_shm_comm": "DS_BUILD_SHM_COMM"}


def installed_ops() -> dict[str, object]:
    """DeepSpeed's record of the ops its install compiled (``installed_ops``, deepspeed/git_version_info_installed.py),
    read without importing DeepSpeed (and torch); empty when DeepSpeed is not installed."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return {}
    record = Path(next(iter(spec.submodule_search_locations))) / "git_version_info_installed.py"
    if not record.is_file():
        return {}
    for node in ast.parse(record.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "installed_ops" for t in node.targets):
            return dict(ast.literal_eval(node.value))
    return {}


def key() -> str:
    """What the built ops depend on: DeepSpeed's, torch's and Python's versions, the compiler, this CPU's flags."""
    try:
        compiler = subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    except OSError:
        compiler = []
    flags = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "")
    parts = [
        importlib.metadata.version("deepspeed"),
        importlib.metadata.version("torch"),
        sys.version,
        platform.machine(),
        *compiler,
        flags,
    ]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return f"deepspeed-{importlib.metadata.version('deepspeed')}-{digest}"


def build_wheel(folder: Path) -> Path:
    """The DeepSpeed wheel with the ops, built into ``folder`` (atomically: a build cut short leaves nothing)."""
    version = importlib.metadata.version("deepspeed")
    env = dict(os.environ, DS_ACCELERATOR="cpu", DS_BUILD_OPS="0", **dict.fromkeys(OPS.values(), "1"))
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as staging:
        # --no-cache-dir: pip's cache holds the wheel built without the ops, which it would hand back.
        command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        subprocess.run([*command, "--no-cache-dir", "-w", staging, f"deepspeed=={version}"], env=env, check=True)
        (wheel,) = Path(staging).glob("deepspeed-*.whl")
        staged = Path(staging) / "done"
        staged.mkdir()
        wheel.rename(staged / wheel.name)
        try:
            staged.rename(folder)
        except OSError:  # another build got there first
            if not any(folder.glob("deepspeed-*.whl")):
                raise
    return next(folder.glob("deepspeed-*.whl"))


def main() -> int:
    if importlib.util.find_spec("deepspeed") is None:
        return 0
    if all(installed_ops().get(op) for op in OPS):
        print("deepspeed ops: cpu_adam, deepspeed_shm_comm already compiled into this environment's DeepSpeed")
        return 0
    folder = cache_root() / "deepspeed-ops" / key()
    wheel = next(folder.glob("deepspeed-*.whl"), None)
    try:
        if wheel is None:
            print(f"deepspeed ops: building DeepSpeed with cpu_adam and deepspeed_shm_comm once into {folder} ...")
            wheel = build_wheel(folder)
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--force-reinstall"]
        subprocess.run([*command, str(wheel)], check=True)
    except (subprocess.CalledProcessError, OSError, ValueError) as exc:
        print(f"deepspeed ops: not pre-built ({exc}); DeepSpeed compiles them on first use instead")
        return 0
    print(f"deepspeed ops: cpu_adam, deepspeed_shm_comm installed from {wheel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
