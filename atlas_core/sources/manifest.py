"""The manifest of a fetched copy or an export (:data:`atlas_contract.sources.MANIFEST_FILE`): the source URI, and
per file its path (relative, '/'-separated), size and sha256, with the totals.

It is written last and atomically (a temporary file renamed into place), so a folder without it is incomplete
whatever else it holds: a fetch or an export cut short leaves none, and the next one finishes the work.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from atlas_contract.sources import MANIFEST_FILE

MANIFEST_VERSION = 1
#: Files of a folder that are never part of its content: the manifest itself, a fetch's bookkeeping, partial
#: downloads, and the hub's own metadata folder (``.cache`` in a ``snapshot_download`` local folder).
PROGRESS_FILE = ".atlas-fetch.json"
PART_SUFFIX = ".part"
_CHUNK = 1 << 20


def sha256_of(path: str | os.PathLike) -> str:
    """The sha256 of a file's content, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def content_files(folder: str | os.PathLike) -> list[str]:
    """The relative paths of a folder's content, sorted: every file but the manifest, the fetch's bookkeeping,
    partial downloads and hidden folders (``.cache``)."""
    root = Path(folder)
    found = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        for name in names:
            if name in (MANIFEST_FILE, PROGRESS_FILE) or name.endswith(PART_SUFFIX) or name.startswith(".atlas-"):
                continue
            found.append((Path(directory) / name).relative_to(root).as_posix())
    return sorted(found)


def file_entries(folder: str | os.PathLike, paths: Iterable[str]) -> list[dict[str, Any]]:
    """``{"path", "size", "sha256"}`` of each of ``paths`` (relative to ``folder``), in order."""
    root = Path(folder)
    return [{"path": rel, "size": (root / rel).stat().st_size, "sha256": sha256_of(root / rel)} for rel in paths]


def manifest_of(source: str, entries: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """The manifest's content for ``entries`` (``{"path", "size", "sha256"}``) of ``source``."""
    return {
        "version": MANIFEST_VERSION,
        "source": source,
        **extra,
        "total_files": len(entries),
        "total_bytes": sum(int(e["size"]) for e in entries),
        "files": sorted(entries, key=lambda e: e["path"]),
    }


def manifest_text(manifest: dict[str, Any]) -> str:
    return json.dumps(manifest, indent=2, sort_keys=False) + "\n"


def write_manifest(
    folder: str | os.PathLike, source: str, paths: Iterable[str] | None = None, **extra: Any
) -> dict[str, Any]:
    """Write ``folder``'s manifest, last and atomically: each of ``paths`` (default: every content file) hashed,
    then the manifest written to a temporary file, flushed to disk and renamed into place. Returns it."""
    root = Path(folder)
    entries = file_entries(root, content_files(root) if paths is None else paths)
    manifest = manifest_of(source, entries, **extra)
    write_atomically(root / MANIFEST_FILE, manifest_text(manifest))
    return manifest


def write_atomically(target: Path, text: str) -> None:
    """``text`` into ``target`` through a temporary file in the same folder, flushed and renamed into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".atlas-{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _sync_folder(target.parent)


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_manifest(folder: str | os.PathLike) -> dict[str, Any] | None:
    """``folder``'s manifest, or None when there is none (or it is not one: an incomplete folder either way)."""
    try:
        manifest = json.loads((Path(folder) / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        return None
    return manifest


def problems(folder: str | os.PathLike, verify: bool = False, source: str | None = None) -> list[str]:
    """What makes ``folder`` incomplete: no manifest, a manifest of another source, a listed file missing or of
    another size, and (``verify``) another sha256. Empty when it is whole."""
    manifest = read_manifest(folder)
    if manifest is None:
        return [f"{folder}: no {MANIFEST_FILE} (an incomplete copy)"]
    if source is not None and manifest.get("source") != source:
        return [f"{folder}: holds {manifest.get('source')!r}, not {source!r}"]
    found = []
    root = Path(folder)
    for entry in manifest["files"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            return [f"{folder}: {MANIFEST_FILE} is not a manifest"]
        path = root / entry["path"]
        try:
            size = path.stat().st_size
        except OSError:
            found.append(f"{path}: missing")
            continue
        if size != entry.get("size"):
            found.append(f"{path}: {size} bytes, the manifest says {entry.get('size')}")
        elif verify and sha256_of(path) != entry.get("sha256"):
            found.append(f"{path}: its sha256 is not the manifest's")
    return found


def is_complete(folder: str | os.PathLike, verify: bool = False, source: str | None = None) -> bool:
    """Whether ``folder`` is whole: its manifest is there (of ``source``, when given) and every file it lists has
    its size (and, ``verify``, its sha256)."""
    return not problems(folder, verify, source)
