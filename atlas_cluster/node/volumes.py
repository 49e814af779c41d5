"""A pod's volumes as host folders: emptyDir (medium Memory: a tmpfs), configMap, secret, downwardAPI, projected
(configMap, secret, downwardAPI, serviceAccountToken by TokenRequest), persistentVolumeClaim (the bound PV's
hostPath, else one shared folder per claim), hostPath. Each is bind-mounted at its ``mountPath`` by runtime.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

from atlas_cluster.node.environment import ConfigError, Environment
from atlas_cluster.node.quantities import quantity


def mounted_anywhere(path: Path, proc: Path = Path("/proc")) -> bool:
    """Whether a mount sits at or under ``path`` in some process's mount namespace (``/proc/<pid>/mountinfo``): a
    pod of another process node on this host (two clusters at once, as two test sessions run them). Linux detaches
    such mounts when their mount point is removed, so a node leaves the mount points it made alone while one does."""
    target = str(path)
    for info in proc.glob("[0-9]*/mountinfo"):
        try:
            lines = info.read_text().splitlines()
        except OSError:  # the process ended
            continue
        for line in lines:
            fields = line.split(" ", 5)
            if len(fields) > 4 and (fields[4] == target or fields[4].startswith(target + "/")):
                return True
    return False


class Volumes(Environment):
    """The worker's part that makes the pod's volumes (once, when it starts; retried until every source is there)."""

    def _make_volumes(self) -> dict[str, Path]:
        volumes: dict[str, Path] = {}
        for volume in self.pod["spec"].get("volumes") or []:
            name = volume["name"]
            local = self.directory / "volumes" / name
            if "persistentVolumeClaim" in volume:
                volumes[name] = self._claim(volume["persistentVolumeClaim"]["claimName"])
            elif "hostPath" in volume:
                path = Path(volume["hostPath"]["path"])
                if volume["hostPath"].get("type") in ("DirectoryOrCreate", None, "") and not path.exists():
                    path.mkdir(parents=True, exist_ok=True)
                volumes[name] = path
            elif "emptyDir" in volume:
                if not local.exists():
                    local.mkdir(parents=True)
                    if (volume["emptyDir"] or {}).get("medium") == "Memory":
                        size = (volume["emptyDir"] or {}).get("sizeLimit")
                        options = ["-o", f"size={int(quantity(size))}"] if size else []
                        subprocess.run(["mount", "-t", "tmpfs", *options, "tmpfs", str(local)], check=True)
                        self.tmpfs.append(local)
                volumes[name] = local
            else:
                files = self._projected_files(volume)
                self.read_only_volumes.add(name)
                local.mkdir(parents=True, exist_ok=True)
                mode = next((volume[k].get("defaultMode") for k in volume if isinstance(volume[k], dict)), None)
                for relative, (content, file_mode) in files.items():
                    path = local / relative
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(content)
                    if file_mode or mode:
                        path.chmod(file_mode or mode)
                volumes[name] = local
        return volumes

    def _projected_files(self, volume: dict) -> dict[str, tuple[bytes, int | None]]:
        """A configMap/secret/downwardAPI/projected volume's files: path → (content, mode)."""
        if "projected" in volume:
            files: dict[str, tuple[bytes, int | None]] = {}
            for source in volume["projected"].get("sources") or []:
                files.update(self._projected_files(source))
            return files
        if "configMap" in volume or "secret" in volume:
            kind = "configMap" if "configMap" in volume else "secret"
            ref = volume[kind]
            name = ref.get("name") or ref.get("secretName")
            data = (self._config_map if kind == "configMap" else self._secret)(name, ref.get("optional"))
            items = ref.get("items") or [{"key": k, "path": k} for k in data]
            out = {}
            for item in items:
                if item["key"] not in data:
                    if ref.get("optional"):
                        continue
                    raise ConfigError(f"key {item['key']} not in {kind} {name}")
                out[item["path"]] = (data[item["key"]].encode(), item.get("mode"))
            return out
        if "downwardAPI" in volume:
            out = {}
            for item in volume["downwardAPI"].get("items") or []:
                if "fieldRef" in item:
                    value = self._field(item["fieldRef"]["fieldPath"])
                else:
                    value = self._resource(item["resourceFieldRef"], None)
                out[item["path"]] = (value.encode(), item.get("mode"))
            return out
        if "serviceAccountToken" in volume:
            spec = volume["serviceAccountToken"]
            return {spec["path"]: (self._token(spec).encode(), None)}
        if "clusterTrustBundle" in volume:
            return {}
        raise ConfigError(f"unsupported volume {sorted(k for k in volume if k != 'name')}")

    def _token(self, spec: dict) -> str:
        account = self.pod["spec"].get("serviceAccountName", "default")
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [spec["audience"]] if spec.get("audience") else [],
                "expirationSeconds": spec.get("expirationSeconds", 3607),
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.pod_name, "uid": self.uid},
            },
        }
        status, data = self.node.api.call(
            "POST", f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token", request
        )
        if status != 201:
            raise ConfigError(f"token of serviceaccount {account}: HTTP {status}: {data.get('message')}")
        return data["status"]["token"]

    def _claim(self, claim: str) -> Path:
        """The bound PV's hostPath, else the claim's shared folder."""
        status, pvc = self.node.api.call("GET", f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims/{claim}")
        if status == 404:
            raise ConfigError(f'persistentvolumeclaim "{claim}" not found')
        volume = (pvc.get("spec") or {}).get("volumeName")
        if volume:
            status, pv = self.node.api.call("GET", f"/api/v1/persistentvolumes/{volume}")
            path = ((pv.get("spec") or {}).get("hostPath") or (pv.get("spec") or {}).get("local") or {}).get("path")
            if status == 200 and path:
                Path(path).mkdir(parents=True, exist_ok=True)
                return Path(path)
        local = self.nodes.claim_dir(self.namespace, claim)
        local.mkdir(parents=True, exist_ok=True)
        return local
