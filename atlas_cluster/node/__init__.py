"""The process node: a stand-in for the kubelet and its container runtime, for the local cluster's real control plane
(atlas_cluster/controlplane.py) and the real kube-scheduler (atlas_cluster/controlplane.py ``KubeScheduler``).

:class:`ProcessNodes` registers N Nodes (``atlas-node-0..N-1``: cpu, memory, pods and a fake ``nvidia.com/gpu``
count), keeps their Leases (kube-node-lease) renewed, and runs every pod the scheduler binds to one of them as
local processes, one process group per container, reporting the pod's status as the kubelet does. It authenticates
as each node (a client certificate ``CN=system:node:<name>, O=system:nodes`` signed by the cluster CA); the API
server runs RBAC only (no Node authorizer), so ``ensure_node_rbac`` (nodes.py) binds the bootstrap ClusterRole
``system:node`` to the group ``system:nodes``, as clusters did before the Node authorizer.

What a pod gets (honoured):

* its own network namespace (podnet.py): a pod IP from a private /16 on a host bridge, reachable from
  the host and from every other pod; ``/etc/hosts`` names the pod itself and every Service's ready endpoints (all
  of them for a headless Service with ``publishNotReadyAddresses``), ``<hostname>.<subdomain>`` for pods of a
  headless Service named by their subdomain — short names for the pod's own namespace, ``.<ns>``, ``.<ns>.svc``
  and ``.svc.cluster.local`` forms for every namespace — rewritten as pods come and go; no DNS server
  (resolv.conf points nowhere). A non-headless Service's name resolves to one ready pod IP (no kube-proxy, no
  ClusterIP), so its ``port`` must equal the ``targetPort``. ``hostNetwork: true`` pods run in the host's network.
* its own mount and UTS namespaces: every volume is a host folder bind-mounted at its real ``mountPath``
  (``subPath``, ``readOnly``) — so commands, config files and code see the paths they name, nothing is rewritten
  (a mount point missing on the host is created there, empty, and removed on stop unless a pod of another cluster
  on this host still mounts it: ``mounted_anywhere``), except a volume whose
  ``mountPath`` holds the node's own work folder (``/tmp`` where the cluster's folder is there, as in the tests: the
  servers' ``/tmp`` emptyDir): mounted, it would hide the node's files and the host programs' and caches beside them,
  so the container shares the host's folder there. Volumes: emptyDir (medium
  Memory: a tmpfs), configMap, secret, downwardAPI, projected (configMap, secret, downwardAPI,
  serviceAccountToken by TokenRequest), persistentVolumeClaim (one shared folder per claim, or the bound PV's
  hostPath), hostPath. The termination message file is a fresh per-start file mounted at
  ``terminationMessagePath``. The hostname is the pod's (``spec.hostname`` or its name).
* command/args with ``$(VAR)`` expansion; env: envFrom (configMapRef, secretRef, prefix), value, fieldRef
  (metadata.name/namespace/uid/labels/annotations, spec.nodeName/serviceAccountName, status.podIP(s)/hostIP(s)),
  resourceFieldRef, configMapKeyRef, secretKeyRef (read from the API as the node); the host's PATH (this Python's
  bin folder first, after the node's ``nslookup`` that answers from /etc/hosts: ``SHIMS``), HOME, locale, caches
  (``HOST_ENV``); ``HOSTNAME``; ``NVIDIA_VISIBLE_DEVICES`` with the fake
  GPU indices a container's ``nvidia.com/gpu`` limit got.
* init containers one after another before the containers (a sidecar init container, ``restartPolicy: Always``,
  runs beside them); probes (startup, readiness, liveness: httpGet, tcpSocket — a connection to the pod's IP at the
  port, named or numbered —, exec — exec inside the container's
  namespaces; initialDelay, period, timeout, success/failure thresholds); a failed liveness probe restarts the
  container; restartPolicy Never/OnFailure/Always with a crash-loop backoff (1 s doubling to 30 s: shorter than
  the kubelet's 10 s to 5 min); pod phase Pending → Running → Succeeded/Failed, conditions
  PodReadyToStartContainers/Initialized/ContainersReady/Ready; ``containerStatuses`` with state, lastState, exit
  code, reason Completed/Error and the termination message (4096 bytes at most; FallbackToLogsOnError: the log
  tail of a failed run).
* deletion: SIGTERM to each container's main process (its PID 1), SIGKILL to all of the container after the
  deletion's grace period (``metadata.deletionGracePeriodSeconds``), then the final status and a delete with grace
  0, as the kubelet does. A container's processes are tracked in a cgroup (v2) of their own when the host has one,
  so whatever a container started (in sessions of their own too) dies with it.
* logs: ``<workdir>/pods/<ns>_<pod>/logs/<container>.log`` (stdout and stderr, every run appended):
  ``ProcessNodes.logs``.
* PersistentVolumeClaims: the real scheduler places no pod whose claim is unbound, and this cluster has no
  provisioner, so the nodes provision (``provision_claims``): each Pending claim without a volume gets a
  ``hostPath`` PersistentVolume (its folder ``<workdir>/pvc/<ns>/<claim>``, the claim's class, size and access modes,
  pre-bound to it) that the controller manager's PV controller binds. Made as the admin (nodes may not create PVs).

Not honoured: images (every container runs the host's programs and this Python's environment, as root; the fake GPUs
are indices only: a host's real GPUs are all visible to every pod), the outside world from a pod (no NAT), resource
limits and requests at run time (no cgroup limits, no ephemeral-storage limit or emptyDir ``sizeLimit`` enforced;
the scheduler still places pods by their cpu, memory, ephemeral-storage and GPU requests against each Node's
capacity, ``ephemeral-storage`` 100Gi among it), securityContext (``readOnlyRootFilesystem`` too: a container writes
wherever the host lets root write; ``runAsUser`` and the rest likewise),
lifecycle hooks (postStart, preStop), grpc probes (always pass), ephemeral containers, ``kubectl exec/logs/
port-forward`` (no kubelet server), Service env vars and the API server from inside a pod (it listens on the host's
127.0.0.1), DNS beyond the hosts file, ConfigMap/Secret volume updates after the pod starts (they are written
once, when it starts), ImagePullBackOff and the like, eviction, static pods. Needs root (network, mount and UTS
namespaces; ``ip`` from iproute2, ``unshare`` and ``nsenter`` from util-linux).

One module per concern: nodes.py (the nodes' sync loop, PV provisioning), lease.py (a Node, its status and Lease),
pod.py (one pod's worker: its loop and deletion), runtime.py (starting and stopping a container's process),
container.py (a container's state and processes), environment.py (env and ``$(VAR)`` expansion), volumes.py,
probes.py, status.py (the pod's status), podnet.py (pod network namespaces), dns.py (the hosts-file records),
quantities.py; ``python -m atlas_cluster.node --cluster-dir DIR --nodes N`` (__main__.py) runs the nodes in a
process of their own (SIGTERM stops them cleanly): what ``atlas cluster up --nodes N`` starts under its Supervisor.
"""

from atlas_cluster.api import Api
from atlas_cluster.node.container import descendants
from atlas_cluster.node.dns import dns_records
from atlas_cluster.node.environment import expand
from atlas_cluster.node.nodes import ProcessNodes
from atlas_cluster.node.quantities import quantity
from atlas_cluster.node.volumes import mounted_anywhere

__all__ = ["Api", "ProcessNodes", "descendants", "dns_records", "expand", "mounted_anywhere", "quantity"]
