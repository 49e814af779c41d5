"""Where a run's models and data come from, and where its trained model goes: the URIs both halves read.

A model or dataset (``spec.model``, ``spec.student.model``, ``spec.dataset.source``,
``spec.evaluation.dataset.source``, the CLI's model and dataset arguments) and a run's output (``spec.output.uri``)
are one of:

- ``s3://bucket/prefix``: any S3-compatible store (``spec.storage``; boto3 reads ``AWS_*``), **fetched** once per
  run into the run's cache (:data:`SOURCES_DIR` in the output folder), with a manifest (:data:`MANIFEST_FILE`);
- ``hf://org/name`` or a bare hub id ``org/name``: the Hugging Face hub (or the mirror ``HF_ENDPOINT``); a model is
  fetched like an S3 one (``huggingface_hub.snapshot_download``), a dataset stays with ``datasets``' own cache;
- ``pvc://claim/path``: a PersistentVolumeClaim of the run's namespace, mounted read-only at
  ``PVC_MOUNT_ROOT/<claim>`` in the pods and read in place (nothing crosses the network);
- ``builtin://…``: built on the machine (atlas_core/models); a path: a folder or file on the checkpoint volume.

The operator checks the URIs (a CEL rule per field: an ``s3://`` without a bucket, a ``pvc://`` without a claim is
refused at ``kubectl apply``), mounts the claims and runs the initializer (``atlas_core/sources``); the trainer,
the servers and the CLI map a URI to its local copy with :func:`local_path`.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

S3_SCHEME = "s3://"
PVC_SCHEME = "pvc://"
HUB_SCHEME = "hf://"
BUILTIN_SCHEME = "builtin://"

#: ``pvc://claim/path`` is read at ``PVC_MOUNT_ROOT/claim/path`` in the trainer and server pods (read-only).
PVC_MOUNT_ROOT = "/mnt/atlas-pvc"
#: The run's fetched copies: ``<output_dir>/SOURCES_DIR/<cache_name(uri)>`` on the checkpoint volume.
SOURCES_DIR = "sources"
#: Where the trainer, the servers and the CLI look for fetched copies (the operator sets it in the pods; locally
#: ``$ATLAS_CACHE_DIR/sources``).
ENV_SOURCES_DIR = "ATLAS_SOURCES_DIR"
#: The last file of a fetched copy and of an export: every file with its size and sha256. A folder without it is
#: incomplete, whatever else it holds.
MANIFEST_FILE = "atlas-manifest.json"
#: In the output folder while an export failed and waits to be retried: what the export needs (step, reward, KL,
#: the evaluation) as JSON. The trainer container's launch script finds it on a restart and retries the export alone
#: on the first node (the others exit): nothing is trained or evaluated again, and no rank waits for a rendezvous.
EXPORT_PENDING_FILE = ".atlas-export-pending.json"
#: The model card of an export.
MODEL_CARD_FILE = "README.md"
# A LoRA run exported with output.merge: the merged model at the top, the adapter as PEFT wrote it in this folder.
EXPORT_ADAPTER_DIR = "adapter"
#: The initializer container of the trainer and server pods.
INITIALIZER_CONTAINER = "initializer"
#: How the initializer's failure begins (its termination message, which the operator reads from the pod): the mark,
#: then JSON ``{"reason", "uri", "message"}``.
SOURCES_MARK = "atlas sources:"
#: Why a source could not be fetched (condition ``SourcesReady``'s reasons, and an export's ``Exported=False``).
ACCESS_DENIED, NOT_FOUND, UNREACHABLE = "AccessDenied", "NotFound", "Unreachable"
REASONS = (ACCESS_DENIED, NOT_FOUND, UNREACHABLE)
#: How long a pod waits for an S3 endpoint or the hub that does not answer before it fails naming it, and how long
#: a pod waits for another pod's fetch of the same source (a shared checkpoint volume) before it fails naming it.
UNREACHABLE_WAIT_S = 60.0
FETCH_WAIT_S = 3600.0
#: The exit code of an initializer that failed for a reason of REASONS: EX_UNAVAILABLE (sysexits.h).
SOURCES_EXIT_CODE = 69

# S3 bucket names (AWS's rules, which S3-compatible stores share): 3-63 of a-z, 0-9, '.', '-', a letter or digit at
# both ends. A claim is a Kubernetes object name (DNS-1123 subdomain).
S3_BUCKET_PATTERN = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
PVC_CLAIM_PATTERN = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"
HUB_REPO_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9_.-]+)?"
S3_URI = re.compile(rf"s3://(?P<root>{S3_BUCKET_PATTERN})(/(?P<path>.*))?")
PVC_URI = re.compile(rf"pvc://(?P<root>{PVC_CLAIM_PATTERN})(/(?P<path>.*))?")
HUB_URI = re.compile(rf"hf://(?P<root>{HUB_REPO_PATTERN})")
_HUB_ID = re.compile(HUB_REPO_PATTERN)

#: What each remote scheme expects, for messages.
EXPECTED = {
    S3_SCHEME: "s3://<bucket>/<prefix>, the bucket 3-63 lowercase letters, digits, '.' or '-'",
    PVC_SCHEME: "pvc://<claim>/<path>, the claim a PersistentVolumeClaim's name",
    HUB_SCHEME: "hf://<org>/<name>",
}


@dataclass(frozen=True)
class Location:
    """A parsed URI: ``scheme`` is s3, pvc, hf (``hf://`` or a bare hub id), builtin, endpoint or path; ``root``
    the bucket, claim or hub repository; ``path`` the key prefix or the path in the claim (no leading '/')."""

    uri: str
    scheme: str
    root: str = ""
    path: str = ""

    @property
    def fetched(self) -> bool:
        """Copied into the run's cache before training (S3; the hub, for a model)."""
        return self.scheme in ("s3", "hf")

    @property
    def remote(self) -> bool:
        """Read from outside the checkpoint volume and the image (what spec.storage's credentials are for)."""
        return self.scheme in ("s3", "hf", "pvc")


def parse(uri: str) -> Location:
    """What ``uri`` names; a malformed ``s3://``/``pvc://``/``hf://`` URI raises ValueError with what is expected."""
    for scheme, pattern, kind in ((S3_SCHEME, S3_URI, "s3"), (PVC_SCHEME, PVC_URI, "pvc"), (HUB_SCHEME, HUB_URI, "hf")):
        if uri.startswith(scheme):
            match = pattern.fullmatch(uri)
            if match is None:
                raise ValueError(f"'{uri}' is not a valid URI (expected {EXPECTED[scheme]})")
            path = (match.groupdict().get("path") or "").strip("/")
            return Location(uri, kind, match.group("root"), path)
    if uri.startswith(BUILTIN_SCHEME):
        return Location(uri, "builtin")
    if uri.startswith(("http://", "https://")):
        return Location(uri, "endpoint")
    local = uri.startswith(("/", "./", "../", "~")) or os.path.exists(os.path.expanduser(uri))
    if not local and _HUB_ID.fullmatch(uri) and uri.count("/") == 1:
        return Location(uri, "hf", uri)
    return Location(uri, "path", path=uri)


def uri_problems(uri: str | None, field: str) -> list[str]:
    """``field: …`` for a URI that cannot be valid (the operator's and the CLI's check; the CRDs' CEL rules say the
    same at ``kubectl apply``)."""
    if not uri:
        return []
    try:
        parse(uri)
    except ValueError as exc:
        return [f"{field}: {exc}"]
    return []


def cache_name(uri: str) -> str:
    """The folder of ``uri``'s fetched copy in the run's cache: readable, and unique per URI."""
    location = parse(uri)
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{location.scheme}-{location.root}-{location.path}").strip("-.")
    return f"{readable[:80]}-{hashlib.sha256(uri.encode()).hexdigest()[:10]}"


def local_path(uri: str, sources_dir: str | None, pvc_root: str = PVC_MOUNT_ROOT) -> str | None:
    """Where ``uri``'s content is on this machine: the fetched copy's folder under ``sources_dir`` (s3, hub), the
    claim's mount (pvc); None for what is not fetched or mounted (a builtin, a path, an endpoint)."""
    location = parse(uri)
    if location.scheme == "pvc":
        return "/".join(part for part in (pvc_root.rstrip("/"), location.root, location.path) if part)
    if location.fetched and sources_dir:
        return f"{sources_dir.rstrip('/')}/{cache_name(uri)}"
    return None


def claims(*uris: str | None) -> list[str]:
    """The PersistentVolumeClaims the ``pvc://`` URIs among ``uris`` name, once each, in order."""
    found: list[str] = []
    for uri in uris:
        if uri and uri.startswith(PVC_SCHEME):
            location = parse(uri)
            if location.root not in found:
                found.append(location.root)
    return found
