"""What a release of the operator leaves in a cluster, recorded, and loaded again for the upgrade tests.

`python -m tests.support.upgrade_fixtures` (from the repository root) runs this release's `atlas operator` on the API
emulator over the examples (the three PyTorchJob runs and the JobSet run of examples/), brings their jobs to Running as
the Kubeflow and JobSet controllers would, and writes every run and child as the API server then holds them to
tests/fixtures/upgrade/<version>/<run>.yaml. Record once per release and commit the result: a later operator is tested
against what this one made (as Kueue and KubeRay keep upgrade suites from their previous release); never re-record the
files of an earlier release.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from harness.kube_emulator import JOBSETS, PYTORCHJOBS, TEACHERS, TRAININGS
from harness.polling import wait_for

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUN_RESOURCES = {"AtlasTraining": TRAININGS, "AtlasTeacher": TEACHERS}
CHILD_RESOURCES = {
    "ConfigMap": "v1/configmaps",
    "Service": "v1/services",
    "Deployment": "apps/v1/deployments",
    "PyTorchJob": PYTORCHJOBS,
    "JobSet": JOBSETS,
    "NetworkPolicy": "networking.k8s.io/v1/networkpolicies",
}
PREREQUISITES = [  # what the examples reference
    {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "atlas-ckpt", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Ti"}}},
    }
]
SERVER_ASSIGNED = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")
LOADER_AGENT = "upgrade-fixtures/1"  # the loader's writes are not the operator's


def _stored(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` without what the API server assigns (a loader gets new values), the run's own uid kept apart."""
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    uid = meta.get("uid")
    for key in SERVER_ASSIGNED:
        meta.pop(key, None)
    if obj["kind"] in RUN_RESOURCES:
        meta["annotations"] = {**(meta.get("annotations") or {}), "upgrade-fixtures/recorded-uid": uid}
    return obj


def record(version: str) -> Path:
    """Run this release's operator over the examples and write what it made (see the module docstring)."""
    import tempfile

    from tests.support.operator_cluster import own_cluster

    out = FIXTURES / version
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, own_cluster(Path(tmp)) as cluster:
        client = Loader(cluster.api_client)
        for obj in PREREQUISITES:
            client.create(obj)
        runs = []
        for path in sorted(EXAMPLES.glob("*.yaml")):
            run = yaml.safe_load(path.read_text())
            run["metadata"].setdefault("namespace", "default")
            client.create(run)
            runs.append(run)
        for run in runs:
            meta = run["metadata"]
            resource = RUN_RESOURCES[run["kind"]]
            wait_for(
                lambda r=resource, m=meta: (
                    (cluster.emu.get(r, m["namespace"], m["name"]) or {}).get("status", {}).get("children")
                ),
                timeout=60,
                what=f"children of {meta['name']}",
            )
            for kind, name in _children(cluster.emu.get(resource, meta["namespace"], meta["name"])):
                wait_for(lambda k=kind, n=name, m=meta: cluster.emu.get(CHILD_RESOURCES[k], m["namespace"], n), 60)
            job_kind = "JobSet" if cluster.emu.get(JOBSETS, meta["namespace"], meta["name"]) else "PyTorchJob"
            client.patch_status(job_kind, meta["namespace"], meta["name"], running_status(job_kind, 0))
            wait_for(
                lambda r=resource, m=meta: (
                    (cluster.emu.get(r, m["namespace"], m["name"]) or {}).get("status", {}).get("phase") == "Running"
                ),
                timeout=60,
                what=f"{meta['name']} Running",
            )
        cluster.operator.stop()
        for run in runs:
            meta = run["metadata"]
            body = cluster.emu.get(RUN_RESOURCES[run["kind"]], meta["namespace"], meta["name"])
            documents = [_stored(body)] + [
                _stored(cluster.emu.get(CHILD_RESOURCES[kind], meta["namespace"], name))
                for kind, name in _children(body)
            ]
            (out / f"{meta['name']}.yaml").write_text(yaml.safe_dump_all(documents, sort_keys=False, width=120))
    return out


def _children(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(kind, name) of every child a run's status lists (a server's name is its Deployment's and its Service's)."""
    kinds = {
        "pytorchJob": ["PyTorchJob"],
        "jobSet": ["JobSet"],
        "rollout": ["Service", "Deployment"],
        "student": ["Service", "Deployment"],
        "configMap": ["ConfigMap"],
        "metricsService": ["Service"],
        "networkPolicy": ["NetworkPolicy"],
        "trainerNetworkPolicy": ["NetworkPolicy"],
    }
    return [(kind, name) for key, name in sorted(body["status"]["children"].items()) for kind in kinds[key]]


def running_status(job_kind: str, round_: int) -> dict[str, Any]:
    """A job's status once its trainer runs, as its controller writes it; ``round_`` makes each write differ."""
    if job_kind == "JobSet":
        ready = {"ready": 1, "active": 1, "succeeded": 0, "failed": 0, "suspended": 0}
        return {
            "restarts": round_,
            "replicatedJobsStatus": [{"name": name, **ready} for name in ("rollout", "student", "trainer")],
            "conditions": [],
        }
    return {
        "conditions": [
            {"type": "Created", "status": "True", "reason": "PyTorchJobCreated", "message": "created"},
            {
                "type": "Running",
                "status": "True",
                "reason": "PyTorchJobRunning",
                "message": f"PyTorchJob is running (round {round_})",
            },
        ]
    }


class Loader:
    """Writes objects as a user or a controller would (its own User-Agent)."""

    def __init__(self, api_client):
        from atlas_operator.kube import Kube, Resource

        self.kube = Kube(api_client)
        api_client.user_agent = LOADER_AGENT
        self.resources = {
            "AtlasTraining": Resource("atlas.arc.computer", "v1alpha1", "atlastrainings", "AtlasTraining"),
            "AtlasTeacher": Resource("atlas.arc.computer", "v1alpha1", "atlasteachers", "AtlasTeacher"),
            "PersistentVolumeClaim": Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim"),
        }

    def resource(self, kind: str):
        from atlas_operator import kube

        return self.resources.get(kind) or kube.RESOURCES[kind]

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta, body = obj["metadata"], {key: value for key, value in obj.items() if key != "status"}
        if obj["kind"] in RUN_RESOURCES:
            custom = kubernetes.client.CustomObjectsApi(self.kube.api)
            plural = self.resources[obj["kind"]].plural
            return custom.create_namespaced_custom_object(
                "atlas.arc.computer", "v1alpha1", meta["namespace"], plural, body
            )
        if obj["kind"] == "PersistentVolumeClaim":
            core = kubernetes.client.CoreV1Api(self.kube.api)
            return core.create_namespaced_persistent_volume_claim(meta["namespace"], body).to_dict()
        return self.kube.create(body)

    def patch_status(self, kind: str, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        return self.kube.patch(self.resource(kind), namespace, name, {"status": status}, subresource="status")

    def patch_spec(self, kind: str, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.kube.patch(self.resource(kind), namespace, name, {"spec": spec})


def load(api_client, version: str, change=None) -> list[dict[str, Any]]:
    """Create a release's recorded runs and children (statuses too; ownerReferences follow the runs' new uids).
    ``change(document)`` may alter each child first (what an earlier renderer made differently). Returns the runs."""
    loader = Loader(api_client)
    for obj in PREREQUISITES:
        loader.create(obj)
    runs = []
    for path in sorted((FIXTURES / version).glob("*.yaml")):
        run, *children = yaml.safe_load_all(path.read_text())
        meta = run["metadata"]
        created = loader.create(run)
        loader.patch_status(run["kind"], meta["namespace"], meta["name"], run["status"])
        uids = {meta["annotations"]["upgrade-fixtures/recorded-uid"]: created["metadata"]["uid"]}
        for child in children:
            child = change(copy.deepcopy(child)) if change else child
            for ref in child["metadata"].get("ownerReferences") or []:
                ref["uid"] = uids.get(ref["uid"], ref["uid"])
            loader.create(child)
            if child.get("status"):
                loader.patch_status(child["kind"], meta["namespace"], child["metadata"]["name"], child["status"])
        runs.append(run)
    return runs


if __name__ == "__main__":
    from atlas_operator import __version__

    print(record(sys.argv[1] if len(sys.argv) > 1 else __version__))
