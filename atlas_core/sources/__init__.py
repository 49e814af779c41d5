"""Models and data in from S3, a PersistentVolumeClaim or the hub, fetched once; the trained model out.

The URIs are the contract's (atlas_contract/sources.py). Here: :mod:`.fetch` (a source into a local folder, once,
resumable, one fetch per folder at a time), :mod:`.manifest` (the last file of a whole copy), :mod:`.errors`
(why a source failed: AccessDenied, NotFound, Unreachable), :mod:`.initializer` (the pods' init container) and
:mod:`.export` (the trained model out, with its model card). This package imports nothing of atlas_core: the
models, the data loader and the trainer import it.
"""

from __future__ import annotations

import os

from atlas_contract.cache import cache_root
from atlas_contract.sources import (
    ENV_SOURCES_DIR,
    HUB_SCHEME,
    PVC_MOUNT_ROOT,
    PVC_SCHEME,
    S3_SCHEME,
    SOURCES_DIR,
    local_path,
    parse,
    uri_problems,
)

#: Where ``pvc://claim/path`` is read outside the run's pods (tests, a machine with the claim mounted elsewhere);
#: unset, :data:`atlas_contract.sources.PVC_MOUNT_ROOT`.
ENV_PVC_ROOT = "ATLAS_PVC_ROOT"


def pvc_root() -> str:
    """Where the claims are mounted: ``$ATLAS_PVC_ROOT``, else the pods' mount root."""
    return os.environ.get(ENV_PVC_ROOT) or PVC_MOUNT_ROOT


def sources_dir() -> str:
    """Where fetched copies live: ``$ATLAS_SOURCES_DIR`` (set by the operator in the pods), else
    ``$ATLAS_CACHE_DIR/sources``."""
    return os.environ.get(ENV_SOURCES_DIR) or str(cache_root() / SOURCES_DIR)


def local_copy(uri: str) -> str | None:
    """Where ``uri``'s content is on this machine (:func:`atlas_contract.sources.local_path` with this machine's
    sources folder and claim mounts); None for what is neither fetched nor mounted."""
    return local_path(uri, sources_dir(), pvc_root())


def mounted_path(uri: str, field: str, what: str) -> str:
    """Where ``pvc://claim/path`` is read on this machine (``$ATLAS_PVC_ROOT``, else the pods' mount root);
    ValueError naming ``field`` when the claim is not mounted here (``what``: what the user should give instead)."""
    root = pvc_root()
    claim = parse(uri).root
    if not os.path.isdir(os.path.join(root, claim)):
        raise ValueError(
            f"{field}: '{uri}' is read from the PersistentVolumeClaim '{claim}', mounted at {root}/{claim} in the "
            f"run's pods; it is not mounted here: give the path of {what} on this machine instead"
        )
    return local_path(uri, None, root) or uri


def remote_problems(uri: str, field: str, what: str = "it") -> list[str] | None:
    """The start-up check of an ``s3://``, ``pvc://`` or ``hf://`` reference: a malformed URI, a claim not mounted
    here or nothing at its path (what is fetched is checked when it is fetched). None for any other reference, which
    the caller checks by its own rules (a local path, a builtin, a bare hub id)."""
    if not isinstance(uri, str) or not uri.startswith((S3_SCHEME, PVC_SCHEME, HUB_SCHEME)):
        return None
    problems = uri_problems(uri, field)
    if problems or not uri.startswith(PVC_SCHEME):
        return problems
    try:
        path = mounted_path(uri, field, what)
    except ValueError as exc:
        return [str(exc)]
    if not os.path.exists(path):
        return [f"{field}: '{uri}' does not exist (nothing at {path})"]
    return []
