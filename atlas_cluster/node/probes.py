"""Startup, readiness and liveness probes (httpGet, tcpSocket — a connection to the pod's IP at the port, named or
numbered —, exec inside the container's namespaces; initialDelay, period, timeout, success/failure thresholds); a
failed startup or liveness probe restarts the container. grpc probes always pass."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
from typing import Any

from atlas_cluster.node.container import Container
from atlas_cluster.node.runtime import Runtime


class Probing(Runtime):
    """The worker's part that probes its running containers."""

    def _probe_all(self, c: Container) -> None:
        startup = c.probes.get("startupProbe")
        if startup and not c.started:
            if startup.due(c.started_mono):
                startup.record(self._probe(c, startup.spec))
                if startup.passed:
                    c.started = True
                elif startup.passed is False:
                    self._restart_for_probe(c, "startup")
            return
        c.started = True
        readiness = c.probes.get("readinessProbe")
        if readiness is None:
            c.ready = True
        elif readiness.due(c.started_mono):
            readiness.record(self._probe(c, readiness.spec))
            c.ready = bool(readiness.passed)
        liveness = c.probes.get("livenessProbe")
        if liveness and c.kill_at is None and liveness.due(c.started_mono):
            liveness.record(self._probe(c, liveness.spec))
            if liveness.passed is False:
                self._restart_for_probe(c, "liveness")

    def _restart_for_probe(self, c: Container, kind: str) -> None:
        self.nodes.log(f"process node: {self.namespace}/{self.pod_name}/{c.name}: {kind} probe failed, killing it")
        grace = c.probes[f"{kind}Probe"].spec.get("terminationGracePeriodSeconds")
        self._stop_container(c, self._grace(grace))
        for probe in c.probes.values():
            probe.successes = probe.failures = 0
            probe.passed = None

    def _port(self, c: Container, port: Any) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in c.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"no container port named {port}")

    def _probe(self, c: Container, spec: dict) -> bool:
        timeout = spec.get("timeoutSeconds", 1)
        assert self.ip is not None and c.proc is not None, "a running container of a pod with its network"
        try:
            if "httpGet" in spec:
                get = spec["httpGet"]
                host = get.get("host") or self.ip
                scheme = get.get("scheme", "HTTP").upper()
                connection = (
                    http.client.HTTPSConnection(
                        host, self._port(c, get["port"]), timeout=timeout, context=ssl._create_unverified_context()
                    )
                    if scheme == "HTTPS"
                    else http.client.HTTPConnection(host, self._port(c, get["port"]), timeout=timeout)
                )
                headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
                connection.request("GET", get.get("path", "/"), headers={"User-Agent": "kube-probe/1.36", **headers})
                status = connection.getresponse().status
                connection.close()
                return 200 <= status < 400
            if "tcpSocket" in spec:
                sock = spec["tcpSocket"]
                with socket.create_connection((sock.get("host") or self.ip, self._port(c, sock["port"])), timeout):
                    return True
            if "exec" in spec:
                argv = ["nsenter", "-t", str(c.proc.pid), "-m", "-n", "-u", "--", *spec["exec"]["command"]]
                done = subprocess.run(
                    argv, env=c.env, capture_output=True, timeout=timeout, check=False, cwd=self.directory
                )
                return done.returncode == 0
            return True  # grpc: not probed
        except (OSError, subprocess.TimeoutExpired, ValueError, http.client.HTTPException):
            return False
