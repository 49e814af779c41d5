"""The backends' registry (atlas_operator/backends/): one backend for each value of spec.backend, each one's API
resources granted by the chart's RBAC and watched, and a backend registered beside the three picked up by rendering
and the status without any other module naming it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml
from atlas_operator import backends, kube
from atlas_operator.backends.protocol import CrdRequirement, JobBackend, JobState
from atlas_operator.config import Images
from atlas_operator.crd import custom_resource_definition
from atlas_operator.kube import Resource
from atlas_operator.manifests import child_names, render_children
from atlas_operator.render.metadata import child_metadata
from atlas_operator.render.trainer import TrainerShape, configured_trainer_template
from atlas_operator.run_status import CHILD_KEYS, EventReason
from atlas_operator.spec import KINDS, Run
from atlas_operator.status_update import job_phase, job_ran, training_reason
from atlas_operator.validation import parse_run

from harness.env import REPO
from harness.manifests import teacher, training

RULES = yaml.safe_load((REPO / "charts/atlas-operator/files/rbac-rules.yaml").read_text())
MANAGED = ["get", "list", "watch", "create", "patch", "delete"]


def _verbs(section: str, resource: Resource) -> list[str]:
    return [
        verb
        for rule in RULES[section]
        if resource.group in rule["apiGroups"] and resource.plural in rule["resources"]
        for verb in rule["verbs"]
    ]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_value_of_spec_backend_has_exactly_one_backend(kind):
    """The CRD's enum of spec.backend (generated from atlas_operator/spec.py) is the registry's keys, and no two
    backends share a job kind, an API resource or a status.children key (one of the status schema's)."""
    spec = custom_resource_definition(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert sorted(spec["properties"]["backend"]["enum"]) == sorted(backends.BACKENDS)
    registered = list(backends.BACKENDS.values())
    for attribute in ("kind", "resource", "child_key"):
        values = [getattr(backend, attribute) for backend in registered]
        assert len(set(values)) == len(values), attribute
    assert all(backend.resource.kind == name for name, backend in backends.BACKENDS.items())
    assert {name: backend.resource for name, backend in backends.BACKENDS.items()} == kube.JOBS
    assert {backend.child_key for backend in registered} <= CHILD_KEYS


@pytest.mark.parametrize("name", sorted(backends.BACKENDS))
def test_each_backends_resources_are_granted_and_watched(name):
    """Its job: managed (files/rbac-rules.yaml, the chart's one list of permissions); what it watches: listed and
    watched, and in the operator's watch list; what it only reads: get, at the scope of the resource."""
    from atlas_operator.handlers import CHILD_RESOURCES

    backend = backends.BACKENDS[name]
    assert backend.watched[0] is backend.resource
    assert _verbs("namespaced", backend.resource) == MANAGED
    for resource in backend.watched:
        assert {"get", "list", "watch"} <= set(_verbs("namespaced", resource)), resource.kind
        assert resource in CHILD_RESOURCES, resource.kind
    for resource in backend.reads:
        assert "get" in _verbs("namespaced" if resource.namespaced else "cluster", resource), resource.kind


def test_the_jobs_of_every_backend_are_what_the_run_renders_and_names():
    """Each backend's job is the last child its runs render (the job last: its pods find everything they mount),
    under its status.children key."""
    for name, backend in backends.BACKENDS.items():
        run = parse_run(teacher(backend=name))
        *_, job = render_children(run)
        assert (job["kind"], job["metadata"]["name"]) == (name, run.name)
        assert child_names(run)[backend.child_key] == run.name
        servers = {child["kind"] for child in render_children(run)} & {"Deployment"}
        assert bool(servers) is not backend.servers_in_job, name


class FakeJobBackend(JobBackend):
    """A fourth backend, as a new module would add it: its job is one pod template under ``spec.template``."""

    kind = "FakeJob"
    resource = Resource("example.com", "v1", "fakejobs", "FakeJob")
    child_key = "fakeJob"
    watched = (resource,)
    crd = CrdRequirement(EventReason.PYTORCHJOB_CRD_MISSING, "example.com/v1 FakeJob CRD", "install it")
    trainer = TrainerShape(container="fake-trainer", rendezvous_port="fake-port")
    rank0_labels = {"example.com/rank": "0"}

    def render_job(self, run: Run, images: Images, config: dict[str, Any] | None) -> dict[str, Any]:
        template = configured_trainer_template(run, images, config, self.trainer)
        return {
            "apiVersion": "example.com/v1",
            "kind": self.kind,
            "metadata": child_metadata(run, run.name, "trainer"),
            "spec": {"suspend": run.spec.suspend, "template": template},
        }

    def checkpoint_warning(self, run: Run) -> str | None:
        return None if run.spec.checkpoint.pvc else "no checkpoint PVC on FakeJob"

    def state(self, job: dict[str, Any], gang: dict[str, Any] | None) -> JobState:
        phase = (job.get("status") or {}).get("phase")
        return (phase, phase, f"FakeJob is {phase}") if phase else ("Pending", "JobPending", "no FakeJob status yet")

    def job_ran(self, job: dict[str, Any]) -> bool:
        return bool((job.get("status") or {}).get("ran"))

    def rank0_pod(self, client: Any, run: Run, job: dict[str, Any]) -> dict[str, Any] | None:
        return None


def test_a_fourth_backend_is_rendered_and_observed_through_the_registry():
    """Registered, a backend no other module names renders its runs' job (with the trainer's pod shaped as it asks:
    container, rendezvous port; the metrics Service selecting its rank 0) and its job's state becomes the run's
    phase and Training condition; unregistered, it is gone."""
    fake = FakeJobBackend()
    run = dataclasses.replace(parse_run(training()), backend=fake.kind)
    with backends.registered(fake):
        assert backends.for_run(run) is fake and backends.by_kind("FakeJob") is fake
        children = render_children(run)
        *_, job = children
        assert job["kind"] == "FakeJob"
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert container["name"] == "fake-trainer"
        assert [p["name"] for p in container["ports"]] == ["fake-port", "metrics"]
        (metrics,) = [c for c in children if c["kind"] == "Service" and c["metadata"]["name"].endswith("-metrics")]
        assert metrics["spec"]["selector"]["example.com/rank"] == "0"
        assert child_names(run)["fakeJob"] == run.name
        assert backends.checkpoint_warning(run) == "no checkpoint PVC on FakeJob"

        running = {"kind": "FakeJob", "status": {"phase": "Running", "ran": True}}
        assert job_phase(running, suspend=False) == "Running"
        assert training_reason(running) == ("Running", "FakeJob is Running")
        assert job_ran(running) and not job_ran({"kind": "FakeJob", "status": {}})
        assert job_phase({"kind": "FakeJob", "spec": {"suspend": True}}, suspend=False, queued=True) == "Queued"
        assert backends.job_child({"fakeJob": run.name, "configMap": "x"}) == (fake, run.name)
    assert "FakeJob" not in backends.BACKENDS and backends.by_kind("FakeJob") is None
    with pytest.raises(KeyError):
        backends.for_run(run)
