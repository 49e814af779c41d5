"""The container runtime of a process node: a container's process started in the pod's network namespace and a
mount and UTS namespace of its own (its volumes bind-mounted at their paths, its hostname the pod's), its exit
recorded with its termination message, restarted per restartPolicy after a crash-loop backoff, and stopped with
SIGTERM then SIGKILL after the grace period."""

from __future__ import annotations

import contextlib
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from atlas_cluster.node.container import Container
from atlas_cluster.node.environment import Environment
from atlas_cluster.node.timestamps import now

MAX_TERMINATION_MESSAGE = 4096  # bytes the kubelet keeps of a termination message
FALLBACK_LOG_LINES = 80  # FallbackToLogsOnError: the log tail (at most 80 lines, at most 4096 bytes)
DEFAULT_GRACE_S = 30
BACKOFF_S = (1, 2, 4, 8, 16, 30)


class Runtime(Environment):
    """The worker's part that starts, restarts and stops its containers' processes."""

    def _start(self, c: Container) -> None:
        try:
            env, command = self._environment(c)
        except Exception as exc:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            c.next_start = time.monotonic() + 2
            return
        c.env = env
        c.termination_file.parent.mkdir(parents=True, exist_ok=True)
        c.termination_file.write_bytes(b"")  # a fresh, empty file each run
        mounts = self._mounts(c)
        lines = ["set -e", "read _ || true", "exec </dev/null"]  # wait until the node has put us in our cgroup
        if not self.host_network:
            lines.append(f"hostname {shlex.quote(self.hostname)}")
        for target, source, read_only in mounts:
            self.nodes.mount_point(target, source.is_dir())
            q = shlex.quote(target)
            lines.append(
                f"mkdir -p {q}" if source.is_dir() else f"[ -e {q} ] || {{ mkdir -p $(dirname {q}); : > {q}; }}"
            )
            lines.append(f"mount --bind {shlex.quote(str(source))} {q}")
            if read_only:
                lines.append(f"mount -o remount,bind,ro {q}")
        working = c.spec.get("workingDir")
        lines.append(
            f"mkdir -p {shlex.quote(working)}; cd {shlex.quote(working)}"
            if working
            else f"cd {shlex.quote(str(self.directory))}"
        )
        lines.append('exec "$@"')
        assert self.ip is not None, "the pod's network first"
        unshare = ["unshare", "--mount", "--propagation", "slave"] + ([] if self.host_network else ["--uts"])
        prefix = [] if self.host_network else self.nodes.network.exec_prefix(self.ip)
        argv = [*prefix, *unshare, "--", "/bin/sh", "-c", "\n".join(lines), c.name, *command]
        c.log.parent.mkdir(parents=True, exist_ok=True)
        with open(c.log, "ab") as log:
            c.log_offset = log.tell()
            c.proc = proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.directory,
            )
        if self.nodes.cgroups is not None:
            c.cgroup = self.nodes.cgroups / f"{self.uid[:13]}-{c.name}-{c.runs}"
            with contextlib.suppress(OSError):
                c.cgroup.mkdir(exist_ok=True)
                (c.cgroup / "cgroup.procs").write_text(str(proc.pid))
        with contextlib.suppress(OSError):
            assert proc.stdin is not None  # stdin=PIPE
            proc.stdin.write(b"\n")
            proc.stdin.close()
        if c.runs:
            c.restarts += 1
        c.runs += 1
        c.started_mono = time.monotonic()
        c.started = "startupProbe" not in c.probes
        c.ready = False
        c.state = {"running": {"startedAt": now()}}
        for probe in c.probes.values():
            probe.next_at, probe.successes, probe.failures, probe.passed = 0.0, 0, 0, None

    def _mounts(self, c: Container) -> list[tuple[str, Path, bool]]:
        """(mountPath, host folder or file, read only), outer paths first, the termination file last."""
        mounts = []
        for mount in c.spec.get("volumeMounts") or []:
            if self.nodes.workdir.is_relative_to(mount["mountPath"]):
                continue  # over the node's own folder (/tmp where the cluster lives): the host's folder stays
            source = self.volumes[mount["name"]]
            if mount.get("subPath"):
                source = source / mount["subPath"]
                if not source.exists():
                    source.mkdir(parents=True)
            # ConfigMap, Secret, downwardAPI and projected volumes are read-only, as the kubelet mounts them
            read_only = bool(mount.get("readOnly")) or mount["name"] in self.read_only_volumes
            mounts.append((mount["mountPath"], source, read_only))
        mounts.sort(key=lambda m: m[0].count("/"))
        mounts.append((c.spec.get("terminationMessagePath") or "/dev/termination-log", c.termination_file, False))
        return mounts

    def _exited(self, c: Container, code: int, final: bool = False) -> None:
        """Record the run's end; restart it later (per restartPolicy, after a backoff) unless ``final``."""
        assert c.proc is not None, "a run to end"
        c.kill_all()  # what the container left behind goes with it
        c.reap()
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": c.state.get("running", {}).get("startedAt", now()),
            "finishedAt": now(),
            "containerID": f"process://{c.proc.pid}",
        }
        message = self._termination_message(c, code)
        if message:
            terminated["message"] = message
        c.state = {"terminated": terminated}
        c.exit_code, c.proc, c.ready, c.started, c.kill_at = code, None, False, False, None
        policy = "Always" if c.sidecar else self.policy
        restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        if final or (c.init and not c.sidecar and code == 0) or not restart:
            c.done = True
            return
        delay = BACKOFF_S[min(c.runs - 1, len(BACKOFF_S) - 1)]
        c.last_state = terminated
        c.next_start = time.monotonic() + delay
        c.state = {
            "waiting": {"reason": "CrashLoopBackOff", "message": f"back-off {delay}s restarting container {c.name}"}
        }

    def _termination_message(self, c: Container, code: int) -> str:
        data = b""
        with contextlib.suppress(OSError):
            data = c.termination_file.read_bytes()[:MAX_TERMINATION_MESSAGE]
        if not data and code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            with contextlib.suppress(OSError), open(c.log, "rb") as log:
                log.seek(c.log_offset)
                lines = log.read().splitlines()[-FALLBACK_LOG_LINES:]
                data = b"\n".join(lines)[-MAX_TERMINATION_MESSAGE:]
        return data.decode("utf-8", "replace")

    def _grace(self, grace: Any) -> float:
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
        return max(float(grace), 0.0)

    def _stop_container(self, c: Container, grace: float) -> None:
        if c.alive():
            c.signal_main(signal.SIGTERM)
            c.kill_at = time.monotonic() + grace

    def _wait_stopped(self, containers: list[Container]) -> None:
        while any(c.alive() for c in containers):
            if self.gone:
                for c in containers:
                    c.kill_all()
            for c in containers:
                if c.kill_at is not None and time.monotonic() >= c.kill_at and c.alive():
                    c.kill_all()
            time.sleep(0.05)
        for c in containers:
            if c.proc is not None:
                code = c.proc.returncode
                self._exited(c, code if code >= 0 else 128 - code, final=True)
