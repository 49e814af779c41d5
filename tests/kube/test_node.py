"""The process node (atlas_cluster/node/) on the real control plane: pods bound by the real kube-scheduler to two
process nodes, run as local processes in pod network namespaces, reported as the kubelet reports them.

Needs root (network namespaces) and a kube-scheduler binary (the tier's bin folder, or ``$ATLAS_KUBE_SCHEDULER``);
skips without them (fails under ``ATLAS_REQUIRE_KUBE=1``).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from atlas_cluster.node import Api, ProcessNodes, podnet
from tests.kube.conftest import Kube, eventually, process_nodes

GPUS = 2  # per node


@pytest.fixture(scope="module")
def nodes(kube: Kube) -> Iterator[ProcessNodes]:
    """The real kube-scheduler and two process nodes (``GPUS`` fake GPUs each), for this module's tests."""
    with process_nodes(kube, count=2, gpus=GPUS, cpu=4, memory="8Gi") as running:
        yield running


@pytest.fixture(scope="module")
def admin(kube: Kube) -> Api:
    return Api(kube.kubeconfig)


def apply(kube: Kube, namespace: str, *objects: dict) -> None:
    kube.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}),
    )


def pod_of(admin: Api, namespace: str, name: str) -> dict | None:
    status, pod = admin.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    return pod if status == 200 else None


def phase_of(admin: Api, namespace: str, name: str, phases: tuple[str, ...]) -> dict | None:
    pod = pod_of(admin, namespace, name)
    return pod if pod and pod.get("status", {}).get("phase") in phases else None


def pod(name: str, command: list[str], restart: str = "Never", **spec) -> dict:
    container = {"name": "main", "image": "python:3.11", "command": command, **spec.pop("container", {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": spec.pop("labels", {})},
        "spec": {"restartPolicy": restart, "containers": [container], **spec},
    }


@pytest.fixture
def ns(kube: Kube, namespace: str, admin: Api) -> str:
    """The test's namespace once its default ServiceAccount exists (pods are refused before)."""
    eventually(
        "the default ServiceAccount",
        lambda: admin.call("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")[0] == 200,
    )
    return namespace


def test_nodes_registered_ready_with_gpus(nodes: ProcessNodes, kube: Kube):
    listed = {n["metadata"]["name"]: n for n in kube.get("nodes")["items"]}
    assert {"atlas-node-0", "atlas-node-1"} <= set(listed)
    for name in ("atlas-node-0", "atlas-node-1"):
        node = listed[name]
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == str(GPUS)
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
        assert not [t for t in node["spec"].get("taints") or [] if t["key"].startswith("node.kubernetes.io/")]
        lease = kube.get("lease", name, "-n", "kube-node-lease")
        assert lease["spec"]["holderIdentity"] == name


def test_pod_runs_with_configmap_env_and_termination_message(nodes: ProcessNodes, kube: Kube, ns: str, admin: Api):
    script = (
        "import os, pathlib, socket\n"
        "settings = pathlib.Path('/etc/demo/settings.yaml').read_text().strip()\n"
        "pathlib.Path('/scratch/out.txt').write_text(settings + ' ' + os.environ['GREETING'])\n"
        "print('wrote', pathlib.Path('/scratch/out.txt').read_text(), flush=True)\n"
        "try:\n"
        "    pathlib.Path('/etc/demo/new').write_text('x')\n"
        "    ro = 'writable'\n"
        "except OSError:\n"
        "    ro = 'read-only'\n"
        "message = f\"done {settings} {os.environ['GREETING']} {os.environ['POD_NAME']} {ro} {socket.gethostname()}\"\n"
        "pathlib.Path('/dev/termination-log').write_text(message)\n"
    )
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "demo"},
        "data": {"settings.yaml": "lr=0.1"},
    }
    ok = pod(
        "writer",
        ["python", "-c", script],
        container={
            "env": [
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "WHO", "value": "$(POD_NAME)-world"},
                {"name": "GREETING", "value": "hello-$(WHO)"},
            ],
            "volumeMounts": [
                {"name": "config", "mountPath": "/etc/demo"},
                {"name": "scratch", "mountPath": "/scratch"},
            ],
        },
        volumes=[{"name": "config", "configMap": {"name": "demo"}}, {"name": "scratch", "emptyDir": {}}],
    )
    failing = pod(
        "failing",
        ["python", "-c", "import sys; print('first line'); print('boom: bad input', flush=True); sys.exit(3)"],
        container={"terminationMessagePolicy": "FallbackToLogsOnError"},
    )
    apply(kube, ns, config, ok, failing)
    done = eventually("writer Succeeded", lambda: phase_of(admin, ns, "writer", ("Succeeded", "Failed")), 60)
    log = nodes.logs(ns, "writer", "main")
    assert done["status"]["phase"] == "Succeeded", log
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
    assert terminated["message"] == "done lr=0.1 hello-writer-world writer read-only writer"
    assert "wrote lr=0.1 hello-writer-world" in log
    assert done["status"]["podIP"].startswith("10.") and done["status"]["hostIP"].startswith("10.")
    assert done["spec"]["nodeName"].startswith("atlas-node-")

    failed = eventually("failing Failed", lambda: phase_of(admin, ns, "failing", ("Succeeded", "Failed")), 60)
    assert failed["status"]["phase"] == "Failed"
    terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3 and terminated["reason"] == "Error"
    assert terminated["message"] == "first line\nboom: bad input"


def test_pods_reach_each_other_by_hostname_on_the_same_port(nodes: ProcessNodes, kube: Kube, ns: str, admin: Api):
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "peers"},
        "spec": {
            "clusterIP": "None",
            "selector": {"app": "peer"},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "http", "port": 8000}],
        },
    }
    serve = "mkdir -p /tmp/www-$(HOSTNAME) && cd /tmp/www-$(HOSTNAME) && echo from-$(HOSTNAME) > index.html && "
    server = pod(
        "server",
        ["bash", "-c", serve + "exec python -m http.server 8000 --bind $(POD_IP)"],
        labels={"app": "peer"},
        hostname="server",
        subdomain="peers",
        nodeSelector={"kubernetes.io/hostname": "atlas-node-0"},
        container={
            "env": [
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "HOSTNAME", "value": "server"},
            ]
        },
    )
    fetch = (
        "import sys, time, urllib.request\n"
        "for attempt in range(100):\n"
        "    try:\n"
        "        short = urllib.request.urlopen('http://server.peers:8000/', timeout=2).read().decode().strip()\n"
        "        fqdn = urllib.request.urlopen(f'http://server.peers.{sys.argv[1]}.svc.cluster.local:8000/',\n"
        "                                      timeout=2).read().decode().strip()\n"
        "        break\n"
        "    except OSError as exc:\n"
        "        print('retry', exc, flush=True)\n"
        "        time.sleep(0.2)\n"
        "else:\n"
        "    sys.exit(1)\n"
        "open('/dev/termination-log', 'w').write(f'{short} {fqdn}')\n"
    )
    client = pod(
        "client",
        ["bash", "-c", serve + 'python -m http.server 8000 --bind 0.0.0.0 & python -c "$0" $(NS)', fetch],
        labels={"app": "peer"},
        # As the training-operator's init container for PyTorchJob workers waits for the master's name.
        initContainers=[
            {
                "name": "wait",
                "image": "alpine",
                "command": [
                    "sh",
                    "-c",
                    "for i in $(seq 100); do if nslookup server.peers; then exit 0; fi; sleep 0.2; done; exit 1",
                ],
            }
        ],
        hostname="client",
        subdomain="peers",
        nodeSelector={"kubernetes.io/hostname": "atlas-node-1"},
        container={
            "env": [
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "HOSTNAME", "value": "client"},
            ]
        },
    )
    apply(kube, ns, service, server, client)
    done = eventually("client finished", lambda: phase_of(admin, ns, "client", ("Succeeded", "Failed")), 60)
    assert done["status"]["phase"] == "Succeeded", nodes.logs(ns, "client", "main")
    assert done["status"]["containerStatuses"][0]["state"]["terminated"]["message"] == "from-server from-server"
    assert "Name:\tserver.peers\nAddress: 10." in nodes.logs(ns, "client", "wait")
    # The server (on the other node, same port) is reachable from the host at its pod IP.
    running = eventually("server Running", lambda: phase_of(admin, ns, "server", ("Running",)))
    assert running["spec"]["nodeName"] == "atlas-node-0" and done["spec"]["nodeName"] == "atlas-node-1"
    ip = running["status"]["podIP"]
    body = urllib.request.urlopen(f"http://{ip}:8000/", timeout=5).read().decode().strip()
    assert body == "from-server"
    hosts = (podnet.NETNS_ETC / nodes.network.netns_name(ip) / "hosts").read_text()
    assert f"{ip}\tserver.peers.{ns}.svc.cluster.local server" in hosts


def test_deployment_pod_passes_readiness_probe(nodes: ProcessNodes, kube: Kube, ns: str, admin: Api):
    labels = {"app": "web"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "web",
                            "image": "python:3.11",
                            # Serves only after 1.5 s: the probe fails first, then passes.
                            "command": [
                                "bash",
                                "-c",
                                "sleep 1.5; mkdir -p /tmp/web && cd /tmp/web && "
                                "echo $WEB_GREETING > $WEB_PAGE && exec python -m http.server 8080",
                            ],
                            "ports": [{"name": "http", "containerPort": 8080}],
                            "envFrom": [{"configMapRef": {"name": "web-env"}, "prefix": "WEB_"}],
                            "startupProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1, "failureThreshold": 30},
                            "readinessProbe": {"httpGet": {"path": "/ready.txt", "port": "http"}, "periodSeconds": 1},
                        }
                    ],
                },
            },
        },
    }
    web_env = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "web-env"},
        "data": {"PAGE": "ready.txt", "GREETING": "hi"},
    }
    apply(kube, ns, web_env, deployment)

    def ready() -> bool:
        status = admin.call("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/web")[1].get("status") or {}
        return status.get("readyReplicas") == 1

    eventually("the Deployment's pod Ready", ready, 60)
    (web,) = admin.ok("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
    conditions = {c["type"]: c["status"] for c in web["status"]["conditions"]}
    assert conditions["Ready"] == "True" and conditions["PodScheduled"] == "True"
    assert web["status"]["containerStatuses"][0]["ready"] is True
    assert web["status"]["containerStatuses"][0]["started"] is True
    body = urllib.request.urlopen(f"http://{web['status']['podIP']}:8080/ready.txt", timeout=5).read()
    assert body == b"hi\n"


def test_delete_sends_sigterm_and_honours_the_grace_period(nodes: ProcessNodes, kube: Kube, ns: str, admin: Api):
    graceful = pod(
        "graceful",
        [
            "python",
            "-c",
            "import signal, sys, time\n"
            "def stop(*_):\n    print('got SIGTERM', flush=True); time.sleep(0.5); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, stop)\nprint('started', flush=True)\nwhile True: time.sleep(0.1)\n",
        ],
        terminationGracePeriodSeconds=20,
    )
    stubborn = pod(
        "stubborn",
        [
            "python",
            "-c",
            "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('started', flush=True)\nwhile True: time.sleep(0.1)\n",
        ],
        terminationGracePeriodSeconds=2,
    )
    apply(kube, ns, graceful, stubborn)
    for name in ("graceful", "stubborn"):
        eventually(f"{name} started", lambda name=name: "started" in nodes.logs(ns, name, "main"), 60)
    kube.kubectl("delete", "pod", "graceful", "stubborn", "-n", ns, "--wait=false")
    for name in ("graceful", "stubborn"):
        eventually(f"{name} gone", lambda name=name: pod_of(admin, ns, name) is None, 30)
    took = {pod: (seconds, code) for pod, seconds, code in nodes.terminations}
    seconds, code = took[f"{ns}/graceful"]
    assert "got SIGTERM" in nodes.logs(ns, "graceful", "main")
    assert code == 0 and seconds < 5
    seconds, code = took[f"{ns}/stubborn"]
    assert code == 137 and 1.8 < seconds < 6


def test_pod_asking_more_gpus_than_a_node_has_stays_pending(nodes: ProcessNodes, kube: Kube, ns: str, admin: Api):
    show = ["bash", "-c", "echo -n gpus=$NVIDIA_VISIBLE_DEVICES > /dev/termination-log"]
    fits = pod("fits", show, container={"resources": {"limits": {"nvidia.com/gpu": GPUS}}})
    greedy = pod("greedy", show, container={"resources": {"limits": {"nvidia.com/gpu": GPUS + 1}}})
    apply(kube, ns, fits, greedy)
    done = eventually("fits Succeeded", lambda: phase_of(admin, ns, "fits", ("Succeeded", "Failed")), 60)
    assert done["status"]["containerStatuses"][0]["state"]["terminated"]["message"] == "gpus=0,1"

    def unschedulable() -> dict | None:
        found = pod_of(admin, ns, "greedy")
        conditions = {c["type"]: c for c in found["status"].get("conditions") or []}
        scheduled = conditions.get("PodScheduled")
        return scheduled if scheduled and scheduled.get("reason") == "Unschedulable" else None

    scheduled = eventually("greedy marked Unschedulable by the scheduler", unschedulable, 30)
    assert "nvidia.com/gpu" in scheduled["message"]
    greedy_now = pod_of(admin, ns, "greedy")
    assert greedy_now["status"]["phase"] == "Pending" and not greedy_now["spec"].get("nodeName")


def test_init_container_restart_policy_and_liveness(nodes: ProcessNodes, kube: Kube, ns: str, admin: Api):
    """OnFailure: the first run fails (restarted), the second is killed by its liveness probe (restarted), the third
    succeeds; the init container ran once, first."""
    script = (
        "cat /scratch/init.txt; n=$(cat /scratch/n 2>/dev/null || echo 0); echo $((n+1)) > /scratch/n; echo run $n; "
        "case $n in 0) exit 4;; 1) touch /scratch/alive; sleep 1; rm /scratch/alive; sleep 30;; *) exit 0;; esac"
    )
    restarts = pod(
        "restarts",
        ["bash", "-c", script],
        restart="OnFailure",
        terminationGracePeriodSeconds=1,
        initContainers=[
            {
                "name": "init",
                "image": "x",
                "command": ["bash", "-c", "echo init-ran > /scratch/init.txt"],
                "volumeMounts": [{"name": "work", "mountPath": "/scratch"}],
            }
        ],
        container={
            "volumeMounts": [{"name": "work", "mountPath": "/scratch"}],
            "livenessProbe": {
                "exec": {"command": ["test", "-e", "/scratch/alive"]},
                "initialDelaySeconds": 1,
                "periodSeconds": 1,
                "failureThreshold": 2,
            },
        },
        volumes=[{"name": "work", "emptyDir": {}}],
    )
    apply(kube, ns, restarts)
    done = eventually("restarts finished", lambda: phase_of(admin, ns, "restarts", ("Succeeded", "Failed")), 60)
    log = nodes.logs(ns, "restarts", "main")
    assert done["status"]["phase"] == "Succeeded", log
    (main,) = done["status"]["containerStatuses"]
    assert main["restartCount"] == 2
    assert main["lastState"]["terminated"]["exitCode"] == 143  # the liveness kill: SIGTERM
    assert log.split() == ["init-ran", "run", "0", "init-ran", "run", "1", "init-ran", "run", "2"]
    (init,) = done["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 0 and init["restartCount"] == 0


def test_claim_gets_a_volume_shared_by_pods(nodes: ProcessNodes, kube: Kube, ns: str, admin: Api):
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "ckpt"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    mount = {"volumeMounts": [{"name": "ckpt", "mountPath": "/checkpoints"}]}
    volumes = [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}]
    writer = pod("save", ["bash", "-c", "echo step-7 > /checkpoints/latest"], container=mount, volumes=volumes)
    apply(kube, ns, claim, writer)
    done = eventually("save finished", lambda: phase_of(admin, ns, "save", ("Succeeded", "Failed")), 60)
    assert done["status"]["phase"] == "Succeeded", nodes.logs(ns, "save", "main")
    reader = pod(
        "load", ["bash", "-c", "cat /checkpoints/latest > /dev/termination-log"], container=mount, volumes=volumes
    )
    apply(kube, ns, reader)
    done = eventually("load finished", lambda: phase_of(admin, ns, "load", ("Succeeded", "Failed")), 60)
    assert done["status"]["containerStatuses"][0]["state"]["terminated"]["message"] == "step-7\n"
    assert (nodes.claim_dir(ns, "ckpt") / "latest").read_text() == "step-7\n"
    bound = admin.ok("GET", f"/api/v1/namespaces/{ns}/persistentvolumeclaims/ckpt")
    assert bound["status"]["phase"] == "Bound"


def test_a_mount_point_another_clusters_pod_still_mounts_is_left_alone(tmp_path):
    """Two clusters on one host (two test sessions) share the mount points their pods create (/etc/atlas,
    /checkpoints, /var/cache/atlas): the node that stops first must not remove one while the other's pods mount it
    (Linux would detach their mounts). ``mounted_anywhere`` reads every process's mountinfo."""
    from atlas_cluster.node import mounted_anywhere

    proc = tmp_path / "proc"
    (proc / "41").mkdir(parents=True)
    (proc / "41" / "mountinfo").write_text(
        "25 1 0:23 / / rw - ext4 /dev/root rw\n"
        "310 25 0:55 /pods/p/volumes/config /etc/atlas ro,relatime - ext4 /dev/root rw\n"
        "311 25 0:55 /pods/p/volumes/ckpt /checkpoints/run rw - ext4 /dev/root rw\n"
    )
    (proc / "self").mkdir()  # not a pid: not read
    assert mounted_anywhere(Path("/etc/atlas"), proc) and mounted_anywhere(Path("/checkpoints"), proc)
    assert not mounted_anywhere(Path("/var/cache/atlas"), proc) and not mounted_anywhere(Path("/etc/atl"), proc)
    assert mounted_anywhere(Path("/proc"))  # this host's own
