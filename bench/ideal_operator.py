"""The floor under `atlas operator`'s latency on a real API server: an operator that does nothing but the writes.

It watches AtlasTrainings and, for each new one, renders its children with the operator's own code
(atlas_operator.render) and creates them, one after another, in a pool of as many threads as the operator's handler
workers. Nothing else: no name check before a create, no finalizer, no status, no Event, no informer of the children.
``bench/operator_throughput.py --api floor`` runs it in the operator's place, under the same ServiceAccount token,
and times it the same way (the API server's audit log): what is left of create -> children is what the control plane
itself takes on this machine for these writes.

    KUBECONFIG=<the operator's> python -m bench.ideal_operator
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import kubernetes
from atlas_operator import config
from atlas_operator.kube import Kube, default_api_client
from atlas_operator.manifests import render_children
from atlas_operator.reconcile.children import reward_yaml
from atlas_operator.revisions import Revision, stamp
from atlas_operator.validation import parse_run

from atlas_contract.names import GROUP, VERSION


def children_of(body: dict, settings: config.OperatorConfig) -> list[dict]:
    """What the operator creates for a new run (atlas_operator/reconcile/reconciler.py), owned by the run."""
    run = parse_run(body, default_backend=settings.default_backend)
    meta = body["metadata"]
    owner = {
        "apiVersion": body["apiVersion"],
        "kind": body["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    children = []
    for child in render_children(run, settings.images, reward_yaml(run), settings.network):
        child = stamp(child, Revision.of(body))
        child["metadata"].setdefault("namespace", meta["namespace"])
        child["metadata"]["ownerReferences"] = [owner]
        children.append(child)
    return children


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    settings = config.current()
    kube = Kube(default_api_client())
    api = kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(kube.api.configuration))

    def create(body: dict) -> None:
        for child in children_of(body, settings):
            kube.create(child)

    with ThreadPoolExecutor(max_workers=settings.workers) as pool:
        # Listed, then watched from the list's version, as an informer does (the bench starts once it has listed).
        # the client returns the API server's JSON list (typed as any object)
        listed = cast(dict[str, Any], api.list_cluster_custom_object(GROUP, VERSION, "atlastrainings"))
        since = listed["metadata"]["resourceVersion"]
        stream = kubernetes.watch.Watch().stream(
            api.list_cluster_custom_object, GROUP, VERSION, "atlastrainings", resource_version=since
        )
        for event in stream:
            if event["type"] == "ADDED":
                pool.submit(create, event["object"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
