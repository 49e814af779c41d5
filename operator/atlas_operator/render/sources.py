"""Models and data in, the trained model out (atlas_contract/sources.py): what the trainer and server pods get for
them — the initializer that fetches a run's S3 and hub models and S3 datasets once into
``<checkpoint.path>/<name>/sources`` on the checkpoint volume (the trainer container's first step, a server's init
container), the ``pvc://`` claims mounted read-only (the output's
claim writable, in the trainer), and the credentials as ``secretKeyRef``s (the operator never reads a Secret)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from atlas_contract import sources
from atlas_contract.names import CONFIG_DIR, RUN_CONFIG_FILE, TERMINATION_MESSAGE_PATH
from atlas_operator.render.pod_spec import CONTAINER_SECURITY
from atlas_operator.spec import AtlasTeacherSpec, Run

AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
HUB_TOKEN_KEY = "HF_TOKEN"


def sources_dir(run: Run) -> str:
    """The run's fetched copies on the checkpoint volume: ``<checkpoint.path>/<name>/sources``."""
    return f"{run.spec.checkpoint.path.rstrip('/')}/{run.name}/{sources.SOURCES_DIR}"


def model_uris(run: Run) -> dict[str, str]:
    """The models the run names, by role: ``model`` (the policy) and, for a teacher, ``student``."""
    uris = {"model": run.spec.model}
    if isinstance(run.spec, AtlasTeacherSpec) and run.spec.student:
        uris["student"] = run.spec.student.model
    return uris


def dataset_uris(run: Run) -> list[str]:
    spec = run.spec
    found = [spec.dataset.source]
    if isinstance(spec, AtlasTeacherSpec) and spec.evaluation and spec.evaluation.dataset.source:
        found.append(spec.evaluation.dataset.source)
    return found


def source_uris(run: Run) -> list[str]:
    """The run's S3, hub and PVC models and datasets, once each."""
    uris = [*model_uris(run).values(), *dataset_uris(run)]
    return list(dict.fromkeys(uri for uri in uris if sources.parse(uri).remote))


def needs_sources(run: Run) -> bool:
    """Whether the run reads a source from outside its volume and image (condition SourcesReady)."""
    return bool(source_uris(run))


def fetched(uri: str, model: bool) -> bool:
    """Whether the initializer copies ``uri``: an S3 model or dataset, a hub model (hub datasets stay with datasets'
    own cache in HF_HOME on the checkpoint volume)."""
    location = sources.parse(uri)
    return location.scheme == "s3" or (model and location.scheme == "hf")


def trainer_fetches(run: Run, student_server: bool) -> list[str]:
    """What the trainer pods' initializer fetches: the policy, the student when no server holds it, the datasets."""
    models = model_uris(run)
    if student_server:
        models.pop("student", None)
    wanted = [uri for uri in models.values() if fetched(uri, model=True)]
    wanted += [uri for uri in dataset_uris(run) if fetched(uri, model=False)]
    return list(dict.fromkeys(wanted))


def storage_env(run: Run) -> list[dict[str, Any]]:
    """The S3 and hub settings of the pods that fetch or export: the Secret's keys by reference, the endpoint from
    spec.storage.endpoint (else the Secret's optional AWS_ENDPOINT_URL, else AWS), the region, the hub's address and
    token."""
    storage = run.spec.storage
    env: list[dict[str, Any]] = []
    if storage.secret_ref:
        secret = storage.secret_ref.name
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}} for key in AWS_KEYS]
        if not storage.endpoint:
            env.append(_optional_secret_key("AWS_ENDPOINT_URL", secret))
        if not storage.region:
            env.append(_optional_secret_key("AWS_DEFAULT_REGION", secret))
    if storage.endpoint:
        env.append({"name": "AWS_ENDPOINT_URL", "value": storage.endpoint})
    if storage.region:
        env.append({"name": "AWS_DEFAULT_REGION", "value": storage.region})
    if storage.hub.endpoint:
        env.append({"name": "HF_ENDPOINT", "value": storage.hub.endpoint})
    if storage.hub.secret_ref:
        env.append(_optional_secret_key(HUB_TOKEN_KEY, storage.hub.secret_ref.name, optional=False))
    return env


def _optional_secret_key(key: str, secret: str, optional: bool = True) -> dict[str, Any]:
    return {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": optional}}}


def claim_volumes(
    uris: Sequence[str | None], writable: str | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Volumes and mounts of the ``pvc://`` claims ``uris`` name, at ``PVC_MOUNT_ROOT/<claim>``: read-only, except
    ``writable``'s claim (the output's, in the trainer)."""
    write_claims = sources.claims(writable)
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for index, claim in enumerate(sources.claims(*uris, writable)):
        name = f"pvc-{index}"
        read_only = claim not in write_claims
        volumes.append({"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}})
        mounts.append({"name": name, "mountPath": f"{sources.PVC_MOUNT_ROOT}/{claim}", "readOnly": read_only})
    return volumes, mounts


def initializer_command(run: Run, uris: list[str] | None = None) -> list[str]:
    """The initializer's command line: the run configuration's sources (the trainer), or ``uris`` (a server's model)."""
    command = ["python", "-m", "atlas_core.sources.initializer"]
    if uris is None:
        return [*command, "--config", f"{CONFIG_DIR}/{RUN_CONFIG_FILE}"]
    return [*command, *(arg for uri in uris for arg in ("--uri", uri))]


def initializer_container(
    run: Run, image: str, mounts: list[dict[str, Any]], sources_at: str, hf_home: str, uris: list[str] | None = None
) -> dict[str, Any]:
    """The init container that fetches the pod's sources into ``sources_at`` before the pod's main container starts
    (atlas_core/sources/initializer.py): the run configuration's sources (the trainer), or ``uris`` (a server's
    model). A source that cannot be fetched ends it with SOURCES_EXIT_CODE and ``{reason, uri, message}`` in its
    termination message, which the operator shows as SourcesReady=False."""
    command = [*initializer_command(run, uris), "--message-file", TERMINATION_MESSAGE_PATH]
    return {
        "name": sources.INITIALIZER_CONTAINER,
        "image": image,
        "command": command,
        "env": [
            {"name": sources.ENV_SOURCES_DIR, "value": sources_at},
            {"name": "HF_HOME", "value": hf_home},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            *storage_env(run),
        ],
        "volumeMounts": mounts,
        "securityContext": dict(CONTAINER_SECURITY),
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "File",
    }


def served_model(uri: str, sources_at: str) -> str:
    """What a server's ``vllm serve`` loads for ``uri``: its local copy (fetched, or the claim's mount), else the URI
    as it is (a builtin or a path)."""
    return sources.local_path(uri, sources_at) or uri
