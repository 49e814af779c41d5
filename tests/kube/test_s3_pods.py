"""``atlas cluster up --nodes N --s3``'s S3 server as a pod reaches it: on a cluster with process nodes it listens on
the pods' gateway too (LocalCluster.start_s3), and a pod given the Secret ``default/atlas-s3`` with ``envFrom``
reads what the host wrote and writes what the host then reads, with boto3 and nothing but that Secret's variables.

Needs root (pod network namespaces) and a kube-scheduler, as tests/kube/test_node.py; skips without them (fails
under ``ATLAS_REQUIRE_KUBE=1``).
"""

from __future__ import annotations

import base64
import json

import boto3

from atlas_cluster.cluster import S3_SECRET, S3_SECRET_NAMESPACE
from atlas_cluster.node import Api
from harness.s3 import require_binary
from tests.kube.conftest import Kube, eventually, process_nodes

POD = "s3-reader"
SCRIPT = """
import boto3
s3 = boto3.client("s3")  # AWS_ENDPOINT_URL and the keys from the Secret, nothing else
body = s3.get_object(Bucket="atlas", Key="from-host.txt")["Body"].read().decode()
s3.put_object(Bucket="atlas", Key="from-pod.txt", Body=("pod read: " + body).encode())
print("pod read:", body, flush=True)
"""


def test_a_pod_reaches_the_s3_server_with_the_secret(kube: Kube):
    binary = require_binary()
    cluster = kube.cluster
    admin = Api(kube.kubeconfig)
    with process_nodes(kube, count=1, gpus=0, cpu=4, memory="8Gi") as nodes:
        server = cluster.start_s3(binary)
        try:
            gateway = cluster.pod_gateway()
            assert gateway and server.hosts == ("127.0.0.1", gateway)
            secret = kube.get("secret", S3_SECRET, "-n", S3_SECRET_NAMESPACE)
            stored = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
            assert stored == server.env(gateway)  # the address the pods reach
            assert stored["AWS_ENDPOINT_URL"] == f"http://{gateway}:{server.port}"

            host = boto3.client("s3", region_name=server.region, **_client_args(server.env()))
            host.put_object(Bucket="atlas", Key="from-host.txt", Body=b"hello from the host")
            container = {
                "name": "main",
                "image": "python:3.11",
                "command": ["python", "-c", SCRIPT],
                "envFrom": [{"secretRef": {"name": S3_SECRET}}],
            }
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": POD},
                "spec": {"restartPolicy": "Never", "containers": [container]},
            }
            kube.kubectl("apply", "-n", S3_SECRET_NAMESPACE, "-f", "-", input=json.dumps(pod))
            done = eventually(f"pod {POD} finished", lambda: _finished(admin), timeout=90, every=0.2)
            log = nodes.logs(S3_SECRET_NAMESPACE, POD, "main")
            assert done["status"]["phase"] == "Succeeded", log
            assert "pod read: hello from the host" in log
            written = host.get_object(Bucket="atlas", Key="from-pod.txt")["Body"].read()
            assert written == b"pod read: hello from the host"
        finally:
            kube.kubectl("delete", "pod", POD, "-n", S3_SECRET_NAMESPACE, "--wait=false", check=False)
            kube.kubectl("delete", "secret", S3_SECRET, "-n", S3_SECRET_NAMESPACE, check=False)
            server.stop()


def _client_args(env: dict[str, str]) -> dict[str, str]:
    return {
        "endpoint_url": env["AWS_ENDPOINT_URL"],
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
    }


def _finished(admin: Api) -> dict | None:
    status, pod = admin.call("GET", f"/api/v1/namespaces/{S3_SECRET_NAMESPACE}/pods/{POD}")
    return pod if status == 200 and pod.get("status", {}).get("phase") in ("Succeeded", "Failed") else None
