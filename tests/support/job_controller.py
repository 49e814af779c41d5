"""The Kubernetes Job controller and the kubelet for a JobSet's child Jobs (tests.support.jobset_executor's base):
Indexed pods ``<job>-<index>-<5 random>`` with hostnames, the JobSet's networking on one machine, readiness probes,
``backoffLimit`` and ``podFailurePolicy``, suspend and resume, the Jobs' status."""

from __future__ import annotations

import secrets
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.support.kubelet import Kubelet, Replica, now
from tests.support.vllm_standin import VLLM_STANDIN, VLLM_STANDIN_ANSWER, vllm_served

if TYPE_CHECKING:
    from tests.support.jobset_executor import JobSetRun

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


@dataclass
class ChildJob:
    """One child Job of a JobSet (the Job controller's view): its pods by completion index."""

    name: str
    rjob: str
    index: int
    uid: str
    spec: dict[str, Any]  # the Job's spec (template included)
    attempt: int
    suspended: bool
    pods: dict[int, Replica] = field(default_factory=dict)
    succeeded: set[int] = field(default_factory=set)
    failed: int = 0
    condition: str | None = None  # Complete | Failed
    reason: str = ""  # of the Failed condition: BackoffLimitExceeded | PodFailurePolicy
    message: str = ""
    failed_at: float = 0.0
    written: dict[str, Any] | None = None

    @property
    def completions(self) -> int:
        return int(self.spec.get("completions") or self.spec.get("parallelism") or 1)

    @property
    def parallelism(self) -> int:
        return int(self.spec.get("parallelism") or 1)

    @property
    def indexed(self) -> bool:
        return self.spec.get("completionMode", "Indexed") == "Indexed"

    def active(self) -> list[Replica]:
        return [p for p in self.pods.values() if p.proc is not None and p.exit_code is None]

    def ready(self) -> int:
        return sum(1 for p in self.active() if p.ready_at is not None)


def secrets_token() -> str:
    return secrets.token_hex(3)[:5]


class JobController(Kubelet):
    """The Job controller's and the kubelet's half of the JobSet executor: a JobSet's child Jobs run (one
    :class:`ChildJob` each, by name in its run), their pods spawned, probed, supervised and reported."""

    # ------------------------------------------------------------------ the Job controller

    def _start_job(self, js: dict[str, Any], run: JobSetRun, job: ChildJob) -> None:
        for index in range(min(job.parallelism, job.completions)):
            if index not in job.succeeded:
                self._start_index(js, run, job, index)

    def _suspend_jobs(self, run: JobSetRun, jobs: list[ChildJob]) -> None:
        """``jobs`` suspended together. A suspended Job's pods are deleted — every pod of them at once, as the
        kubelets would: SIGTERM, the grace period, the terminated state, then the object."""
        for name, seconds in self.terminate_pods([pod for job in jobs for pod in job.pods.values()]).items():
            run.log.append(f"pod {name} terminated in {seconds:.1f} s")
        for job in jobs:
            job.suspended = True
            job.spec["suspend"] = True
            for pod in job.pods.values():
                self._delete_pod_object(pod.name, job.uid)
            job.pods.clear()
            self._patch_job(job, {"spec": {"suspend": True}})
            run.log.append(f"suspended job {job.name}")

    def _resume_job(self, js: dict[str, Any], run: JobSetRun, rjob: dict[str, Any], job: ChildJob) -> None:
        """``resumeJobsIfNecessary``: the JobSet's pod-template scheduling fields merged in, then unsuspended."""
        current = (rjob["template"].get("spec") or {}).get("template") or {}
        mine = job.spec["template"]
        for key in ("labels", "annotations"):
            merged = {
                **(mine.setdefault("metadata", {}).get(key) or {}),
                **((current.get("metadata") or {}).get(key) or {}),
            }
            mine["metadata"][key] = merged
        for key in ("nodeSelector",):
            merged = {**(mine["spec"].get(key) or {}), **((current.get("spec") or {}).get(key) or {})}
            if merged:
                mine["spec"][key] = merged
        for key in ("tolerations", "schedulingGates"):
            if (current.get("spec") or {}).get(key):
                mine["spec"][key] = current["spec"][key]
        job.suspended = False
        job.spec["suspend"] = False
        self._patch_job(job, {"spec": {"suspend": False, "template": mine}})
        run.log.append(f"resumed job {job.name}")
        self._start_job(js, run, job)

    def _patch_job(self, job: ChildJob, body: dict[str, Any]) -> None:
        self._call(
            "PATCH", f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{job.name}", body, "application/merge-patch+json"
        )

    def _delete_job(self, run: JobSetRun, job: ChildJob) -> None:
        for pod in job.pods.values():
            pod.kill()
            self._delete_pod_object(pod.name, job.uid)
        self._call("DELETE", f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{job.name}")
        run.log.append(f"deleted job {job.name}")

    # ------------------------------------------------------------------ pods (the Job controller + the kubelet)

    def _start_index(self, js: dict[str, Any], run: JobSetRun, job: ChildJob, index: int) -> None:
        template = job.spec["template"]
        spec = template["spec"]
        container = spec["containers"][0]
        pod_name = f"{job.name}-{index}-{secrets_token()}"
        pod = Replica(
            job.name,
            job.rjob,
            index,
            index,
            template,
            "Never",
            run.root,
            container=container["name"],
            pod_name=pod_name,
        )
        job.pods[index] = pod
        hostname = f"{job.name}-{index}" if job.indexed else None
        self._create_jobset_pod(job, pod, hostname)
        ports = {p: h for (r, p), h in run.ports.items() if r == job.rjob}
        rewrite = self._network_rewrite(js, run, ports)
        env = {"HOSTNAME": hostname or pod_name}
        if job.indexed and not any(v["name"] == "JOB_COMPLETION_INDEX" for v in container.get("env", [])):
            env["JOB_COMPLETION_INDEX"] = str(index)
        argv = None
        model = vllm_served(container.get("command", []) + container.get("args", []))
        if model is not None:
            port = self._standin_port(container, ports)
            argv = [sys.executable, "-c", VLLM_STANDIN, str(port), model, VLLM_STANDIN_ANSWER]
            message = f"pod executor: {pod_name}: `vllm serve {model}` runs as the local vLLM stand-in on :{port}"
            print(message, file=sys.stderr)
            run.log.append(message)
        self._spawn(js, pod, container, env, ports, rewrite, argv)
        self._write_pod_status(
            pod,
            "Running",
            {"state": {"running": {"startedAt": pod.started_at}}, "ready": False, "started": True},
            self._pod_conditions(False),
        )

    @staticmethod
    def _standin_port(container: dict[str, Any], ports: dict[int, int]) -> int:
        argv = container.get("command", []) + container.get("args", [])
        port = 8000  # vllm serve's default
        for i, arg in enumerate(argv):
            if arg == "--port" and i + 1 < len(argv):
                port = int(argv[i + 1])
            elif arg.startswith("--port="):
                port = int(arg.split("=", 1)[1])
        return ports.get(port, port)

    def _network_rewrite(self, js: dict[str, Any], run: JobSetRun, own_ports: dict[int, int]):
        import re

        network = js["spec"].get("network") or {}
        subdomain = network.get("subdomain") or js["metadata"]["name"]
        hosts: dict[str, str] = {}  # hostname → replicated job
        for rjob in js["spec"]["replicatedJobs"]:
            spec = rjob["template"].get("spec") or {}
            for job_index in range(int(rjob.get("replicas", 1))):
                for pod_index in range(int(spec.get("completions") or spec.get("parallelism") or 1)):
                    hosts[f"{js['metadata']['name']}-{rjob['name']}-{job_index}-{pod_index}"] = rjob["name"]
        if not hosts:
            return None
        names = "|".join(sorted((re.escape(h) for h in hosts), key=len, reverse=True))
        suffix = rf"(?:\.{re.escape(subdomain)}(?:\.{re.escape(self.namespace)}(?:\.svc(?:\.cluster\.local)?)?)?)?"
        pattern = re.compile(rf"(?<![\w.-])({names}){suffix}(?::(\d+))?(?![\w-])")

        def host(match: re.Match) -> str:
            port = match.group(2)
            if port is None:
                return "127.0.0.1"
            return f"127.0.0.1:{run.ports.get((hosts[match.group(1)], int(port)), int(port))}"

        own = {str(p): str(h) for p, h in own_ports.items()}
        own_arg = re.compile(r"^(--[\w-]*port=)(\d+)$")

        def rewrite(text: str) -> str:
            text = pattern.sub(host, text)
            if text in own:
                return own[text]
            match = own_arg.match(text)
            if match and match.group(2) in own:
                return match.group(1) + own[match.group(2)]
            return text

        return rewrite

    def _create_jobset_pod(self, job: ChildJob, pod: Replica, hostname: str | None) -> None:
        meta = pod.template.get("metadata") or {}
        labels = {
            **(meta.get("labels") or {}),
            "batch.kubernetes.io/job-name": job.name,
            "job-name": job.name,
            "batch.kubernetes.io/controller-uid": job.uid,
            "controller-uid": job.uid,
        }
        annotations = dict(meta.get("annotations") or {})
        if job.indexed:
            labels[COMPLETION_INDEX] = annotations[COMPLETION_INDEX] = str(pod.index)
        spec = {**pod.template["spec"], "restartPolicy": pod.template["spec"].get("restartPolicy", "Never")}
        if hostname:
            spec["hostname"] = hostname
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job.name, "uid": job.uid}
        self._create_pod(pod, owner, labels, annotations, spec)

    @staticmethod
    def _pod_conditions(ready: bool) -> dict[str, Any]:
        value = "True" if ready else "False"
        at = now()
        return {
            "conditions": [
                {"type": "Ready", "status": value, "lastTransitionTime": at},
                {"type": "ContainersReady", "status": value, "lastTransitionTime": at},
            ]
        }

    def _env_value(self, job, var: dict[str, Any]) -> str:
        field_path = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
        if COMPLETION_INDEX in field_path:  # metadata.labels['batch.kubernetes.io/job-completion-index']
            return self._current_index
        if field_path == "metadata.name":
            return self._current_pod
        return super()._env_value(job, var)

    _current_index = _current_pod = ""

    def _spawn(self, job, pod, container, extra_env, ports, rewrite=None, argv=None, expand=True) -> None:
        self._current_index, self._current_pod = str(pod.index), pod.name  # the fieldRefs' values
        super()._spawn(job, pod, container, extra_env, ports, rewrite, argv, expand)

    def _probe(self, pod: Replica, ports: dict[int, int]) -> bool:
        import urllib.error
        import urllib.request

        container = next(c for c in pod.template["spec"]["containers"] if c["name"] == pod.container)
        probe = (container.get("readinessProbe") or {}).get("httpGet")
        if probe is None:
            return True
        port = probe["port"]
        if isinstance(port, str) and not port.isdigit():
            port = next(p["containerPort"] for p in container.get("ports", []) if p.get("name") == port)
        port = ports.get(int(port), int(port))
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{probe.get('path', '/')}", timeout=0.5) as answer:
                return 200 <= answer.status < 400
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _supervise_job(self, js: dict[str, Any], run: JobSetRun, job: ChildJob) -> None:
        if job.condition is not None or job.suspended:
            return
        ports = {p: h for (r, p), h in run.ports.items() if r == job.rjob}
        backoff_limit = int(job.spec.get("backoffLimit", 6))
        for index, pod in list(job.pods.items()):
            if pod.proc is None or pod.exit_code is not None:
                continue
            code = pod.proc.poll()
            if code is None:
                ready = self._probe(pod, ports)
                if ready != (pod.ready_at is not None):
                    pod.ready_at = time.monotonic() if ready else None
                    self._write_pod_status(
                        pod,
                        "Running",
                        {"state": {"running": {"startedAt": pod.started_at}}, "ready": ready, "started": True},
                        self._pod_conditions(ready),
                    )
                continue
            pod.exit_code = code
            pod.ready_at = None
            self._write_pod_status(
                pod,
                "Succeeded" if code == 0 else "Failed",
                {"state": {"terminated": self._terminated_state(pod, code)}, "ready": False, "started": False},
                self._pod_conditions(False),
            )
            run.log.append(f"pod {pod.name} exited {code}")
            if code == 0:
                job.succeeded.add(index)
            else:
                rule = self._pod_failure_rule(job, pod, code)
                if rule is not None and rule[1]["action"] == "Ignore":
                    self._start_index(js, run, job, index)  # not counted against backoffLimit
                    continue
                job.failed += 1
                if rule is not None and rule[1]["action"] == "FailJob":
                    job.reason = "PodFailurePolicy"
                    job.message = (
                        f"Container {pod.container} for pod {self.namespace}/{pod.name} failed with exit code {code} "
                        f"matching FailJob rule at index {rule[0]}"
                    )
                elif job.failed > backoff_limit:
                    job.reason, job.message = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
                if job.reason:
                    job.condition, job.failed_at = "Failed", time.monotonic()
                    for other in job.active():  # the Job controller ends the Job's other pods
                        other.kill()
                        other.proc.wait(10)
                        other.exit_code = -9
                else:  # within backoffLimit: a new pod for the index
                    self._start_index(js, run, job, index)
        if job.condition is None and len(job.succeeded) >= job.completions:
            job.condition = "Complete"
        self._write_job_status(job)

    @staticmethod
    def _pod_failure_rule(job: ChildJob, pod: Replica, code: int) -> tuple[int, dict[str, Any]] | None:
        """The Job's first ``podFailurePolicy`` rule whose ``onExitCodes`` match the failed container (index, rule);
        ``onPodConditions`` rules are not emulated."""
        for index, rule in enumerate((job.spec.get("podFailurePolicy") or {}).get("rules") or []):
            codes = rule.get("onExitCodes")
            if not codes or codes.get("containerName", pod.container) != pod.container:
                continue
            if (code in codes.get("values", [])) == (codes.get("operator") == "In"):
                return index, rule
        return None

    def _write_job_status(self, job: ChildJob) -> None:
        status: dict[str, Any] = {
            "active": len(job.active()),
            "ready": job.ready(),
            "succeeded": len(job.succeeded),
            "failed": job.failed,
        }
        if job.indexed and job.succeeded:
            status["completedIndexes"] = ",".join(str(i) for i in sorted(job.succeeded))
        if job.condition == "Complete":
            status["conditions"] = [{"type": "Complete", "status": "True", "reason": "CompletionsReached"}]
        elif job.condition == "Failed":
            status["conditions"] = [{"type": "Failed", "status": "True", "reason": job.reason, "message": job.message}]
        if status != job.written:
            self._call(
                "PATCH",
                f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{job.name}/status",
                {"status": status},
                "application/merge-patch+json",
            )
            job.written = status
