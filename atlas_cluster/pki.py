"""The local cluster's certificates, made with ``openssl`` (as kubeadm lays them out, on a smaller scale): a CA, the
API server's serving certificate for 127.0.0.1, client certificates for the admin and the controller manager, and
the service-account signing key pair that TokenRequest tokens are signed with."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

DAYS = "3650"  # a test cluster outlives no certificate


class PkiError(RuntimeError):
    pass


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if not openssl:
        raise PkiError("no `openssl` on PATH: install it (Debian: apt-get install openssl)")
    done = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PkiError(f"openssl {' '.join(args[:2])} failed: {done.stderr.strip()[-500:]}")


def _ec_key(name: str, cwd: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{name}.key", cwd=cwd)


def _signed(name: str, subject: str, extensions: str, cwd: Path) -> None:
    _ec_key(name, cwd)
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=cwd)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", DAYS, "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=cwd,
    )  # fmt: skip
    (cwd / f"{name}.csr").unlink()
    (cwd / f"{name}.ext").unlink()


CLIENT = "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
SERVER = (
    "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
    "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
)

# Client certificates: file stem → subject. O is the group: system:masters is the admin's (the RBAC superuser
# group, as kubeadm's admin.conf); the controller manager authenticates as the user its bootstrap roles name.
CLIENTS = {
    "admin": "/O=system:masters/CN=atlas-cluster-admin",
    "controller-manager": "/CN=system:kube-controller-manager",
}


def make_pki(directory: Path) -> Path:
    """Write every file once (a restart of the cluster reuses them); returns ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "complete").exists():
        return directory
    _ec_key("ca", directory)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=atlas-local-cluster-ca", "-days", DAYS,
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-out", "ca.crt", cwd=directory,
    )  # fmt: skip
    _signed("apiserver", "/CN=kube-apiserver", SERVER, directory)
    for stem, subject in CLIENTS.items():
        _signed(stem, subject, CLIENT, directory)
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=directory)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    (directory / "complete").write_text("")
    return directory
