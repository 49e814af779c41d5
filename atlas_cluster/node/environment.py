"""A container's environment and command as the kubelet makes them: the host's variables the nodes pass on, envFrom
(configMapRef, secretRef, prefix), value with ``$(VAR)`` expansion, fieldRef and resourceFieldRef (the downward
API, volumes' too), configMapKeyRef and secretKeyRef (read from the API as the node), and the fake GPUs' indices
in ``NVIDIA_VISIBLE_DEVICES``."""

from __future__ import annotations

import base64
import math
import os
import re

from atlas_cluster.node.container import Container
from atlas_cluster.node.lease import GPU_RESOURCE
from atlas_cluster.node.quantities import quantity
from atlas_cluster.node.worker_state import PodState


class ConfigError(RuntimeError):
    """What the kubelet reports as CreateContainerConfigError: a missing ConfigMap, Secret, key, command…"""


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)``: a defined VAR replaced, an undefined one left as written, ``$$`` → ``$``."""

    def one(match: re.Match) -> str:
        return "$" if match.group(0) == "$$" else env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", one, text)


class Environment(PodState):
    """The worker's part that resolves what a container's spec reads from the API and the downward API."""

    def _environment(self, c: Container) -> tuple[dict[str, str], list[str]]:
        env = {k: os.environ[k] for k in self.nodes.host_env if k in os.environ}
        host_path = os.environ.get("PATH", "/usr/bin:/bin")
        env["PATH"] = os.pathsep.join((str(self.nodes.shims), str(self.nodes.python_bin), host_path))
        env["HOSTNAME"] = self.hostname
        env.update(self.nodes.extra_env)
        declared: dict[str, str] = {}
        for source in c.spec.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                data = self._config_map(source["configMapRef"]["name"], source["configMapRef"].get("optional"))
            else:
                data = self._secret(source["secretRef"]["name"], source["secretRef"].get("optional"))
            for key, value in data.items():
                if re.fullmatch(r"[-._a-zA-Z][-._a-zA-Z0-9]*", prefix + key):
                    declared[prefix + key] = value
        for var in c.spec.get("env") or []:
            if "valueFrom" in var:
                source = self._env_source(c, var["valueFrom"])
                if source is None:
                    continue
                declared[var["name"]] = source
            else:
                declared[var["name"]] = expand(str(var.get("value", "")), declared)
        gpus = self._gpus(c)
        if gpus is not None:
            env["NVIDIA_VISIBLE_DEVICES"] = gpus
        env.update(declared)
        command = [expand(part, declared) for part in (c.spec.get("command") or []) + (c.spec.get("args") or [])]
        if not c.spec.get("command"):
            raise ConfigError(f"container {c.name} has no command: the process node runs no images")
        return env, command

    def _gpus(self, c: Container) -> str | None:
        limits = (c.spec.get("resources") or {}).get("limits") or {}
        wanted = int(quantity(limits.get(GPU_RESOURCE, 0)))
        if not wanted:
            return None
        if not c.gpus:
            c.gpus = self.node.take_gpus(wanted)
        return ",".join(map(str, c.gpus))

    def _env_source(self, c: Container, source: dict) -> str | None:
        if "fieldRef" in source:
            return self._field(source["fieldRef"]["fieldPath"])
        if "resourceFieldRef" in source:
            return self._resource(source["resourceFieldRef"], c.spec)
        for kind, read in (("configMapKeyRef", self._config_map), ("secretKeyRef", self._secret)):
            if kind in source:
                ref = source[kind]
                data = read(ref["name"], ref.get("optional"))
                if ref["key"] not in data:
                    if ref.get("optional"):
                        return None
                    raise ConfigError(f"key {ref['key']} not in {kind[:-6]} {ref['name']}")
                return data[ref["key"]]
        raise ConfigError(f"unsupported env source {sorted(source)}")

    def _field(self, path: str) -> str:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if match:
            return (meta.get(match.group(1)) or {}).get(match.group(2), "")
        values = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta["uid"],
            "metadata.labels": "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get("labels") or {}).items())),
            "metadata.annotations": "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get("annotations") or {}).items())),
            "spec.nodeName": self.node.name,
            "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
            "status.hostIP": self.node.ip,
            "status.hostIPs": self.node.ip,
            "status.podIP": self.ip or "",
            "status.podIPs": self.ip or "",
        }
        if path not in values:
            raise ConfigError(f"unsupported fieldRef {path}")
        return values[path]

    def _resource(self, ref: dict, container: dict | None) -> str:
        if container is None or ref.get("containerName"):
            wanted = ref.get("containerName")
            container = next(
                (x for x in self.pod["spec"].get("containers", []) if x["name"] == wanted), container or {}
            )
        kind, _, name = ref["resource"].partition(".")
        resources = (container.get("resources") or {}).get(kind) or {}
        if name in resources:
            value = quantity(resources[name])
        elif kind == "limits":
            value = quantity(self.node.allocatable.get(name, 0))
        else:
            value = 0.0
        divisor = quantity(ref.get("divisor") or "1")
        return str(max(math.ceil(value / divisor - 1e-9), 1 if value else 0))

    def _config_map(self, name: str, optional: bool | None) -> dict[str, str]:
        return self._read("configmap", name, optional)

    def _secret(self, name: str, optional: bool | None) -> dict[str, str]:
        return self._read("secret", name, optional)

    def _read(self, kind: str, name: str, optional: bool | None) -> dict[str, str]:
        """A ConfigMap's data and binaryData, or a Secret's data, decoded; {} for a missing optional one."""
        status, data = self.node.api.call("GET", f"/api/v1/namespaces/{self.namespace}/{kind}s/{name}")
        if status == 404 and optional:
            return {}
        if status != 200:
            raise ConfigError(f'{kind} "{name}" not found' if status == 404 else f"{kind} {name}: {status}")
        encoded = data.get("binaryData") if kind == "configmap" else data.get("data")
        decoded = {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in (encoded or {}).items()}
        return {**(data.get("data") or {}), **decoded} if kind == "configmap" else decoded
