"""An S3-compatible server on this machine: Versity's S3 Gateway (``versitygw``, built from its Go module by
atlas_cluster/build.py ``ensure_s3_server``) on its POSIX backend, for ``atlas cluster up --s3`` and the tests.

- Storage: ``<folder>/data`` holds the objects (each top-level folder is a bucket, each object a file below it, so a
  bucket is made with ``mkdir``); ``<folder>/meta`` their metadata (``--sidecar``: no extended attributes needed
  from the filesystem); ``<folder>/iam`` an internal IAM with no account but the root one, so that an unknown
  access key is answered ``InvalidAccessKeyId`` (403) as AWS answers it — without an IAM service versitygw answers
  ``XAdminUserNotFound`` (404).
- Credentials: a root access key and secret generated at each start, handed to the process in its environment (not
  on its command line), and kept in ``<folder>/server.json`` (mode 0600) for ``atlas cluster status``.
- Listens on each of ``hosts`` at one port (``--port`` repeated): 127.0.0.1, and on a cluster with process nodes the
  pod network's gateway too (the host's address on the pods' bridge, atlas_cluster/node/podnet.py), where pods reach it.
- Started under the cluster's Supervisor as ``s3``, so ``atlas cluster down`` stops it with the rest; ``start``
  returns once every address answers its health path (a bounded wait, ``READY_TIMEOUT``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import string
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from atlas_cluster.ports import free_port
from atlas_cluster.processes import Supervisor

PROCESS = "s3"  # its name in the Supervisor: logs/s3.log, pids.json
REGION = "us-east-1"  # versitygw's default region, passed explicitly
DEFAULT_BUCKET = "atlas"  # the bucket `atlas cluster up --s3` creates
READY_TIMEOUT = 30.0  # it answers in well under a second
HEALTH_PATH = "/_atlas-health"  # not a valid bucket name (underscore), so it shadows none
STATE_FILE = "server.json"
# S3's bucket naming rules (the subset versitygw lists: others are hidden from ListBuckets).
BUCKET_NAME = re.compile(r"^(?!\d+\.\d+\.\d+\.\d+$)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# The environment the server keeps from ours: nothing else, so a VGW_* or LOGFILE variable of the user's changes
# none of its settings.
HOST_ENV = ("PATH", "HOME", "TMPDIR", "LANG")


def check_bucket_name(name: str) -> str:
    """``name`` if S3 accepts it as a bucket's name, else ValueError."""
    if not BUCKET_NAME.match(name) or ".." in name:
        raise ValueError(f"{name!r} is not a valid S3 bucket name (3-63 of a-z, 0-9, '.', '-')")
    return name


def _key(length: int, alphabet: str) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(length))


@dataclass
class S3Server:
    """One versitygw process serving ``directory``'s data. ``start()``, ``create_bucket(name)``, ``stop()``;
    ``endpoint`` is the first address's URL, ``endpoint_for(host)`` any other's."""

    directory: Path
    binary: Path
    supervisor: Supervisor
    hosts: tuple[str, ...] = ("127.0.0.1",)
    port: int = 0  # 0: a free port, chosen at start
    access_key: str = field(default_factory=lambda: "AT" + _key(18, string.ascii_uppercase + string.digits))
    secret_key: str = field(default_factory=lambda: _key(40, string.ascii_letters + string.digits))
    region: str = REGION
    name: str = PROCESS
    # versitygw's S3 server access log (``--access-log``: one line per request, AWS's format: the operation, the
    # key, the status and the client's address), for what a test or a bench counts; None: none.
    access_log: Path | None = None

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def endpoint(self) -> str:
        return self.endpoint_for(self.hosts[0])

    def endpoint_for(self, host: str) -> str:
        if host not in self.hosts:
            raise ValueError(f"the S3 server does not listen on {host} (only {', '.join(self.hosts)})")
        return f"http://{host}:{self.port}"

    def env(self, host: str | None = None) -> dict[str, str]:
        """The ``AWS_*`` variables that point an S3 client (boto3, the aws CLI) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_for(host or self.hosts[0]),
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }

    def argv(self) -> list[str]:
        listen = [arg for host in self.hosts for arg in ("--port", f"{host}:{self.port}")]
        listen += ["--access-log", str(self.access_log)] if self.access_log else []
        return [
            str(self.binary), *listen, "--region", self.region, "--iam-dir", str(self.directory / "iam"),
            "--health", HEALTH_PATH, "posix", "--sidecar", str(self.directory / "meta"), str(self.data),
        ]  # fmt: skip  # a command line: each flag beside its value

    def start(self, timeout: float = READY_TIMEOUT) -> S3Server:
        if not os.access(self.binary, os.X_OK):
            raise FileNotFoundError(f"no S3 server binary at {self.binary} (make s3)")
        self.port = self.port or free_port()
        for folder in ("data", "meta", "iam"):
            (self.directory / folder).mkdir(parents=True, exist_ok=True)
        env = {name: os.environ[name] for name in HOST_ENV if name in os.environ}
        env.update(ROOT_ACCESS_KEY_ID=self.access_key, ROOT_SECRET_ACCESS_KEY=self.secret_key)
        self.supervisor.start(self.name, self.argv(), env=env, cwd=self.directory)
        self.save()
        urls = [self.endpoint_for(host) + HEALTH_PATH for host in self.hosts]
        self.supervisor.wait_until(
            self.name, lambda: all(_answers(url) for url in urls), timeout, f"the S3 server (versitygw) on {urls}"
        )
        return self

    def stop(self) -> None:
        self.supervisor.stop(self.name)

    def create_bucket(self, name: str) -> str:
        """The bucket ``name``, made empty when missing (its folder under ``data``; the root account sees and owns
        it); returns the name. ValueError on a name S3 refuses."""
        (self.data / check_bucket_name(name)).mkdir(parents=True, exist_ok=True)
        return name

    # ------------------------------------------------------------------ for `atlas cluster status`, later

    def save(self) -> None:
        state = {
            "hosts": list(self.hosts),
            "port": self.port,
            "region": self.region,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
        }
        path = self.directory / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:  # never readable by others
            json.dump(state, out, indent=1)
        os.replace(tmp, path)

    @classmethod
    def load(cls, directory: Path, binary: Path, supervisor: Supervisor) -> S3Server | None:
        """The server ``start`` recorded in ``directory`` (None if none was)."""
        try:
            state = json.loads((directory / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        return cls(
            directory,
            binary,
            supervisor,
            tuple(state["hosts"]),
            state["port"],
            state["access_key"],
            state["secret_key"],
            state["region"],
        )


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an http_proxy of the user's


def _answers(url: str) -> bool:
    with _DIRECT.open(url, timeout=2) as response:
        return response.status == 200


def export_line(env: dict[str, str]) -> str:
    """``export AWS_ENDPOINT_URL=… AWS_ACCESS_KEY_ID=… AWS_SECRET_ACCESS_KEY=…`` (values need no quoting)."""
    return "export " + " ".join(f"{name}={value}" for name, value in env.items())
