"""A source into a local folder, once: ``s3://bucket/prefix`` with boto3, a hub model with ``snapshot_download``.

- S3: a prefix is a folder (every object under ``prefix/``), or one object when nothing is under ``prefix/`` and the
  key itself exists (a data file). boto3's own client (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``; path-style addressing when an endpoint is set, as S3-compatible
  stores expect), boto3's standard retries (never on 403 or 404). Each object is downloaded in ranged GETs of
  :data:`PART_BYTES` into ``<file>.part``, renamed when whole; a ``.part`` left by a fetch cut short is resumed from
  its size, and a file already whole (the listing's size and ETag, recorded in :data:`PROGRESS_FILE`) is not
  downloaded again.
- The hub (``hf://org/name`` or a bare ``org/name``; ``HF_ENDPOINT`` for a mirror, ``HF_TOKEN``): the repository's
  files at its current revision, with ``huggingface_hub.snapshot_download(local_dir=…)``.

The manifest is written last (atlas_core/sources/manifest.py); a folder with a whole manifest is skipped without a
single request. Pods that share the checkpoint volume fetch into the same folder: one holds an exclusive lock
(``<folder>.lock``) while the others wait for it (``lock_wait_s``), then find the manifest and skip. An endpoint that
does not answer is asked again for ``unreachable_wait_s``, then the fetch fails naming it: never a hang.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from atlas_contract.sources import FETCH_WAIT_S, MANIFEST_FILE, NOT_FOUND, UNREACHABLE, UNREACHABLE_WAIT_S, parse
from atlas_core.sources import manifest as manifests
from atlas_core.sources.errors import SourceError, from_hub, from_s3
from atlas_core.sources.manifest import PART_SUFFIX, PROGRESS_FILE

logger = logging.getLogger("atlas_core.sources")

#: One ranged GET at most this many bytes: a connection lost mid-file costs at most one part.
PART_BYTES = 8 << 20
#: boto3's standard retry mode: attempts per request (throttles, 5xx, dropped connections; never 403 or 404).
S3_MAX_ATTEMPTS = 5
_READ_CHUNK = 1 << 20
_T = TypeVar("_T")


@dataclass(frozen=True)
class FetchReport:
    """What one fetch did: the folder, its files and bytes (all of them: ``bytes_total``; downloaded this time:
    ``bytes_fetched``), and whether a whole copy was found and nothing was asked (``skipped``)."""

    uri: str
    folder: str
    files: int
    bytes_fetched: int
    bytes_total: int
    skipped: bool
    seconds: float


def fetch(
    uri: str,
    dest_folder: str | os.PathLike,
    *,
    unreachable_wait_s: float = UNREACHABLE_WAIT_S,
    lock_wait_s: float = FETCH_WAIT_S,
    session: Any = None,
    part_bytes: int = PART_BYTES,
) -> FetchReport:
    """``uri`` (``s3://…``, ``hf://…`` or a bare hub id) into ``dest_folder``, whole, with its manifest last.

    ``session``: the boto3 Session whose client fetches (default: a new one, reading the environment now).
    Raises :class:`SourceError` (AccessDenied, NotFound, Unreachable: the message names the URI, the object or the
    endpoint), ValueError for a URI that is not fetched."""
    location = parse(uri)
    if location.scheme not in ("s3", "hf"):
        raise ValueError(f"'{uri}' is not fetched (only s3:// and hub models are)")
    dest = Path(dest_folder)
    started = time.monotonic()
    if manifests.is_complete(dest, source=uri):
        return _skipped(uri, dest, started)
    with folder_lock(dest, uri, lock_wait_s):
        if manifests.is_complete(dest, source=uri):  # another process fetched it while this one waited
            return _skipped(uri, dest, started)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / MANIFEST_FILE).unlink(missing_ok=True)  # a manifest that no longer matches: incomplete again
        if location.scheme == "s3":
            kind, files, fetched = _fetch_s3(
                location.root, location.path, uri, dest, unreachable_wait_s, session, part_bytes
            )
        else:
            kind, files, fetched = "hub", *_fetch_hub(location.root, uri, dest, unreachable_wait_s)
        manifest = manifests.write_manifest(dest, uri, files, kind=kind)
    report = FetchReport(
        uri, str(dest), manifest["total_files"], fetched, manifest["total_bytes"], False, time.monotonic() - started
    )
    logger.info(
        "fetched %s: %d files, %s (%s downloaded) in %.1f s into %s",
        uri,
        report.files,
        _size(report.bytes_total),
        _size(report.bytes_fetched),
        report.seconds,
        dest,
    )
    return report


def _skipped(uri: str, dest: Path, started: float) -> FetchReport:
    manifest = manifests.read_manifest(dest) or {}
    report = FetchReport(
        uri,
        str(dest),
        int(manifest.get("total_files") or 0),
        0,
        int(manifest.get("total_bytes") or 0),
        True,
        time.monotonic() - started,
    )
    logger.info("%s: complete: skipped (%d files, %s in %s)", uri, report.files, _size(report.bytes_total), dest)
    return report


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"  # pragma: no cover


# ------------------------------------------------------------------ one fetch per folder


@contextlib.contextmanager
def folder_lock(dest: Path, uri: str, wait_s: float) -> Iterator[None]:
    """An exclusive ``flock`` on ``<dest>.lock`` (beside the folder, on the same volume), waited for at most
    ``wait_s`` seconds; SourceError (Unreachable) naming the wait when another fetch holds it longer."""
    lock_path = dest.parent / f"{dest.name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + wait_s
        announced, delay = False, 0.05
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
            if not announced:
                logger.info(
                    "%s: another fetch into %s holds %s; waiting for it (at most %g s)", uri, dest, lock_path, wait_s
                )
                announced = True
            if time.monotonic() + delay > deadline:
                raise SourceError(
                    UNREACHABLE,
                    uri,
                    f"{uri}: another fetch into {dest} held its lock {lock_path} for more than {wait_s:g} s "
                    "(the wait for a fetch of the same source); it may be stuck: see that pod, or remove the folder",
                )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _bounded(call: Callable[[], _T], classify: Callable[[BaseException], SourceError | None], wait_s: float) -> _T:
    """``call()``, asked again while it fails as Unreachable, until ``wait_s`` seconds are over (the last try at
    the end of the wait: at most one try's own timeout longer); a SourceError (the classified failure) when it fails
    otherwise or the wait is over; an unclassified error as it is."""
    deadline = time.monotonic() + wait_s
    delay = 0.5
    while True:
        try:
            return call()
        except SourceError:
            raise
        except Exception as exc:
            error = classify(exc)
            if error is None:
                raise
            remaining = deadline - time.monotonic()
            if error.reason != UNREACHABLE or remaining <= 0:
                if error.reason == UNREACHABLE:
                    error = SourceError(error.reason, error.uri, f"{error.message}; gave up after {wait_s:g} s")
                raise error from None
            pause = min(delay, remaining)
            logger.warning("%s (asking again in %.1f s)", error.message, pause)
            time.sleep(pause)
            delay = min(delay * 2, 10.0)


# ------------------------------------------------------------------ S3


def s3_endpoint_override() -> str | None:
    """The S3 endpoint the environment names (boto3 reads the same variables), else None (AWS itself)."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def s3_client(session: Any = None, max_attempts: int = S3_MAX_ATTEMPTS, connect_timeout: float = 10.0):
    """boto3's S3 client, from the environment: standard retries, path-style addressing when an endpoint is set
    (S3-compatible stores), bounded connect and read timeouts."""
    import boto3
    from botocore.config import Config

    session = session or boto3.session.Session()
    config = Config(
        retries={"mode": "standard", "max_attempts": max_attempts},
        connect_timeout=connect_timeout,
        read_timeout=60,
        s3={"addressing_style": "path"} if s3_endpoint_override() else {},
    )
    return session.client("s3", config=config)


@dataclass(frozen=True)
class _Object:
    key: str
    rel: str
    size: int
    etag: str


def _fetch_s3(
    bucket: str, path: str, uri: str, dest: Path, wait_s: float, session: Any, part_bytes: int
) -> tuple[str, list[str], int]:
    """(kind, relative paths, bytes downloaded) of ``s3://bucket/path`` fetched into ``dest``."""
    # The first requests (the listing) go through a client without retries of its own, asked again here within
    # wait_s: an endpoint that does not answer fails in bounded time, naming it.
    probe = s3_client(session, max_attempts=1, connect_timeout=max(1.0, min(10.0, wait_s)))
    endpoint = probe.meta.endpoint_url
    kind, objects = _bounded(
        lambda: _s3_listing(probe, bucket, path, uri, endpoint),
        lambda exc: from_s3(exc, uri, endpoint, uri),
        wait_s,
    )
    client = s3_client(session)
    progress = _Progress(dest, uri)
    listed = {o.rel for o in objects}
    for stale in [rel for rel in progress.files if rel not in listed]:  # gone from the source since the last fetch
        (dest / stale).unlink(missing_ok=True)
        (dest / f"{stale}{PART_SUFFIX}").unlink(missing_ok=True)
        progress.forget(stale)
    fetched = 0
    for obj in objects:
        try:
            fetched += _download(client, bucket, obj, dest, progress, part_bytes)
        except SourceError:
            raise
        except Exception as exc:
            error = from_s3(exc, uri, endpoint, f"s3://{bucket}/{obj.key}")
            if error is None:
                raise
            raise error from None
    return kind, [o.rel for o in objects], fetched


def _s3_listing(client: Any, bucket: str, path: str, uri: str, endpoint: str) -> tuple[str, list[_Object]]:
    """("prefix", every object under ``path/``) or ("object", the one object ``path``); NotFound for neither."""
    from botocore.exceptions import ClientError

    prefix = f"{path}/" if path else ""
    objects = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents") or []:
            key = item["Key"]
            rel = key[len(prefix) :]
            if key.endswith("/") or not rel:  # a folder marker
                continue
            if not _safe_relative(rel):
                logger.warning("%s: skipping s3://%s/%s: its name leaves the folder", uri, bucket, key)
                continue
            objects.append(_Object(key, rel, int(item["Size"]), str(item.get("ETag") or "")))
    if objects:
        return "prefix", objects
    if path:
        try:
            head = client.head_object(Bucket=bucket, Key=path)
        except ClientError as exc:
            status = (exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if status != 404 and exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
        else:
            name = PurePosixPath(path).name
            return "object", [_Object(path, name, int(head["ContentLength"]), str(head.get("ETag") or ""))]
    where = f"no object s3://{bucket}/{path} and no object under s3://{bucket}/{prefix}" if path else "empty bucket"
    raise SourceError(NOT_FOUND, uri, f"{uri}: nothing to fetch at {endpoint} ({where})")


def _safe_relative(rel: str) -> bool:
    parts = PurePosixPath(rel).parts
    return (
        bool(parts) and not rel.startswith("/") and ".." not in parts and not any(p.startswith(".atlas") for p in parts)
    )


class _Progress:
    """``PROGRESS_FILE``: per file, the ETag and size it was (or is being) downloaded at, and whether it is whole."""

    def __init__(self, dest: Path, uri: str):
        self.path = dest / PROGRESS_FILE
        self.uri = uri
        try:
            saved = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            saved = {}
        same = isinstance(saved, dict) and saved.get("source") == uri and isinstance(saved.get("files"), dict)
        self.files: dict[str, dict[str, Any]] = dict(saved["files"]) if same else {}

    def get(self, rel: str) -> dict[str, Any]:
        return self.files.get(rel) or {}

    def set(self, rel: str, obj: _Object, whole: bool) -> None:
        self.files[rel] = {"etag": obj.etag, "size": obj.size, "whole": whole}
        self._save()

    def forget(self, rel: str) -> None:
        self.files.pop(rel, None)
        self._save()

    def _save(self) -> None:
        manifests.write_atomically(self.path, json.dumps({"source": self.uri, "files": self.files}, indent=1))


def _download(client: Any, bucket: str, obj: _Object, dest: Path, progress: _Progress, part_bytes: int) -> int:
    """``obj`` into ``dest/<rel>`` unless it is whole there already; the bytes downloaded."""
    target = dest / obj.rel
    seen = progress.get(obj.rel)
    same = seen.get("etag") == obj.etag and seen.get("size") == obj.size
    if same and seen.get("whole") and target.is_file() and target.stat().st_size == obj.size:
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + PART_SUFFIX)
    offset = part.stat().st_size if same and part.is_file() else 0
    if offset > obj.size:
        offset = 0
    if offset:
        logger.info("s3://%s/%s: resuming at byte %d of %d", bucket, obj.key, offset, obj.size)
    progress.set(obj.rel, obj, whole=False)
    fetched = 0
    with open(part, "r+b" if offset else "wb") as out:
        out.seek(offset)
        out.truncate()
        while offset < obj.size:
            end = min(offset + part_bytes, obj.size) - 1
            response = client.get_object(Bucket=bucket, Key=obj.key, Range=f"bytes={offset}-{end}")
            if response["ResponseMetadata"]["HTTPStatusCode"] == 200 and (offset, end) != (0, obj.size - 1):
                out.seek(0)  # the store ignored the Range: it sent the whole object
                out.truncate()
                offset = 0
            for chunk in response["Body"].iter_chunks(_READ_CHUNK):
                out.write(chunk)
                offset += len(chunk)
                fetched += len(chunk)
            out.flush()
        os.fsync(out.fileno())
    if offset != obj.size:
        raise SourceError(
            UNREACHABLE, f"s3://{bucket}/{obj.key}", f"s3://{bucket}/{obj.key}: got {offset} bytes of {obj.size}"
        )
    part.replace(target)
    progress.set(obj.rel, obj, whole=True)
    return fetched


# ------------------------------------------------------------------ the hub


def hub_endpoint() -> str:
    """The hub the environment names (``HF_ENDPOINT``, a mirror), else huggingface.co."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _fetch_hub(repo_id: str, uri: str, dest: Path, wait_s: float) -> tuple[list[str], int]:
    """(relative paths, bytes downloaded) of the hub model ``repo_id`` fetched into ``dest``."""
    from huggingface_hub import HfApi, snapshot_download

    endpoint, token = hub_endpoint(), os.environ.get("HF_TOKEN") or None
    api = HfApi(endpoint=endpoint, token=token)

    def classify(exc: BaseException) -> SourceError | None:
        return from_hub(exc, uri, endpoint)

    # The repository's files at one revision, asked first: a hub that does not answer fails here, named, rather
    # than in snapshot_download (which would fall back to whatever the folder holds).
    info = _bounded(lambda: api.model_info(repo_id, files_metadata=True), classify, wait_s)
    expected = {s.rfilename: s.size for s in info.siblings or []}
    before = _sizes(dest)
    _bounded(
        lambda: snapshot_download(repo_id, revision=info.sha, local_dir=str(dest), token=token, endpoint=endpoint),
        classify,
        wait_s,
    )
    missing = [
        name
        for name, size in expected.items()
        if not (dest / name).is_file() or (size is not None and (dest / name).stat().st_size != size)
    ]
    if missing:
        raise SourceError(
            UNREACHABLE,
            uri,
            f"{uri}: {len(missing)} of {len(expected)} files did not arrive from {endpoint} (first: {missing[0]})",
        )
    after = _sizes(dest)
    fetched = sum(size - before.get(name, 0) for name, size in after.items() if size != before.get(name))
    return sorted(expected), max(fetched, 0)


def _sizes(folder: Path) -> dict[str, int]:
    if not folder.is_dir():
        return {}
    return {rel: (folder / rel).stat().st_size for rel in manifests.content_files(folder)}
