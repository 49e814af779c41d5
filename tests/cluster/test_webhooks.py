"""How the upstream controllers' trees are installed (atlas_cluster/controllers.py), without the trees: RFC 6902
patches, a webhook kustomization's patches and replacements, kustomize's namespace and prefix, and the webhooks
pointed at a server on 127.0.0.1."""

from __future__ import annotations

import base64

import pytest
import yaml

from atlas_cluster.controllers import ControllerError, json_patch, kustomize, served_at, webhook_configurations
from atlas_cluster.versions import Controller


def test_json_patch_adds_replaces_and_removes_in_maps_and_lists():
    doc = {"a": {"b": 1, "c/d": 2, "e~f": 3}, "list": [1, 2, 3]}
    json_patch(
        doc,
        [
            {"op": "replace", "path": "/a/b", "value": 10},
            {"op": "remove", "path": "/a/c~1d"},
            {"op": "add", "path": "/a/e~0f", "value": 30},
            {"op": "add", "path": "/list/0", "value": 0},
            {"op": "add", "path": "/list/-", "value": 4},
            {"op": "replace", "path": "/list/1", "value": 11},
            {"op": "remove", "path": "/list/2"},
        ],
    )
    assert doc == {"a": {"b": 10, "e~f": 30}, "list": [0, 11, 3, 4]}


def test_json_patch_refuses_what_it_does_not_do():
    with pytest.raises(ControllerError, match="'move'"):
        json_patch({"a": 1}, [{"op": "move", "from": "/a", "path": "/b"}])


def webhook(name, **fields):
    return {"name": name, "clientConfig": {"service": {"name": "svc", "namespace": "ns", "path": f"/{name}"}}, **fields}


def write(path, *docs):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(docs))


def test_webhook_configurations_apply_the_kustomizations_patches_and_replacements(tmp_path):
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "validating"},
        "webhooks": [webhook("v1.x", failurePolicy="Fail", namespaceSelector={"a": 1}), webhook("v2.x")],
    }
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating"},
        "webhooks": [webhook("m1.x")],
    }
    write(tmp_path / "webhook" / "manifests.yaml", validating, mutating)
    write(
        tmp_path / "webhook" / "patch.yaml", [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}]
    )
    kustomization = {
        "resources": ["manifests.yaml"],
        "patches": [
            {"path": "patch.yaml", "target": {"kind": "MutatingWebhookConfiguration", "name": "mutating"}},
            {
                "patch": yaml.safe_dump(
                    {
                        "kind": "ValidatingWebhookConfiguration",
                        "metadata": {"name": "validating"},
                        "webhooks": [{"name": "v2.x", "timeoutSeconds": 5}],
                    }
                )
            },
        ],
        "replacements": [
            {
                "source": {
                    "kind": "ValidatingWebhookConfiguration",
                    "name": "validating",
                    "fieldPath": "webhooks.[name=v1.x].namespaceSelector",
                },
                "targets": [
                    {
                        "select": {"kind": "MutatingWebhookConfiguration"},
                        "fieldPaths": ["webhooks.[name=m1.x].namespaceSelector"],
                    }
                ],
            }
        ],
    }
    write(tmp_path / "webhook" / "kustomization.yaml", kustomization)
    spec = Controller("x", "example.com/x", "v1", "cmd", "x", "x-system", "x-", (), ("webhook/manifests.yaml",))

    docs = {doc["kind"]: doc for doc in webhook_configurations(tmp_path, spec)}

    assert docs["MutatingWebhookConfiguration"]["webhooks"][0]["failurePolicy"] == "Ignore"
    assert docs["MutatingWebhookConfiguration"]["webhooks"][0]["namespaceSelector"] == {"a": 1}
    assert docs["ValidatingWebhookConfiguration"]["webhooks"][1]["timeoutSeconds"] == 5
    assert docs["ValidatingWebhookConfiguration"]["webhooks"][0]["failurePolicy"] == "Fail"  # the patch's target only


def test_served_at_points_every_webhook_at_127_0_0_1_with_its_path_and_ca():
    config = {"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "v"}, "webhooks": [webhook("a.x")]}
    served = served_at([config], 9443, b"CA PEM")
    assert served[0]["webhooks"][0]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/a.x",
        "caBundle": base64.b64encode(b"CA PEM").decode(),
    }
    assert config["webhooks"][0]["clientConfig"]["service"]["path"] == "/a.x"  # the input is left as it was


def test_kustomize_prefixes_names_and_namespaces_what_is_namespaced_and_what_bindings_name():
    docs = [
        {"kind": "ServiceAccount", "metadata": {"name": "manager"}},
        {"kind": "ClusterRole", "metadata": {"name": "role"}},
        {
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "binding"},
            "roleRef": {"name": "role"},
            "subjects": [
                {"kind": "ServiceAccount", "name": "manager", "namespace": "system"},
                {"kind": "User", "name": "u"},
            ],
        },
    ]
    account, role, binding = kustomize(docs, "x-system", "x-")
    assert account["metadata"] == {"name": "x-manager", "namespace": "x-system"}
    assert role["metadata"] == {"name": "x-role"}
    assert binding["roleRef"]["name"] == "x-role"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "x-manager", "namespace": "x-system"},
        {"kind": "User", "name": "u"},
    ]
    assert docs[0]["metadata"] == {"name": "manager"}  # a copy
