"""The cluster's processes: each started in a session of its own with its output in ``<logs>/<name>.log``, recorded
in a pid file so that ``atlas cluster down`` (another process, later) stops exactly them, and nothing else."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

STOP_GRACE = 10.0


class ProcessFailed(RuntimeError):
    """A process exited while it was awaited; the message holds the end of its log."""


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Supervisor:
    """The processes of one cluster folder. ``pids.json`` maps name → pid and the process's start time (read from
    /proc), so a pid reused by an unrelated process after a reboot is never signalled."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.logs = directory / "logs"
        self.pid_file = directory / "pids.json"
        self.children: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None):
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,  # its own process group: stopped whole, never by a terminal's Ctrl-C
            )
        self.children[name] = proc
        self._record(name, proc.pid)
        return proc

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def check(self, name: str) -> None:
        """ProcessFailed if ``name`` (started by this supervisor) has exited."""
        proc = self.children[name]
        if proc.poll() is not None:
            raise ProcessFailed(f"{name} exited with {proc.returncode}; {self.log(name)}:\n{log_tail(self.log(name))}")

    def wait_until(self, name: str, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.check(name)
            with contextlib.suppress(Exception):
                if ready():
                    return
            if time.monotonic() > deadline:
                log = self.log(name)
                raise ProcessFailed(f"{what} not ready in {timeout:.0f} s; {log}:\n{log_tail(log)}")
            time.sleep(0.1)

    # ------------------------------------------------------------ the pid file, for `down` from another process

    def recorded(self) -> dict[str, dict[str, Any]]:
        try:
            return json.loads(self.pid_file.read_text())
        except (OSError, ValueError):
            return {}

    def _record(self, name: str, pid: int) -> None:
        entries = self.recorded()
        entries[name] = {"pid": pid, "started": _start_time(pid)}
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.pid_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries, indent=1))
        os.replace(tmp, self.pid_file)

    def running(self) -> dict[str, int]:
        """Recorded processes still alive (and still the ones recorded)."""
        return {
            name: entry["pid"]
            for name, entry in self.recorded().items()
            if _start_time(entry["pid"]) == entry["started"] and entry["started"] is not None
        }

    def stop(self, name: str, grace: float = STOP_GRACE, first: int = signal.SIGTERM) -> None:
        entry = self.recorded().get(name)
        if entry and _start_time(entry["pid"]) == entry["started"]:
            _stop_group(entry["pid"], grace, first)
        proc = self.children.pop(name, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
        entries = self.recorded()
        entries.pop(name, None)
        if entries:
            self.pid_file.write_text(json.dumps(entries, indent=1))
        else:
            self.pid_file.unlink(missing_ok=True)

    def kill(self, name: str) -> None:
        """SIGKILL ``name``'s process group at once, as a crash: no graceful shutdown, its connections reset."""
        self.stop(name, grace=0.0, first=signal.SIGKILL)

    def stop_all(self, order: Sequence[str] = ()) -> None:
        """Stop every recorded process: ``order`` first (dependents before what they depend on), then the rest."""
        names = list(self.recorded())
        for name in [n for n in order if n in names] + [n for n in reversed(names) if n not in order]:
            self.stop(name)


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie has exited
        return None
    return int(fields[19])


def _stop_group(pid: int, grace: float, first: int = signal.SIGTERM) -> None:
    """``first`` (SIGTERM) to the process group, SIGKILL to what is left after ``grace`` seconds."""
    for sig, wait in ((first, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reap it when it is our own child
            if _start_time(pid) is None:
                return
            time.sleep(0.05)
