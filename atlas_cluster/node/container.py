"""One container's state as its pod's worker keeps it (runs, restarts, state, probes' counters, fake GPUs) and its
processes: its process group, what it started (from /proc) and its cgroup (v2) when the host has one, so whatever
a container started (in sessions of its own too) dies with it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_V2 = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


def descendants(root: int) -> list[int]:
    """Every process ``root`` started, and theirs (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def cgroup_root(name: str) -> Path | None:
    """A cgroup v2 folder of our own, None when the host has no writable v2 hierarchy."""
    for base in CGROUP_V2:
        if (base / "cgroup.procs").exists() and (base / "cgroup.subtree_control").exists():
            root = base / name
            try:
                root.mkdir(exist_ok=True)
                return root
            except OSError:
                continue
    return None


@dataclass
class Probe:
    spec: dict
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0
    passed: bool | None = None  # the last verdict after thresholds (None: none yet)

    def due(self, started: float) -> bool:
        t = time.monotonic()
        if t < max(self.next_at, started + self.spec.get("initialDelaySeconds", 0)):
            return False
        self.next_at = t + self.spec.get("periodSeconds", 10)
        return True

    def record(self, ok: bool) -> None:
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= self.spec.get("successThreshold", 1):
                self.passed = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= self.spec.get("failureThreshold", 3):
                self.passed = False


@dataclass
class Container:
    spec: dict
    init: bool
    log: Path
    termination_file: Path
    sidecar: bool = False
    proc: subprocess.Popen | None = None
    restarts: int = 0
    runs: int = 0
    state: dict = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict | None = None
    ready: bool = False
    started: bool = False  # the startup probe passed (or there is none) in this run
    done: bool = False  # terminated and not to be restarted
    exit_code: int | None = None
    next_start: float = 0.0
    kill_at: float | None = None
    started_mono: float = 0.0
    log_offset: int = 0
    cgroup: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    probes: dict[str, Probe] = field(default_factory=dict)
    gpus: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec["name"]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_main(self, sig: int) -> None:
        if self.proc is not None and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def kill_all(self) -> None:
        """SIGKILL everything of the container: its process group, what it started, its cgroup's processes."""
        if self.proc is None:
            return
        pids = set(descendants(self.proc.pid)) | {self.proc.pid}
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                (self.cgroup / "cgroup.kill").write_text("1")
            with contextlib.suppress(OSError):
                pids |= {int(p) for p in (self.cgroup / "cgroup.procs").read_text().split()}
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def reap(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        if self.cgroup is not None:
            for _ in range(50):
                try:
                    self.cgroup.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
            self.cgroup = None
