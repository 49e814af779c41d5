"""A local stand-in for the Kubeflow Trainer v2.3.0 controller on top of the JobSet one, for end-to-end tests (not a
product feature): TrainJobs on the API emulator become JobSets (tests/support/trainer_controller.py builds them from
the TrainJob and its ClusterTrainingRuntime), which tests.support.jobset_executor runs with real processes.

What the Trainer controller does each reconcile (pkg/controller/trainjob_controller.go at v2.3.0), emulated here:

* a TrainJob without its JobSet gets one (named after it, controlled by it) unless it has finished;
* once the JobSet exists, it is re-applied only while the TrainJob or the JobSet is suspended: the TrainJob's
  ``suspend`` reaches the JobSet; a running JobSet is never changed;
* the TrainJob's status (Suspended, Complete and Failed from the JobSet's, jobsStatus) is written when it changes;
* a deleted TrainJob's JobSet goes with it (the garbage collector's part, through the controller reference).

Not emulated: the runtime snapshot ConfigMap (the runtime is read at each build), the webhooks (tested on their own
in tests/test_render_trainjob.py), deadlines, runtime patches changed after the JobSet is built (Kueue's admission).
"""

from __future__ import annotations

from typing import Any

import kubernetes

from tests.support.jobset_executor import JOBSET_GROUP, JOBSET_VERSION, JobSetExecutor
from tests.support.trainer_controller import build_jobset, trainjob_status

TRAINER_GROUP, TRAINER_VERSION = "trainer.kubeflow.org", "v1alpha1"


class TrainJobExecutor(JobSetExecutor):
    """The Kubeflow Trainer, JobSet, Job controllers and the kubelet, for TrainJobs on the emulator."""

    def _step(self) -> None:
        self._trainer_step()
        super()._step()
        self._trainer_status()

    def _trainjobs(self) -> list[dict[str, Any]]:
        return self.custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, self.namespace, "trainjobs")[
            "items"
        ]

    def _jobsets(self) -> dict[str, dict[str, Any]]:
        items = self.custom.list_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, self.namespace, "jobsets")
        return {js["metadata"]["name"]: js for js in items["items"]}

    def _trainer_step(self) -> None:
        trainjobs = self._trainjobs()
        jobsets = self._jobsets()
        alive = {tj["metadata"]["uid"] for tj in trainjobs}
        for js in jobsets.values():  # garbage collection: a JobSet whose TrainJob is gone
            owner = next((r for r in js["metadata"].get("ownerReferences") or [] if r.get("kind") == "TrainJob"), None)
            if owner is not None and owner.get("uid") not in alive:
                self._delete_jobset(js["metadata"]["name"])
        for tj in trainjobs:
            if tj["metadata"].get("deletionTimestamp"):
                continue
            finished = any(
                c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                for c in (tj.get("status") or {}).get("conditions") or []
            )
            js = jobsets.get(tj["metadata"]["name"])
            if js is not None and not _controlled_by(js, tj):
                continue  # a JobSet of an earlier TrainJob of that name, still being collected
            if finished:
                continue
            if js is None:
                self._create_jobset(tj)
            elif tj["spec"].get("suspend") or js["spec"].get("suspend"):
                self._reapply(tj, js)

    def _runtime(self, tj: dict[str, Any]) -> dict[str, Any] | None:
        ref = tj["spec"]["runtimeRef"]
        try:
            return self.custom.get_cluster_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", ref["name"]
            )
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:  # the controller's TrainJobResourcesCreationFailed: nothing is built
                return None
            raise

    def _create_jobset(self, tj: dict[str, Any]) -> None:
        runtime = self._runtime(tj)
        if runtime is None:
            return
        self.custom.create_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, self.namespace, "jobsets", build_jobset(tj, runtime)
        )

    def _reapply(self, tj: dict[str, Any], js: dict[str, Any]) -> None:
        """The re-apply while suspended, as far as emulated: the TrainJob's suspend reaches its JobSet. (The pod
        templates' placement that Kueue's admission adds is not carried over.)"""
        suspend = bool(tj["spec"].get("suspend"))
        if suspend != bool(js["spec"].get("suspend")):
            self.custom.patch_namespaced_custom_object(
                JOBSET_GROUP,
                JOBSET_VERSION,
                self.namespace,
                "jobsets",
                js["metadata"]["name"],
                {"spec": {"suspend": suspend}},
            )

    def _delete_jobset(self, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, self.namespace, "jobsets", name)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise

    def _trainer_status(self) -> None:
        jobsets = self._jobsets()
        for tj in self._trainjobs():
            js = jobsets.get(tj["metadata"]["name"])
            status = trainjob_status(tj, js if js is not None and _controlled_by(js, tj) else None)
            if status == (tj.get("status") or {}):
                continue
            self.custom.patch_namespaced_custom_object_status(
                TRAINER_GROUP, TRAINER_VERSION, self.namespace, "trainjobs", tj["metadata"]["name"], {"status": status}
            )


def _controlled_by(js: dict[str, Any], tj: dict[str, Any]) -> bool:
    refs = [r for r in js["metadata"].get("ownerReferences") or [] if r.get("controller")]
    return bool(refs) and refs[0].get("uid") == tj["metadata"]["uid"]
