"""Kubeconfig files of the local cluster: one cluster, one user (a client certificate signed by the cluster's CA, or
a token) and one context — the admin's, each component's, each node's and each ServiceAccount's."""

from __future__ import annotations

from pathlib import Path

import yaml

from atlas_cluster.pki import CLIENT, sign_certificate


def kubeconfig(server: str, ca: Path, user: dict[str, str], name: str = "atlas") -> dict:
    """A kubeconfig of one cluster, one user (``client-certificate``/``client-key`` or ``token``) and one context."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }


def write_kubeconfig(path: Path, config: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def client_certificate(pki: Path, stem: str, subject: str) -> tuple[Path, Path]:
    """A client certificate ``<stem>.crt``/``.key`` in the cluster's ``pki`` folder, signed by its CA (made once)."""
    crt, key = pki / f"{stem}.crt", pki / f"{stem}.key"
    if not (crt.exists() and key.exists()):
        sign_certificate(stem, subject, CLIENT, pki)
    return crt, key


def server_of(admin_kubeconfig: Path) -> str:
    config = yaml.safe_load(admin_kubeconfig.read_text())
    return config["clusters"][0]["cluster"]["server"]


def user_kubeconfig(cluster_dir: Path, stem: str, subject: str) -> Path:
    """A kubeconfig in ``cluster_dir`` for a client certificate of ``subject``."""
    pki = cluster_dir / "pki"
    crt, key = client_certificate(pki, stem, subject)
    server = server_of(cluster_dir / "admin.kubeconfig")
    config = kubeconfig(server, pki / "ca.crt", {"client-certificate": str(crt), "client-key": str(key)})
    return write_kubeconfig(cluster_dir / f"{stem}.kubeconfig", config)
