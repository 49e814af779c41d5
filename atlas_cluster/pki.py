"""The local cluster's certificates, made with ``openssl`` (as kubeadm lays them out, on a smaller scale): a CA, the
API server's serving certificate for 127.0.0.1, client certificates for the admin and the controller manager, and
the service-account signing key pair that TokenRequest tokens are signed with; and serving certificates for the
backends' controllers' webhooks on 127.0.0.1 (``sign_serving_cert``)."""

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


def sign_certificate(name: str, subject: str, extensions: str, cwd: Path, ca: Path | None = None) -> None:
    """``name.crt``/``name.key`` in ``cwd``, signed by ``ca`` (``ca.crt`` beside ``ca.key``; default cwd's)."""
    ca_crt, ca_key = (str(ca), str(ca.with_suffix(".key"))) if ca else ("ca.crt", "ca.key")
    _ec_key(name, cwd)
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=cwd)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial",
        "-days", DAYS, "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=cwd,
    )  # fmt: skip  # a command line: each flag beside its value
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


def make_ca(
    directory: Path,
    name: str = "ca",
    common_name: str = "atlas-local-cluster-ca",
    dns_name: str = "",
    rsa: bool = False,
) -> Path:
    """A self-signed CA, ``name.crt``/``name.key`` in ``directory``; ``dns_name`` also as its subjectAltName and
    ``rsa`` for an RSA key in PKCS#1 PEM (what open-policy-agent/cert-controller accepts as a CA it did not make:
    it verifies the CA against its own name, and parses its key with x509.ParsePKCS1PrivateKey)."""
    directory.mkdir(parents=True, exist_ok=True)
    if rsa:
        _openssl("genrsa", "-traditional", "-out", f"{name}.key", "2048", cwd=directory)
    else:
        _ec_key(name, directory)
    san = ["-addext", f"subjectAltName=DNS:{dns_name}"] if dns_name else []
    _openssl(
        "req", "-x509", "-new", "-key", f"{name}.key", "-subj", f"/CN={common_name}", "-days", DAYS,
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", *san,
        "-out", f"{name}.crt", cwd=directory,
    )  # fmt: skip  # a command line: each flag beside its value
    return directory / f"{name}.crt"


def sign_serving_cert(directory: Path, ca: Path, dns_names: tuple[str, ...] = (), name: str = "tls") -> Path:
    """A serving certificate for 127.0.0.1 (and localhost, and ``dns_names``) signed by ``ca`` (its ``.key``
    beside it): ``name.crt``/``name.key`` in ``directory``, as controller-runtime's webhook server reads them
    (``tls.crt``/``tls.key``). Returns the certificate's path."""
    directory.mkdir(parents=True, exist_ok=True)
    names = ",".join(f"DNS:{n}" for n in ("localhost", *dns_names))
    extensions = (
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        f"subjectAltName=IP:127.0.0.1,{names}\n"
    )
    sign_certificate(name, f"/CN={dns_names[0] if dns_names else 'localhost'}", extensions, directory, ca)
    return directory / f"{name}.crt"


def make_pki(directory: Path) -> Path:
    """Write every file once (a restart of the cluster reuses them); returns ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "complete").exists():
        return directory
    make_ca(directory)
    sign_certificate("apiserver", "/CN=kube-apiserver", SERVER, directory)
    for stem, subject in CLIENTS.items():
        sign_certificate(stem, subject, CLIENT, directory)
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=directory)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    (directory / "complete").write_text("")
    return directory
