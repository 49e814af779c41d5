"""A real S3-compatible server for the tests: Versity's S3 Gateway (atlas_cluster/s3.py), one per test session (per
pytest-xdist worker), on 127.0.0.1 at a free port, its data in a temporary folder.

tests/conftest.py makes ``s3_server`` of :func:`s3_server` (session scope). What a test gets (:class:`S3`):
``endpoint``, ``access_key``, ``secret_key``, ``region``, ``bucket(name)`` (an empty bucket, made fresh: a test names
its own), ``env()`` (the ``AWS_*`` variables for a subprocess), ``client(**overrides)`` (a boto3 S3 client).

The binary is built by ``make s3`` (``$ATLAS_S3_BIN`` names another); when it is missing and Go is there it is
built here (about 2 minutes cold), else the tests that use it skip saying ``make s3`` — unless
``ATLAS_REQUIRE_KUBE=1`` (.ci/run), which makes that a failure, as for the real-Kubernetes tier (tests/kube/).

Error codes this server answers (versitygw v1.8.0, boto3 1.44), which tests/training/test_s3_server.py pins: a wrong
secret ``SignatureDoesNotMatch`` (403), an unknown access key ``InvalidAccessKeyId`` (403), a missing key ``NoSuchKey``
(404; a HEAD: code ``404``), a missing bucket ``NoSuchBucket`` (404); nothing listening: botocore's
``EndpointConnectionError``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from atlas_cluster.build import BuildError, ensure_s3_server, s3_server_binary
from atlas_cluster.processes import Supervisor
from atlas_cluster.s3 import S3Server, check_bucket_name

# Read at import, before tests/conftest.py's atlas_cache moves ATLAS_CACHE_DIR to a temporary folder.
BINARY = Path(os.environ.get("ATLAS_S3_BIN") or s3_server_binary())
REQUIRE = os.environ.get("ATLAS_REQUIRE_KUBE") == "1"


def require_binary() -> Path:
    """The S3 server's binary, built when missing and Go is there; else skip (or fail under ATLAS_REQUIRE_KUBE=1)
    saying ``make s3``."""
    if os.access(BINARY, os.X_OK):
        return BINARY
    try:
        if "ATLAS_S3_BIN" in os.environ:
            raise BuildError(f"ATLAS_S3_BIN={BINARY} is not an executable")
        return ensure_s3_server(BINARY, log=lambda line: None)
    except BuildError as exc:
        message = f"S3 server (versitygw): {exc} (make s3)"
        if REQUIRE:
            pytest.fail(message + " (ATLAS_REQUIRE_KUBE=1)", pytrace=False)
        pytest.skip(message)


@dataclass
class S3:
    """The session's server, as a test uses it."""

    server: S3Server

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    @property
    def access_key(self) -> str:
        return self.server.access_key

    @property
    def secret_key(self) -> str:
        return self.server.secret_key

    @property
    def region(self) -> str:
        return self.server.region

    @property
    def data(self) -> Path:
        """The folder behind the buckets (``<data>/<bucket>/<key>``)."""
        return self.server.data

    def bucket(self, name: str) -> str:
        """A new empty bucket ``name`` (one left by an earlier test of the session under that name is emptied)."""
        check_bucket_name(name)
        shutil.rmtree(self.server.data / name, ignore_errors=True)
        shutil.rmtree(self.server.directory / "meta" / name, ignore_errors=True)
        return self.server.create_bucket(name)

    def env(self) -> dict[str, str]:
        """``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and the region."""
        return {**self.server.env(), "AWS_DEFAULT_REGION": self.region, "AWS_REGION": self.region}

    def client(self, **overrides):
        """A boto3 S3 client of this server, of a session of its own (its event hooks and credentials are the
        test's alone), path-style as the fetcher asks (``overrides``: any of boto3.client's arguments)."""
        import boto3
        from botocore.config import Config

        options = dict(
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}),
        )
        return boto3.session.Session().client("s3", **{**options, **overrides})


@dataclass(frozen=True)
class Access:
    """One request of versitygw's access log (``S3Server(access_log=…)``; AWS's server access log format)."""

    bucket: str
    client: str  # the remote address: 127.0.0.1 for the host, a pod's IP for a pod
    operation: str  # s3_GetObject, s3_PutObject, s3_ListObjectsV2, s3_HeadObject, …
    key: str  # "-" for none
    status: int
    error: str  # "-" for none


def read_access_log(path: Path) -> list[Access]:
    """Every request of an access log, in order (versitygw v1.8.0 writes each line when the request is answered; it
    records neither the Range of a GET nor the bytes a GetObject sent, so count GETs, not bytes)."""
    found = []
    for line in path.read_text(errors="replace").splitlines() if path.is_file() else []:
        fields = line.split(" ")
        # owner bucket [time zone] remote requester request-id operation key request-uri status error …
        if len(fields) < 12 or not fields[2].startswith("["):
            continue  # "log starts …"
        status = int(fields[10]) if fields[10].isdigit() else 0
        found.append(Access(fields[1], fields[4], fields[7], fields[8], status, fields[11]))
    return found


def s3_server(tmp_path_factory) -> Iterator[S3]:
    """The fixture's body (tests/conftest.py: ``s3_server``, session scope): starts the server, stops it after."""
    binary = require_binary()
    directory = tmp_path_factory.mktemp("s3")
    server = S3Server(directory, binary, Supervisor(directory)).start()
    try:
        yield S3(server)
    finally:
        server.stop()
