"""``python -m atlas_cluster.node --cluster-dir DIR --nodes N``: the nodes in a process of their own (SIGTERM stops
them cleanly), what ``atlas cluster up --nodes N`` starts under its Supervisor."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from atlas_cluster.node.nodes import ProcessNodes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run process nodes for a local atlas cluster.")
    parser.add_argument("--cluster-dir", type=Path, required=True)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--cpu", default="16")
    parser.add_argument("--memory", default="64Gi")
    parser.add_argument("--network-prefix", default="atlas", help="names of the bridge and pod namespaces (<= 9)")
    args = parser.parse_args(argv)
    nodes = ProcessNodes(
        args.cluster_dir, args.nodes, args.gpus, args.cpu, args.memory, network_prefix=args.network_prefix
    )
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    nodes.start()
    print(f"process nodes ready: {', '.join(n.name for n in nodes.nodes)}", flush=True)
    try:
        stopped.wait()
    finally:
        nodes.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
