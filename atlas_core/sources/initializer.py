"""``python -m atlas_core.sources.initializer --config /etc/atlas/run.yaml [--only model,student,dataset,evaluation]``
(the trainer pods) or ``--uri URI [--uri URI …]`` (a server pod's model).

The init container of the trainer and server pods: every source of the run (or each ``--uri``) that is fetched
(:attr:`atlas_contract.sources.Location.fetched`: models from S3 or the hub, datasets from S3 only: a hub dataset
stays with ``datasets``' own cache) into ``$ATLAS_SOURCES_DIR``, at
:func:`atlas_contract.sources.local_path`, once (a whole copy is skipped; another pod's fetch of the same source is
waited for). ``pvc://`` sources are mounted, not fetched; builtins, paths and endpoints are not sources.

Exit status: 0 every source is whole; :data:`~atlas_contract.sources.SOURCES_EXIT_CODE` a source failed for a
reason of :data:`~atlas_contract.sources.REASONS`: the reason, URI and message are printed and written to the
termination-message file as ``SOURCES_MARK {"reason", "uri", "message"}``, which the operator reads; 2 the run
configuration cannot be read. Nothing is written to the message file before a fetch fails.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from atlas_contract.sources import (
    ENV_SOURCES_DIR,
    FETCH_WAIT_S,
    SOURCES_EXIT_CODE,
    SOURCES_MARK,
    UNREACHABLE_WAIT_S,
    local_path,
    parse,
)

#: What ``--only`` may name: the run's fields that hold a source.
ROLES = ("model", "student", "dataset", "evaluation")
DEFAULT_MESSAGE_FILE = "/dev/termination-log"
_MAX_MESSAGE_BYTES = 4096


def run_sources(run, roles=ROLES) -> list[tuple[str, str]]:
    """(field, URI) of every source of ``run`` (a RunConfig) that is fetched, each URI once, in ``ROLES``' order:
    models from S3 or the hub, datasets from S3."""
    candidates: list[tuple[str, str, bool]] = [
        ("model", run.model, True),
        ("student", run.student or "", True),
        ("dataset", run.dataset.source, False),
    ]
    if run.evaluation is not None:
        candidates.append(("evaluation", run.evaluation_source() or "", False))
    found: list[tuple[str, str]] = []
    for role, uri, model in candidates:
        if role not in roles or not uri or any(uri == seen for _, seen in found):
            continue
        location = parse(uri)
        if location.fetched and (model or location.scheme == "s3"):
            found.append((role, uri))
    return found


def _field(role: str) -> str:
    return {"dataset": "dataset.source", "evaluation": "evaluation.dataset.source"}.get(role, role)


def write_message(path: str, error: dict[str, str]) -> None:
    """``SOURCES_MARK {json}`` into the termination-message file, within Kubernetes' 4096 bytes."""
    message = dict(error)
    text = f"{SOURCES_MARK} {json.dumps(message, separators=(',', ':'))}"
    while len(text.encode()) > _MAX_MESSAGE_BYTES and len(message["message"]) > 20:
        message["message"] = message["message"][: len(message["message"]) // 2] + "…"
        text = f"{SOURCES_MARK} {json.dumps(message, separators=(',', ':'))}"
    try:
        Path(path).write_text(text)
    except OSError as exc:
        print(f"warning: cannot write the termination message to {path}: {exc}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m atlas_core.sources.initializer",
        description="Fetch the run's models and data (S3, the hub) into $ATLAS_SOURCES_DIR, once.",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--config", help="the run configuration (run.yaml): its sources")
    which.add_argument("--uri", action="append", help="a model to fetch (repeatable), instead of a run's sources")
    parser.add_argument(
        "--only", default=",".join(ROLES), help=f"the sources to fetch, comma-separated (default: {','.join(ROLES)})"
    )
    parser.add_argument(
        "--message-file",
        default=DEFAULT_MESSAGE_FILE,
        help=f"where a failure is written for the operator (default: {DEFAULT_MESSAGE_FILE})",
    )
    parser.add_argument(
        "--sources-dir", default=None, help=f"where the copies go (default: ${ENV_SOURCES_DIR}, else the cache)"
    )
    parser.add_argument(
        "--unreachable-wait-s",
        type=float,
        default=UNREACHABLE_WAIT_S,
        help=f"how long an endpoint that does not answer is asked again (default: {UNREACHABLE_WAIT_S:g})",
    )
    parser.add_argument(
        "--lock-wait-s",
        type=float,
        default=FETCH_WAIT_S,
        help=f"how long another pod's fetch of the same source is waited for (default: {FETCH_WAIT_S:g})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    import yaml

    from atlas_contract.errors import InvalidFields
    from atlas_contract.run_config import RunConfig
    from atlas_core.sources import sources_dir
    from atlas_core.sources.errors import SourceError
    from atlas_core.sources.fetch import fetch

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    roles = [r.strip() for r in args.only.split(",") if r.strip()]
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        print(f"error: --only: unknown source {unknown[0]!r} (expected some of {', '.join(ROLES)})", file=sys.stderr)
        return 2
    try:
        if args.uri:
            sources = [("model", uri) for uri in dict.fromkeys(args.uri) if parse(uri).fetched]
        else:
            run = RunConfig.from_dict(yaml.safe_load(Path(args.config).read_text(encoding="utf-8")))
            sources = run_sources(run, roles)
    except InvalidFields as exc:
        for problem in exc.problems:
            print(f"error: {args.config}: {problem}", file=sys.stderr)
        return 2
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"error: {args.config or '--uri'}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    root = args.sources_dir or sources_dir()
    if not sources:
        print("sources: nothing to fetch", file=sys.stderr)
        return 0
    for role, uri in sources:
        folder = local_path(uri, root)
        assert folder is not None  # a fetched source has its folder under root
        try:
            fetch(uri, folder, unreachable_wait_s=args.unreachable_wait_s, lock_wait_s=args.lock_wait_s)
        except SourceError as exc:
            print(f"error: {_field(role) if args.config else '--uri'}: {exc.reason}: {exc.message}", file=sys.stderr)
            write_message(args.message_file, exc.to_dict())
            return SOURCES_EXIT_CODE
    print(f"sources: {len(sources)} whole in {root}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
