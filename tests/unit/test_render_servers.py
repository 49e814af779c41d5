"""The rollout and student servers (atlas_operator.render.servers): vLLM as TRL runs it, GPUs requested = GPUs used,
colocate mode and the rollout settings by mode."""

from __future__ import annotations

import pytest
import yaml
from atlas_operator.crd import custom_resource_definition
from atlas_operator.manifests import render_children
from atlas_operator.render import Images
from atlas_operator.validation import parse_run

from atlas_contract import sources
from atlas_contract.errors import InvalidFields
from harness.env import REPO
from harness.manifests import teacher, training
from tests.support.k8s_schemas import jobset_schema, jobset_webhook_problems, openapi_validate, pytorchjob_schema
from tests.support.render import EXAMPLES, children, config_map_of, problem_fields


def _containers(value):
    """Every container of every pod template in rendered objects (Deployments, JobSets, PyTorchJobs)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "containers" and isinstance(item, list):
                yield from item
            else:
                yield from _containers(item)
    elif isinstance(value, list):
        for item in value:
            yield from _containers(item)


def _option(argv: list[str], name: str, default: int = 1) -> int:
    return int(argv[argv.index(name) + 1]) if name in argv else default


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
@pytest.mark.parametrize("backend", ["PyTorchJob", "JobSet"])
def test_every_vllm_server_of_the_examples_uses_every_gpu_it_requests(path, backend):
    """GPUs requested = GPUs used: each vLLM server's nvidia.com/gpu is its --tensor-parallel-size x
    --data-parallel-size."""
    for document in yaml.safe_load_all(path.read_text()):
        document["spec"]["backend"] = backend
        servers = [c for c in _containers(render_children(parse_run(document))) if "vllm" in c.get("command", [])]
        for server in servers:
            argv = server["command"] + server.get("args", [])
            used = _option(argv, "--tensor-parallel-size") * _option(argv, "--data-parallel-size")
            assert server["resources"]["limits"]["nvidia.com/gpu"] == used, argv


def test_a_server_that_would_hold_idle_gpus_is_refused():
    """gpus > tensorParallelSize means data parallelism, which TRL's and vLLM's servers refuse for dense models:
    Invalid naming gpus, for the policy's server and the student's; unset gpus follows tensorParallelSize."""
    manifest = teacher(rollout={"replicas": 1, "gpus": 2, "tensorParallelSize": 1})
    manifest["spec"]["student"] = {"model": "m/s", "rollout": {"replicas": 1, "gpus": 4, "tensorParallelSize": 2}}
    with pytest.raises(InvalidFields) as caught:
        parse_run(manifest)
    assert [p.split(":")[0] for p in caught.value.problems] == ["spec.rollout.gpus", "spec.student.rollout.gpus"]
    assert "--data-parallel-size > 1 errors out for dense models" in caught.value.problems[0]
    manifest = teacher(rollout={"replicas": 1, "tensorParallelSize": 2})
    manifest["spec"]["student"] = {"model": "m/s", "rollout": {"replicas": 1, "tensorParallelSize": 4}}
    run = parse_run(manifest)
    assert (run.spec.rollout.gpus, run.spec.student.rollout.gpus) == (2, 4)


def test_rollout_and_student_servers():
    objs = children(teacher())
    rollout = objs[("Deployment", "teacher-run-rollout")]["spec"]["template"]["spec"]["containers"][0]
    assert rollout["command"] == ["vllm", "serve"]  # what TRL runs (trl vllm-serve is deprecated)
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in rollout["env"]
    assert rollout["readinessProbe"]["httpGet"]["path"] == "/health"
    assert rollout["resources"]["limits"]["nvidia.com/gpu"] == 2
    service_ports = {p["name"]: p["port"] for p in objs[("Service", "teacher-run-rollout")]["spec"]["ports"]}
    assert service_ports == {"http": 8000, "weight-sync": 51216}
    student = objs[("Deployment", "teacher-run-student")]["spec"]["template"]["spec"]["containers"][0]
    # A hub model is fetched once into the server's cache by its initializer (the trainer image), then served from it.
    student_model = "meta-llama/Llama-3.2-1B-Instruct"
    assert student["command"] == ["vllm", "serve"] and student["args"][0] == served_copy(student_model)
    assert student["args"][student["args"].index("--served-model-name") + 1] == student_model
    (initializer,) = objs[("Deployment", "teacher-run-student")]["spec"]["template"]["spec"]["initContainers"]
    assert ["--uri", student_model] == initializer["command"][3:5] and initializer["image"] == Images().trainer
    assert student["readinessProbe"]["httpGet"]["path"] == "/health"
    config = yaml.safe_load(objs[("ConfigMap", "teacher-run-config")]["data"]["run.yaml"])
    assert config["trainer"]["use_vllm"] is True and config["trainer"]["vllm_mode"] == "server"
    assert config["trainer"]["vllm_server_base_url"] == "http://teacher-run-rollout.team-a.svc:8000"
    assert config["student"] == "http://teacher-run-student.team-a.svc:8000/v1"
    metrics = objs[("Service", "teacher-run-metrics")]["spec"]
    assert metrics["ports"][0]["port"] == 9400 and metrics["selector"]["training.kubeflow.org/replica-type"] == "master"
    assert metrics["clusterIP"] == "None"  # headless: rank 0's pod IP by name, no ClusterIP taken per run
    local = children(teacher(rollout={"replicas": 0}, student={"model": "m/s", "rollout": {"replicas": 0}}))
    assert not any(kind == "Deployment" for kind, _ in local)
    config = yaml.safe_load(local[("ConfigMap", "teacher-run-config")]["data"]["run.yaml"])
    assert "use_vllm" not in config["trainer"] and config["student"] == "m/s"


def served_copy(uri: str) -> str:
    """Where a server without a checkpoint PVC finds its fetched model: its own cache volume."""
    return sources.local_path(uri, f"/var/cache/atlas/{sources.SOURCES_DIR}")


def trl_rollout_command(model: str, **script_args) -> list[str]:
    """What the installed TRL's deprecated ``trl vllm-serve`` would exec, as ``vllm serve …`` — read from TRL's own
    ``build_command`` (trl/scripts/vllm_serve.py), for the vLLM version the trainer image pins."""
    from packaging.version import Version
    from trl.scripts import vllm_serve

    from atlas_contract.names import ROLLOUT_VLLM_VERSION

    pinned = Version(ROLLOUT_VLLM_VERSION)
    original = vllm_serve.is_vllm_available
    vllm_serve.is_vllm_available = lambda min_version=None: min_version is None or pinned >= Version(min_version)
    try:
        command = vllm_serve.build_command(vllm_serve.ScriptArguments(model=model, **script_args))
    finally:
        vllm_serve.is_vllm_available = original
    return ["vllm", *command[command.index("serve") :]]


@pytest.mark.parametrize(
    "rollout",
    [
        {"replicas": 1},
        {"replicas": 1, "tensorParallelSize": 2, "gpuMemoryUtilization": 0.8, "maxModelLen": 4096},
    ],
)
@pytest.mark.parametrize("backend", ["PyTorchJob", "JobSet"])
def test_the_rollout_server_runs_what_trl_runs(rollout, backend):
    """The server command and env are TRL 1.16's own vllm_serve equivalent (read from TRL, not copied here); the
    startup and readiness probes use vllm serve's /health, liveness only its port; the weight-sync port contract
    stays (container port, the trainer's config)."""
    manifest = training(backend=backend, rollout=rollout)
    objects = render_children(parse_run(manifest), Images())
    if backend == "JobSet":
        (js,) = [o for o in objects if o["kind"] == "JobSet"]
        pod = next(r for r in js["spec"]["replicatedJobs"] if r["name"] == "rollout")["template"]["spec"]["template"]
    else:
        pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    expected = trl_rollout_command(
        served_copy(manifest["spec"]["model"]),
        port=8000,
        tensor_parallel_size=rollout.get("tensorParallelSize", 1),
        data_parallel_size=1,
        gpu_memory_utilization=rollout.get("gpuMemoryUtilization", 0.9),
        max_model_len=rollout.get("maxModelLen"),
    )
    assert container["command"] + container["args"] == expected
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in container["env"]  # as TRL's main() sets it
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["livenessProbe"]["tcpSocket"] == {"port": "http"} and "httpGet" not in container["livenessProbe"]
    assert {"name": "weight-sync", "containerPort": 51216, "protocol": "TCP"} in container["ports"]
    config = yaml.safe_load(config_map_of(objects)["data"]["run.yaml"])["trainer"]
    assert config["vllm_mode"] == "server" and config["vllm_group_port"] == 51216


def test_remote_code_is_off_unless_the_run_asks():
    """trust_remote_code: false in run.yaml (models and tokenizers load without repository code) and no
    --trust-remote-code on the rollout server, unless spec.training.trustRemoteCode; the CRD says so, with default
    false; extra.trust_remote_code is refused (one place to set it)."""
    base = {"perDeviceTrainBatchSize": 4, "numGenerations": 4, "maxSteps": 10}
    for trusted in (False, True):
        manifest = training(training={**base, **({"trustRemoteCode": True} if trusted else {})})
        objects = render_children(parse_run(manifest), Images())
        assert yaml.safe_load(config_map_of(objects)["data"]["run.yaml"])["trainer"]["trust_remote_code"] is trusted
        (container,) = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"]
        expected = trl_rollout_command(
            served_copy(manifest["spec"]["model"]),
            port=8000,
            tensor_parallel_size=2,
            data_parallel_size=1,
            gpu_memory_utilization=0.9,
            trust_remote_code=trusted,
        )
        assert container["command"] + container["args"] == expected
        assert ("--trust-remote-code" in expected) is trusted
    for kind in ("AtlasTraining", "AtlasTeacher"):
        field = custom_resource_definition(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
            "spec"
        ]["properties"]["training"]["properties"]["trustRemoteCode"]
        assert field["default"] is False and "false never runs such code" in field["description"]
    with pytest.raises(
        InvalidFields, match="spec.training.extra.trust_remote_code: set it as spec.training.trustRemoteCode"
    ):
        parse_run(training(training={**base, "extra": {"trust_remote_code": True}}))


def test_no_configuration_renders_the_deprecated_command():
    for example in sorted((REPO / "examples").glob("*.yaml")):
        for backend in ("PyTorchJob", "JobSet"):
            manifest = yaml.safe_load(example.read_text())
            rendered = yaml.safe_dump(render_children(parse_run(manifest, default_backend=backend), Images()))
            assert "vllm-serve" not in rendered, example.name


def test_the_image_pins_a_vllm_inside_trls_supported_range():
    """TRL declares the vLLM versions it supports (its `vllm` extra); the trainer image's pin, which the rollout
    command is rendered for, must be one of them."""
    import importlib.metadata

    from packaging.requirements import Requirement

    from atlas_contract.names import ROLLOUT_VLLM_VERSION

    (declared,) = [
        Requirement(r) for r in importlib.metadata.requires("trl") if Requirement(r).name == "vllm" and "extra" in r
    ]
    pins = [
        line.split("==", 1)[1].strip()
        for line in (REPO / "trainer_image/requirements.txt").read_text().splitlines()
        if line.startswith("vllm==")
    ]
    assert pins == [ROLLOUT_VLLM_VERSION]
    assert declared.specifier.contains(ROLLOUT_VLLM_VERSION), (str(declared.specifier), ROLLOUT_VLLM_VERSION)


def test_colocate_renders_vllm_inside_the_trainer_and_no_server():
    for backend in ("PyTorchJob", "JobSet"):
        manifest = teacher(
            backend=backend,
            rollout={"mode": "colocate", "tensorParallelSize": 2, "enableSleepMode": True, "maxModelLen": 2048},
            resources={"nodes": 2, "gpusPerNode": 8},
            checkpoint={"pvc": "ckpt"},
        )
        objects = render_children(parse_run(manifest), Images())
        assert not [o for o in objects if "rollout" in o["metadata"]["name"]]
        if backend == "JobSet":
            (js,) = [o for o in objects if o["kind"] == "JobSet"]
            assert "rollout" not in [r["name"] for r in js["spec"]["replicatedJobs"]]
            openapi_validate(js, jobset_schema())
            assert jobset_webhook_problems(js) == []
        else:
            openapi_validate(next(o for o in objects if o["kind"] == "PyTorchJob"), pytorchjob_schema())
        config = yaml.safe_load(config_map_of(objects)["data"]["run.yaml"])["trainer"]
        assert {k: v for k, v in config.items() if k.startswith(("vllm", "use_vllm"))} == {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.3,  # TRL's colocate default: the trainer shares the GPU
            "vllm_tensor_parallel_size": 2,
            "vllm_enable_sleep_mode": True,
            "vllm_max_model_length": 2048,
        }


@pytest.mark.parametrize(
    ("rollout", "resources", "algorithm", "field"),
    [
        ({"mode": "colocate"}, {"gpusPerNode": 0}, "grpo", "spec.rollout.mode"),  # no GPU to share
        ({"mode": "colocate", "replicas": 1}, {"gpusPerNode": 8}, "grpo", "spec.rollout.replicas"),
        ({"mode": "colocate", "gpus": 2}, {"gpusPerNode": 8}, "grpo", "spec.rollout.gpus"),
        ({"mode": "colocate", "image": "vllm:x"}, {"gpusPerNode": 8}, "grpo", "spec.rollout.image"),
        ({"mode": "colocate", "args": ["--x"]}, {"gpusPerNode": 8}, "grpo", "spec.rollout.args"),
        ({"mode": "colocate", "memory": "8Gi"}, {"gpusPerNode": 8}, "grpo", "spec.rollout.memory"),
        ({"mode": "colocate", "cacheSize": "8Gi"}, {"gpusPerNode": 8}, "grpo", "spec.rollout.cacheSize"),
        ({"mode": "colocate", "tensorParallelSize": 3}, {"gpusPerNode": 8}, "grpo", "spec.rollout.tensorParallelSize"),
        ({"mode": "colocate"}, {"gpusPerNode": 8}, "sft", "spec.rollout.mode"),
        ({"mode": "server", "replicas": 0}, {"gpusPerNode": 8}, "grpo", "spec.rollout.replicas"),
        ({"enableSleepMode": True}, {"gpusPerNode": 8}, "grpo", "spec.rollout.enableSleepMode"),
    ],
)
def test_rollout_mode_problems_name_the_field(rollout, resources, algorithm, field):
    manifest = training(rollout=rollout, resources=resources, algorithm=algorithm)
    if algorithm == "sft":
        manifest["spec"]["reward"] = {}
    assert field in problem_fields(manifest), problem_fields(manifest)


def test_rollout_defaults_by_mode():
    server = parse_run(training(rollout={})).spec.rollout
    assert (server.replicas, server.gpus, server.gpu_memory_utilization) == (1, 1, 0.9)
    colocated = parse_run(training(rollout={"mode": "colocate"}, resources={"gpusPerNode": 1})).spec.rollout
    assert (colocated.replicas, colocated.gpu_memory_utilization) == (0, 0.3)
    sft = training(algorithm="sft", reward={}, rollout={}, training={"maxSteps": 10})
    assert parse_run(sft).spec.rollout.replicas == 0


def _server_pod(manifest, component="student"):
    """The ``component`` server's pod spec of a run (PyTorchJob backend: its Deployment's template)."""
    name = manifest["metadata"]["name"]
    return children(manifest)[("Deployment", f"{name}-{component}")]["spec"]["template"]["spec"]


def test_servers_request_cpu_memory_and_ephemeral_storage_by_default():
    """Unset cpu and memory: the defaults per GPU of the server (atlas_contract/defaults.py), CPU requested with no
    limit, memory requested and the limit; the cache volume bounded (64Gi where the server fetches its model into it,
    8Gi where the model is on the checkpoint PVC), and with /tmp and the logs requested as ephemeral storage: the
    pods are Burstable, never BestEffort."""
    from atlas_operator.render.quantities import qos_class

    from atlas_contract import defaults

    manifest = teacher(rollout={"replicas": 1, "tensorParallelSize": 2})
    rollout_pod, student_pod = _server_pod(manifest, "rollout"), _server_pod(manifest)
    scratch_gi = (defaults.SERVER_TMP_MI + defaults.SERVER_LOGS_MI) // 1024
    for pod, gpus in ((rollout_pod, 2), (student_pod, 1)):
        (server,) = pod["containers"]
        cache = f"{defaults.SERVER_MODEL_CACHE_GI + scratch_gi}Gi"
        memory = f"{defaults.SERVER_MEMORY_GI_PER_GPU * gpus}Gi"
        assert server["resources"] == {
            "requests": {"cpu": str(defaults.SERVER_CPU_PER_GPU * gpus), "memory": memory, "ephemeral-storage": cache},
            "limits": {"memory": memory, "ephemeral-storage": cache, "nvidia.com/gpu": gpus},
        }
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["cache"]["emptyDir"] == {"sizeLimit": f"{defaults.SERVER_MODEL_CACHE_GI}Gi"}
        assert volumes["tmp"]["emptyDir"] == {"sizeLimit": "1Gi"}
        assert qos_class(pod) == "Burstable"
    # The model on the run's checkpoint PVC (fetched there once for every pod): the cache holds no model.
    shared = _server_pod(teacher(checkpoint={"pvc": "ckpt"}))
    assert {v["name"]: v for v in shared["volumes"]}["cache"]["emptyDir"] == {"sizeLimit": "8Gi"}
    assert shared["containers"][0]["resources"]["requests"]["ephemeral-storage"] == f"{8 + scratch_gi}Gi"
    claimed = _server_pod(teacher(student={"model": "pvc://models/student", "rollout": {"replicas": 1}}))
    assert {v["name"]: v for v in claimed["volumes"]}["cache"]["emptyDir"] == {"sizeLimit": "8Gi"}


def test_a_runs_cpu_memory_and_cache_size_override_the_servers_defaults():
    """Set, cpu and memory are each the request and the limit (as before); cacheSize bounds the cache (an exact
    quantity, the scratch added to it in the largest binary unit that keeps it whole); 0 is none of them."""
    from atlas_operator.render.quantities import qos_class

    set_ = {"replicas": 1, "cpu": "6", "memory": "48Gi", "cacheSize": "100G"}
    pod = _server_pod(teacher(student={"model": "org/student", "rollout": set_}))
    resources = pod["containers"][0]["resources"]
    storage = f"{(100 * 10**9 + 2 * 2**30) // 1024}Ki"  # exact: 100G is a whole number of KiB
    assert resources == {
        "requests": {"cpu": "6", "memory": "48Gi", "ephemeral-storage": storage},
        "limits": {"cpu": "6", "memory": "48Gi", "ephemeral-storage": storage, "nvidia.com/gpu": 1},
    }
    assert {v["name"]: v for v in pod["volumes"]}["cache"]["emptyDir"] == {"sizeLimit": "100G"}
    assert qos_class(pod) == "Burstable"  # the initializer requests CPU with no limit
    zero = {"replicas": 1, "cpu": "0", "memory": "0Gi", "cacheSize": "0"}
    pod = _server_pod(teacher(student={"model": "/models/student", "rollout": zero}))
    assert pod["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert {v["name"]: v for v in pod["volumes"]}["cache"]["emptyDir"] == {}
    assert "initContainers" not in pod and qos_class(pod) == "BestEffort"


def test_the_servers_root_filesystem_is_read_only_and_what_they_write_is_on_volumes():
    """vllm and its initializer: readOnlyRootFilesystem, /tmp an emptyDir of its own, HOME and HF_HOME on the cache
    volume; the initializer requests and limits what the defaults say."""
    from atlas_contract import defaults

    pod = _server_pod(teacher())
    (server,) = pod["containers"]
    (initializer,) = pod["initContainers"]
    volumes = {v["name"] for v in pod["volumes"]}
    for container in (server, initializer):
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts["/tmp"] == "tmp" and mounts["/var/cache/atlas"] == "cache" and set(mounts.values()) <= volumes
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["HOME"] == "/var/cache/atlas" and env["HF_HOME"] == "/var/cache/atlas/huggingface"
    assert initializer["resources"] == {
        "requests": {
            "cpu": defaults.INITIALIZER_CPU,
            "memory": defaults.INITIALIZER_MEMORY,
            "ephemeral-storage": defaults.INITIALIZER_EPHEMERAL_STORAGE,
        },
        "limits": {"memory": defaults.INITIALIZER_MEMORY, "ephemeral-storage": defaults.INITIALIZER_EPHEMERAL_STORAGE},
    }


@pytest.mark.parametrize("backend", ["PyTorchJob", "JobSet"])
def test_a_server_that_would_be_best_effort_is_said_by_atlas_render(backend, tmp_path):
    """cpu 0 and memory 0 on a server that fetches nothing first: ``atlas render`` warns (the operator's
    ServersRequestResources=False and Warning Event say the same); the defaults, or either amount, do not."""
    import subprocess

    from atlas_operator.render import best_effort_warning

    from harness.env import PYTHON, python_env
    from harness.manifests import manifest_file

    zero = {"model": "/models/student", "rollout": {"replicas": 1, "cpu": "0", "memory": "0"}}
    manifest = teacher(backend=backend, student=zero)
    warning = best_effort_warning(parse_run(manifest))
    assert warning.startswith("the student server (spec.student.rollout.cpu and .memory: 0) requests no CPU")
    both = teacher(
        backend=backend,
        model="/models/policy",
        student=zero,
        rollout={"replicas": 1, "cpu": "0", "memory": "0", "gpus": 2, "tensorParallelSize": 2},
    )
    assert "the rollout server (spec.rollout.cpu and .memory: 0) and the student server" in best_effort_warning(
        parse_run(both)
    )
    assert best_effort_warning(parse_run(teacher(backend=backend))) is None
    some = teacher(backend=backend, student={**zero, "rollout": {"replicas": 1, "cpu": "0", "memory": "1Gi"}})
    assert best_effort_warning(parse_run(some)) is None
    proc = subprocess.run(
        [PYTHON, "-m", "atlas_cli.main", "render", str(manifest_file(tmp_path, manifest))],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and f"warning: teacher-run: {warning}" in proc.stderr, proc.stderr


def test_qos_class_is_computed_as_kubernetes_computes_it():
    """Kubernetes' ComputePodQOS: CPU and memory only, init containers too, a zero as unset, a limit alone requests
    as much."""
    from atlas_operator.render.quantities import qos_class

    def pod(*resources, init=()):
        return {
            "containers": [{"resources": r} for r in resources],
            "initContainers": [{"resources": r} for r in init],
        }

    assert qos_class(pod({})) == "BestEffort"
    assert qos_class(pod({"requests": {"ephemeral-storage": "1Gi"}, "limits": {"nvidia.com/gpu": 1}})) == "BestEffort"
    assert qos_class(pod({"requests": {"cpu": "0", "memory": "0Gi"}})) == "BestEffort"
    assert qos_class(pod({}, init=[{"requests": {"cpu": "1"}}])) == "Burstable"
    assert qos_class(pod({"requests": {"memory": "1Gi"}})) == "Burstable"
    assert qos_class(pod({"limits": {"cpu": "1", "memory": "1Gi"}})) == "Guaranteed"
    assert qos_class(pod({"requests": {"cpu": "1000m", "memory": "1024Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}))
    assert qos_class(pod({"limits": {"cpu": "1", "memory": "1Gi"}}, {"requests": {"cpu": "1"}})) == "Burstable"
    assert qos_class(pod({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}})) == "Burstable"
