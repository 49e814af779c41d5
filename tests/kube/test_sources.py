"""Models and data in from S3, fetched once; the trained teacher out, with its evaluation — on the tier's real
cluster (the real training-operator, the kube-scheduler and two process nodes) and a real S3 server (versitygw,
atlas_cluster/s3.py) that the pods reach at the nodes' gateway, as ``atlas cluster up --nodes N --s3`` runs it
(tests/kube/test_s3_pods.py), with its access log on: every request it answered, with the client's address.

- One AtlasTeacher whose model, student and datasets are ``s3://`` URIs (the tiny model uploaded once: teacher and
  student are the same URI; a multistep file with a ``split`` column, train and test), a checkpoint PVC, two trainer
  nodes and a student server (the nodes' ``vllm`` is harness/vllm_standin.py, which checks that its model
  path is a model folder): it succeeds; the server's init container and the trainer pods together fetched each
  source object once (the server's access log: one GET per object, from the pods); the export in the bucket is whole
  (every file of its manifest, size and sha256), its manifest written last (the server's data folder), its model
  card names the sources and holds the run's evaluation, which ``.status.result.evaluation`` equals;
  ``atlas eval --teacher s3://…`` (the real CLI, on this host) gives the run's own evaluation, problem by problem.
- Faults, each failing before training: wrong credentials (SourcesReady=False AccessDenied, naming the URI, the
  secret in no Event, status, ConfigMap or pod status), a missing object (NotFound naming it), an endpoint that does
  not answer (Failed after the fetcher's bounded wait, naming the endpoint: that run is applied first, so that its
  wait overlaps the other tests), and an export to a missing bucket (Exported=False NotFound, the model kept on the
  checkpoint volume; once the bucket exists the restarted pod exports without training again, and the run Succeeds).
- LoRA runs (spec.training.lora), each on two nodes with its Worker SIGKILLed after a checkpoint: the restarted
  gang resumes the checkpoint's adapter exactly once (rank 0's fingerprint of the adapter it holds at the first
  resumed step equals the checkpoint file's); an AtlasTeacher exports with output.merge (the merged model at the
  top, the adapter in adapter/), an AtlasTraining the adapter alone; each adapter names the run's model as its base.
- Experiment tracking (spec.tracking.mlflow) against a real MLflow server the pods reach at the gateway
  (atlas_cluster/mlflow.py, as ``atlas cluster up --mlflow`` runs it): a teacher killed once mid-training and resumed
  ends Succeeded with one MLflow run holding every step once, its params, its evaluation and its artifacts, named by
  ``.status.tracking.runId``; a server that does not answer is condition Tracking=False and a Warning naming it, and
  the run still succeeds.

The module shares one namespace, chart release and operator (``world``): its runs have names of their own.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from atlas_cluster.mlflow import MLflowServer
from atlas_cluster.node import ProcessNodes
from atlas_cluster.s3 import S3Server
from atlas_contract import names, results
from atlas_contract.sources import (
    EXPORT_PENDING_FILE,
    MANIFEST_FILE,
    MODEL_CARD_FILE,
    SOURCES_EXIT_CODE,
    UNREACHABLE_WAIT_S,
    cache_name,
    local_path,
)
from atlas_core.sources.manifest import is_complete
from harness import vllm_standin
from harness.env import PYTHON, REPO, free_port, python_env
from harness.s3 import read_access_log, require_binary
from tests.kube.conftest import Kube, eventually, process_nodes, start_release, stop_release, upstream_controllers
from tests.kube.test_runs import World, local_teacher

boto3 = pytest.importorskip("boto3")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NAMESPACE = "sources-s3"
SECRET, WRONG_SECRET = "s3", "s3-wrong"
MODEL_KEY, DATA_KEY = "models/tiny-llama", "data/multistep.jsonl"
TRAIN_PROBLEMS, TEST_PROBLEMS = 8, 4
EVAL_LIMIT = 3
TEACHING = {"maxProbeTokens": 4, "maxGuidanceTokens": 10, "studentSamples": 2, "studentMaxTokens": 4}
TRAINING = {"maxSteps": 2, "perDeviceTrainBatchSize": 2, "numGenerations": 2, "maxCompletionLength": 12}
SOURCES_DIR = "/checkpoints/{run}/sources"  # the run's cache on its checkpoint volume (checkpoint.path /checkpoints)


# ---------------------------------------------------------------------- the cluster, the store, the namespace


@pytest.fixture(scope="module")
def nodes(kube: Kube, tmp_path_factory) -> Iterator[ProcessNodes]:
    """The training-operator (PyTorchJob: the runs here need no other backend), the scheduler and two process nodes
    whose ``vllm`` is the stand-in (fake GPUs for the student server, which asks for one)."""
    standin = vllm_standin.install(tmp_path_factory.mktemp("vllm-standin"))
    with (
        upstream_controllers(kube, ("training-operator",)),
        process_nodes(kube, count=2, gpus=2, cpu=8, memory="16Gi") as running,
    ):
        path = (str(standin), str(running.shims), str(running.python_bin), os.environ.get("PATH", "/usr/bin:/bin"))
        running.extra_env["PATH"] = os.pathsep.join(path)
        yield running


@dataclass
class Store:
    """The module's S3 server: on 127.0.0.1 (this host) and on the nodes' gateway (the pods), with its access log."""

    server: S3Server
    gateway: str

    @property
    def pod_endpoint(self) -> str:
        return self.server.endpoint_for(self.gateway)

    def client(self, **overrides):
        from botocore.config import Config

        options = dict(
            endpoint_url=self.server.endpoint,
            aws_access_key_id=self.server.access_key,
            aws_secret_access_key=self.server.secret_key,
            region_name=self.server.region,
            config=Config(s3={"addressing_style": "path"}),
        )
        return boto3.session.Session().client("s3", **{**options, **overrides})

    def host_env(self) -> dict[str, str]:
        """The ``AWS_*`` of this host's address, for a CLI run here."""
        return {**self.server.env(), "AWS_DEFAULT_REGION": self.server.region}

    def bucket_with_sources(self, bucket: str, model_dir: Path) -> dict[str, str]:
        """A new bucket holding the tiny model under MODEL_KEY and the multistep file at DATA_KEY: {key: sha256}."""
        from atlas_core.tasks.multistep import kind_of, make_multistep_dataset, prompt_of

        self.server.create_bucket(bucket)
        client, uploaded = self.client(), {}
        for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
            key = f"{MODEL_KEY}/{path.relative_to(model_dir).as_posix()}"
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
            uploaded[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        rows = [dict(r, split="train") for r in make_multistep_dataset(TRAIN_PROBLEMS, "train")]
        # The first test problem's answer is the stand-in student's ("The answer is 4."): figures that are not all 0.
        fours = [{"prompt": prompt_of("1 + 3"), "question": "1 + 3", "kind": kind_of("1 + 3"), "ground_truth": "4"}]
        rows += [dict(r, split="test") for r in fours + make_multistep_dataset(TEST_PROBLEMS, "test")]
        body = "".join(json.dumps(row) + "\n" for row in rows).encode()
        client.put_object(Bucket=bucket, Key=DATA_KEY, Body=body)
        uploaded[DATA_KEY] = hashlib.sha256(body).hexdigest()
        return uploaded

    def pod_gets(self, bucket: str) -> Counter:
        """GetObject requests the pods made in ``bucket`` (this host's own reads left out), by key."""
        return Counter(
            a.key
            for a in read_access_log(self.server.access_log)
            if a.bucket == bucket and a.operation == "s3_GetObject" and a.client != "127.0.0.1" and a.status < 300
        )


@pytest.fixture(scope="module")
def store(kube: Kube, nodes: ProcessNodes, tmp_path_factory) -> Iterator[Store]:
    """The S3 server where pods reach it: on the nodes' gateway as well as 127.0.0.1, one port (the session's
    ``s3_server`` listens on 127.0.0.1 alone, which no pod reaches), under the cluster's supervisor."""
    directory = tmp_path_factory.mktemp("s3-sources")
    gateway = nodes.network.gateway
    server = S3Server(
        directory,
        require_binary(),
        kube.cluster.supervisor,
        hosts=("127.0.0.1", gateway),
        name="s3-sources",
        access_log=directory / "access.log",
    ).start()
    try:
        yield Store(server, gateway)
    finally:
        server.stop()


@dataclass
class Sources:
    """What the module's runs share: the world (namespace, operator, nodes), the store, the wrong secret's value and
    the run applied first (an endpoint that does not answer) with the time it was applied."""

    world: World
    store: Store
    wrong_secret: str
    unreachable: dict
    unreachable_applied: float
    unreachable_endpoint: str


@pytest.fixture(scope="module")
def sources(kube: Kube, nodes: ProcessNodes, store: Store, tiny_model_dir: Path) -> Iterator[Sources]:
    """One namespace, the chart's release and its operator for the module, the Secrets (the store's keys at the
    gateway's address; the same with a wrong secret key), the checkpoint claim ``ckpt``, and the run whose endpoint
    does not answer, applied at once."""
    kube.kubectl("create", "namespace", NAMESPACE)
    eventually(
        f"namespace {NAMESPACE}'s default ServiceAccount",
        lambda: kube.kubectl("get", "serviceaccount", "default", "-n", NAMESPACE, check=False).returncode == 0,
    )
    release = start_release(kube, NAMESPACE)
    try:
        world = World(kube, NAMESPACE, nodes)
        wrong = secrets.token_urlsafe(30)
        keys = {
            "AWS_ACCESS_KEY_ID": store.server.access_key,
            "AWS_SECRET_ACCESS_KEY": store.server.secret_key,
            "AWS_ENDPOINT_URL": store.pod_endpoint,
        }
        for name, values in ((SECRET, keys), (WRONG_SECRET, {**keys, "AWS_SECRET_ACCESS_KEY": wrong})):
            world.core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": name}, "stringData": values})
        world.create_pvc("ckpt")
        store.bucket_with_sources("unreachable", tiny_model_dir)
        endpoint = f"http://{store.gateway}:{free_port()}"  # nothing listens there
        unreachable = world.apply(
            fault_run("unreachable", "unreachable", storage={"endpoint": endpoint, "secretRef": {"name": SECRET}})
        )
        applied = time.monotonic()
        yield Sources(world, store, wrong, unreachable, applied, endpoint)
    finally:
        stop_release(kube, release)
        kube.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


# ---------------------------------------------------------------------- runs


def s3_teacher(name: str, bucket: str, nodes: int = 1, server: bool = False, **spec) -> dict:
    """examples/local-teacher.yaml as run ``name`` reading its model, student and datasets from ``bucket`` (the
    student the same URI as the model), tiny settings, evaluated on EVAL_LIMIT test problems."""
    model, data = f"s3://{bucket}/{MODEL_KEY}", f"s3://{bucket}/{DATA_KEY}"
    return local_teacher(
        name,
        training=TRAINING,
        model=model,
        dataset={"source": data, "split": "train"},
        resources={"nodes": nodes, "gpusPerNode": 0, "cpu": "1", "memory": "1Gi"},
        student={"model": model, "rollout": {"replicas": int(server), "memory": "2Gi"}},
        teaching=TEACHING,
        evaluation={"samples": 1, "limit": EVAL_LIMIT, "dataset": {"source": data, "split": "test"}},
        **{"storage": {"secretRef": {"name": SECRET}}, **spec},
    )


def fault_run(name: str, bucket: str, **spec) -> dict:
    """A run that fails before training: one node, no checkpoint PVC, no server."""
    return s3_teacher(name, bucket, checkpoint={"path": "/checkpoints", "saveSteps": 2}, **spec)


def condition(status: dict, kind: str) -> dict | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), None)


def has_condition(kind: str, state: str, reason: str | None = None):
    def check(status: dict) -> bool:
        found = condition(status, kind)
        return bool(found) and found["status"] == state and (reason is None or found.get("reason") == reason)

    return check


def delete_run(world: World, manifest: dict) -> None:
    world.kube.kubectl("delete", "atlasteacher", manifest["metadata"]["name"], "-n", world.ns, "--wait=false")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def percent(value) -> str:  # as the model card writes them (atlas_core/sources/export.py)
    return f"{100 * value:.1f}%"


def points(value) -> str:
    return f"{100 * value:+.1f}"


# ---------------------------------------------------------------------- the whole way, once


def test_a_teacher_from_s3_fetches_each_source_once_and_exports_its_evaluated_model(
    sources: Sources, tiny_model_dir: Path, tmp_path: Path
):
    world, store = sources.world, sources.store
    bucket, name = "main", "s3-teacher"
    uploaded = store.bucket_with_sources(bucket, tiny_model_dir)
    model, data = f"s3://{bucket}/{MODEL_KEY}", f"s3://{bucket}/{DATA_KEY}"
    export = f"s3://{bucket}/exports/{name}"
    out = world.nodes.claim_dir(NAMESPACE, "ckpt") / name
    teacher = world.apply(
        s3_teacher(
            name,
            bucket,
            nodes=2,
            server=True,
            checkpoint={"pvc": "ckpt", "path": "/checkpoints", "saveSteps": 2},
            output={"uri": export},
        )
    )
    status = world.wait_phase(teacher, "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", world.pod_logs(name)
    status = world.wait_status(teacher, lambda s: "result" in s and "output" in s, ".status.result and .output", 60)

    # Fetched once: the trainer pods and the server's init container share the run's cache on the claim; whichever
    # took the folder's lock first fetched, the others found the copy whole. The store saw one GET per object.
    trainers = world.run_pods(name)
    (server,) = world.run_pods(name, "student")
    assert len(trainers) == 2, [p["metadata"]["name"] for p in trainers]
    logs = [world.log(pod) for pod in trainers] + [world.log(server, "initializer")]
    assert sum(f"fetched {model}:" in log for log in logs) == 1, "\n---\n".join(logs)
    assert sum(f"fetched {data}:" in log for log in logs[:2]) == 1, "\n---\n".join(logs[:2])
    assert store.pod_gets(bucket) == Counter(uploaded.keys()), store.pod_gets(bucket)
    sources_dir = SOURCES_DIR.format(run=name)
    copy = local_path(model, sources_dir)
    init = server["status"]["initContainerStatuses"][0]
    assert init["name"] == "initializer" and init["state"]["terminated"]["exitCode"] == 0, init
    assert server["spec"]["containers"][0]["args"][0] == copy  # vllm serve <the local copy>
    assert f"serving {model} (model {copy})" in world.log(server), world.log(server)  # and it was a model folder
    assert is_complete(out / "sources" / cache_name(model), verify=True)  # the one copy, on the claim

    # The export: whole, every object its manifest lists (size, sha256) and nothing else, the manifest written last.
    client, prefix = store.client(), f"exports/{name}/"
    listed = {o["Key"]: o["Size"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]}
    manifest = json.loads(client.get_object(Bucket=bucket, Key=prefix + MANIFEST_FILE)["Body"].read())
    assert manifest["source"] == export
    assert set(listed) == {prefix + e["path"] for e in manifest["files"]} | {prefix + MANIFEST_FILE}
    for entry in manifest["files"]:
        body = client.get_object(Bucket=bucket, Key=prefix + entry["path"])["Body"].read()
        assert (len(body), sha(body)) == (entry["size"], entry["sha256"]), entry["path"]
    assert "model.safetensors" in {e["path"] for e in manifest["files"]}
    assert manifest["total_files"] == len(manifest["files"]) and manifest["total_bytes"] == sum(
        e["size"] for e in manifest["files"]
    )
    exported = store.server.data / bucket / "exports" / name
    newest = max(p.stat().st_mtime_ns for p in exported.iterdir() if p.name != MANIFEST_FILE)
    assert (exported / MANIFEST_FILE).stat().st_mtime_ns >= newest
    puts = [a.key for a in read_access_log(store.server.access_log) if a.operation == "s3_PutObject"]
    assert [key for key in puts if key.startswith(prefix)][-1] == prefix + MANIFEST_FILE
    output = status["output"]
    assert output == {"uri": export, "files": manifest["total_files"], "bytes": manifest["total_bytes"]}
    assert status["result"].get("output") in (None, output)

    # The model card names the sources and holds the run's evaluation, as .status.result and eval.json say.
    card = client.get_object(Bucket=bucket, Key=prefix + MODEL_CARD_FILE)["Body"].read().decode().splitlines()
    for line in (f"| model | `{model}` |", f"| dataset | `{data}` |", f"| evaluation dataset | `{data}` |"):
        assert line in card, "\n".join(card)
    # The student row names what the trainer called: the run's student server (run.yaml's student), not its URI.
    assert any(line.startswith("| student | `http://") for line in card), "\n".join(card)
    evaluation = status["result"]["evaluation"]
    report = json.loads((out / names.EVAL_DIR / names.EVAL_REPORT_FILE).read_text())
    assert evaluation == pytest.approx(
        results.parse_result_message(results.result_message(status["result"]["step"], None, report))["evaluation"]
    )
    assert evaluation["problems"] == EVAL_LIMIT and "## Evaluation" in card
    for line in (
        f"| problems | {evaluation['problems']} |",
        f"| student alone | {percent(evaluation['studentAccuracy'])} |",
        f"| guided | {percent(evaluation['guidedAccuracy'])} |",
        f"| non-degradation rate | {percent(evaluation['nonDegradationRate'])} |",
    ):
        assert line in card, (line, "\n".join(card))
    assert any(line.startswith(f"| delta | {points(evaluation['accuracyDelta'])} points") for line in card), card
    assert f"| final step | {TRAINING['maxSteps']} |" in card

    # The conditions the operator shows for it (the status work of the same issue).
    assert has_condition("SourcesReady", "True", "Fetched")(status), status.get("conditions")
    assert has_condition("Exported", "True")(status), status.get("conditions")

    # `atlas eval --teacher s3://…` (the real CLI, here, with this host's address of the store) evaluates the
    # exported teacher as the run evaluated it: the same problems, the same guidance, the same figures. The run's
    # student was its server (the stand-in, whose answers are fixed): the CLI calls a stand-in here.
    assert_atlas_eval_gives_the_runs_table(store, world, name, export, data, out, tmp_path)


def assert_atlas_eval_gives_the_runs_table(
    store: Store, world: World, name: str, export: str, data: str, out: Path, tmp_path: Path
) -> None:
    import yaml

    config = world.core.read_namespaced_config_map(names.ChildNames(name).config_map, NAMESPACE).data
    run = yaml.safe_load(config[names.RUN_CONFIG_FILE])
    seed = int(run["trainer"].get("seed", 42))
    port = free_port()
    standin = subprocess.Popen(
        [PYTHON, str(REPO / "harness/vllm_standin.py"), "serve", "student", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        eventually("the host's vLLM stand-in", lambda: _answers(f"http://127.0.0.1:{port}/health"), timeout=30)
        command = [
            str(Path(PYTHON).parent / "atlas"), "eval", "--teacher", export, "--student", f"http://127.0.0.1:{port}/v1",
            "--dataset", data, "--split", "test", "--limit", str(EVAL_LIMIT), "-k", "1", "--seed", str(seed),
            "--teacher-max-tokens", str(TRAINING["maxCompletionLength"]),
            "--max-guidance-tokens", str(TEACHING["maxGuidanceTokens"]),
            "--max-probe-tokens", str(TEACHING["maxProbeTokens"]),
            "--student-max-tokens", str(TEACHING["studentMaxTokens"]),
            "--output", str(tmp_path / "eval"),
        ]  # fmt: skip  # a command line: each flag beside its value
        env = python_env(**store.host_env(), ATLAS_CACHE_DIR=str(tmp_path / "cache"))
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    finally:
        standin.terminate()
        standin.wait(10)
    assert done.returncode == 0, done.stderr[-3000:]
    mine = json.loads((tmp_path / "eval" / names.EVAL_REPORT_FILE).read_text())
    theirs = json.loads((out / names.EVAL_DIR / names.EVAL_REPORT_FILE).read_text())
    assert mine.pop("teacher") == export
    for key in ("teacher", "student"):
        theirs.pop(key, None)
        mine.pop(key, None)
    assert mine == theirs

    def records(path: Path) -> list[dict]:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return [{k: v for k, v in row.items() if k != "fingerprint"} for row in rows]

    assert records(tmp_path / "eval" / names.EVAL_PROBLEMS_FILE) == records(
        out / names.EVAL_DIR / names.EVAL_PROBLEMS_FILE
    )


def _answers(url: str) -> bool:
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


# ---------------------------------------------------------------------- faults


def test_wrong_credentials_are_access_denied_naming_the_uri_and_never_the_secret(
    sources: Sources, tiny_model_dir: Path
):
    world, store = sources.world, sources.store
    store.bucket_with_sources("denied", tiny_model_dir)
    run = world.apply(fault_run("denied", "denied", storage={"secretRef": {"name": WRONG_SECRET}}))
    started = time.monotonic()
    status = world.wait_status(
        run, has_condition("SourcesReady", "False", "AccessDenied"), "SourcesReady=False AccessDenied", timeout=60
    )
    print(f"denied: SourcesReady=False AccessDenied {time.monotonic() - started:.1f} s after the apply")
    message = condition(status, "SourcesReady")["message"]
    assert f"s3://denied/{MODEL_KEY}" in message, message
    assert status.get("phase") not in ("Succeeded", "Failed")  # a fixed Secret lets it go on
    (pod,) = world.run_pods("denied")
    assert "AccessDenied" in world.log(pod)
    # The wrong secret (and the right one) in nothing the API shows: Events, the run's status, ConfigMaps, pods.
    shown = json.dumps(
        [
            world.api.sanitize_for_serialization(world.core.list_namespaced_event(NAMESPACE)),
            status,
            world.api.sanitize_for_serialization(world.core.list_namespaced_config_map(NAMESPACE)),
            [p.get("status") for p in world.pods("app.kubernetes.io/instance=denied")],
        ]
    )
    for value in (sources.wrong_secret, store.server.secret_key):
        for form in (value, base64.b64encode(value.encode()).decode()):
            assert form not in shown
    delete_run(world, run)


def test_a_missing_object_is_not_found_naming_it(sources: Sources, tiny_model_dir: Path):
    world, store = sources.world, sources.store
    store.bucket_with_sources("missing", tiny_model_dir)
    run = fault_run("missing", "missing")
    run["spec"]["model"] = "s3://missing/models/none"
    world.apply(run)
    status = world.wait_status(
        run, has_condition("SourcesReady", "False", "NotFound"), "SourcesReady=False NotFound", timeout=60
    )
    message = condition(status, "SourcesReady")["message"]
    assert "s3://missing/models/none" in message, message
    assert any(
        e["reason"] == "NotFound" and "s3://missing/models/none" in e["message"] for e in world.events("missing")
    )
    delete_run(world, run)


def test_an_export_to_a_missing_bucket_is_retried_alone_once_the_bucket_exists(sources: Sources, tiny_model_dir: Path):
    world, store = sources.world, sources.store
    name, bucket, later = "late-export", "late-sources", "late-exports"
    store.bucket_with_sources(bucket, tiny_model_dir)
    export = f"s3://{later}/exports/{name}"
    run = s3_teacher(
        name, bucket, checkpoint={"pvc": "ckpt", "path": "/checkpoints", "saveSteps": 2}, output={"uri": export}
    )
    run["spec"]["training"]["maxSteps"] = 1
    run["spec"]["evaluation"]["limit"] = 2
    world.apply(run)
    out = world.nodes.claim_dir(NAMESPACE, "ckpt") / name
    status = world.wait_status(run, has_condition("Exported", "False", "NotFound"), "Exported=False NotFound")
    exported = condition(status, "Exported")
    assert f"the bucket '{later}' does not exist" in exported["message"], exported
    assert status["phase"] != "Succeeded"
    assert (out / "model.safetensors").is_file() and (out / EXPORT_PENDING_FILE).is_file()  # the model kept

    store.server.create_bucket(later)
    status = world.wait_phase(run, "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", world.pod_logs(name)
    status = world.wait_status(run, has_condition("Exported", "True"), "Exported=True", timeout=60)
    assert status["output"]["uri"] == export and status["output"]["files"] >= 7
    assert not (out / EXPORT_PENDING_FILE).exists()
    keys = {o["Key"] for o in store.client().list_objects_v2(Bucket=later)["Contents"]}
    assert f"exports/{name}/{MANIFEST_FILE}" in keys and f"exports/{name}/model.safetensors" in keys
    # The trainer container's log (every run appended): fetched, trained and evaluated once; each restart ran the
    # export alone (python -m atlas_core.cli.export): no fetch, no step, no evaluation.
    (pod,) = world.run_pods(name)
    log = world.log(pod)
    first_failure = log.index(f"error: export to {export} failed (NotFound)")
    before, after = log[:first_failure], log[first_failure:]
    for once in ("sources: ", "'train_runtime'", "evaluation: "):  # the fetch, the training's end, the evaluation
        assert before.count(once) == 1 and once not in after, (once, log[-4000:])
    assert re.search(rf"^exported: {re.escape(export)} \(\d+ files, \d+ bytes\)$", after, re.M), after[-3000:]
    # Every failed export (the trainer's, whose launcher torch elastic reports as 1, and each retry's) ended the
    # container with SOURCES_EXIT_CODE, which Exported=False is read from (status_update.export_failure).
    container = pod["status"]["containerStatuses"][0]
    assert container["restartCount"] >= 1, container
    assert container["lastState"]["terminated"]["exitCode"] == SOURCES_EXIT_CODE, container


def test_an_endpoint_that_does_not_answer_fails_the_run_after_the_bounded_wait(sources: Sources):
    """The run applied first (the ``sources`` fixture): the fetcher asks the closed endpoint again for
    UNREACHABLE_WAIT_S, then fails naming it, and the operator fails the run."""
    world, run = sources.world, sources.unreachable
    status = world.wait_phase(run, "Failed", "Succeeded")
    waited = time.monotonic() - sources.unreachable_applied
    print(f"unreachable: Failed {waited:.1f} s after the apply (the fetcher's wait: {UNREACHABLE_WAIT_S:g} s)")
    assert status["phase"] == "Failed", status
    ready = condition(status, "SourcesReady")
    assert ready and ready["status"] == "False" and ready["reason"] == "Unreachable", status.get("conditions")
    assert sources.unreachable_endpoint in ready["message"], ready
    assert waited >= UNREACHABLE_WAIT_S
    (pod,) = world.run_pods("unreachable")
    assert f"gave up after {UNREACHABLE_WAIT_S:g} s" in world.log(pod)
    delete_run(world, run)


# ---------------------------------------------------------------------- LoRA runs: the adapter out, resumed once

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "targetModules": ["q_proj", "v_proj"]}


def exported_files(store: Store, bucket: str, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix``, by its path below it, once its manifest (written last) is there."""
    client = store.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]]
    assert prefix + MANIFEST_FILE in keys, keys
    return {key.removeprefix(prefix): client.get_object(Bucket=bucket, Key=key)["Body"].read() for key in keys}


def kill_the_worker_once(world: World, manifest: dict, out: Path, steps: int, every: int) -> tuple[str, int]:
    """SIGKILL the two-node run's Worker after its first checkpoint; the restarted gang resumes from the newest
    checkpoint and trains each remaining step once to Succeeded. Returns rank 0's log and the step it resumed from."""
    from tests.kube.test_runs import assert_resumed_without_repeating_steps, wait_checkpoint

    name = manifest["metadata"]["name"]
    wait_checkpoint(world, manifest, out, every)
    master, worker = world.wait_trainer_pods(name, 2)
    assert world.status(manifest)["phase"] == "Running", "the run finished before the Worker could be killed"
    for container in world.worker(worker).main:
        container.kill_all()
    status = world.wait_phase(manifest, "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", world.pod_logs(name)
    log = world.log(master)
    return log, assert_resumed_without_repeating_steps(log, out, steps, every, ranks=2)


def kill_the_worker_and_check_the_resumed_adapter(world: World, manifest: dict, out: Path, steps: int, every: int):
    """SIGKILL the run's Worker after its first checkpoint; the restarted gang resumes from the newest checkpoint,
    holding that checkpoint's adapter exactly once: rank 0 prints the adapter's fingerprint at the first resumed step,
    which this computes from the checkpoint's file on the claim. Returns the checkpoint's adapter tensors."""
    from safetensors.torch import load_file

    from atlas_core.training.lora import adapter_fingerprint

    log, resumed_from = kill_the_worker_once(world, manifest, out, steps, every)
    said = rf"resume: the LoRA adapter of checkpoint-{resumed_from} applied once: (\d+) tensors, sha256 (\w+)"
    line = re.findall(said, log)
    assert line, log[-3000:]
    saved = load_file(out / f"checkpoint-{resumed_from}" / "adapter_model.safetensors")
    assert (int(line[-1][0]), line[-1][1]) == (len(saved), adapter_fingerprint(saved))
    assert not (out / f"checkpoint-{steps}" / "model.safetensors").exists()  # checkpoints hold the adapter alone
    return saved


def test_a_lora_teacher_resumes_once_and_exports_the_merged_model_and_its_adapter(
    sources: Sources, tiny_model_dir: Path
):
    """A LoRA AtlasTeacher (spec.training.lora) on two nodes, its Worker killed after a checkpoint, resumes the adapter
    once, trains to Succeeded and, with output.merge, exports the adapter merged into its base (whole weights: what
    any from_pretrained and vLLM load) and, in adapter/, the adapter as PEFT wrote it, naming the run's model."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load as load_tensors
    from transformers import AutoModelForCausalLM

    world, store = sources.world, sources.store
    bucket, name = "lora", "lora-teacher"
    store.bucket_with_sources(bucket, tiny_model_dir)
    export = f"s3://{bucket}/exports/{name}"
    out = world.nodes.claim_dir(NAMESPACE, "ckpt") / name
    steps, every = 6, 2
    teacher = s3_teacher(
        name,
        bucket,
        nodes=2,
        checkpoint={"pvc": "ckpt", "path": "/checkpoints", "saveSteps": every},
        output={"uri": export, "merge": True},
    )
    teacher["spec"]["training"].update(lora=LORA, maxSteps=steps)
    world.apply(teacher)
    kill_the_worker_and_check_the_resumed_adapter(world, teacher, out, steps, every)
    world.wait_status(teacher, has_condition("Exported", "True"), "Exported=True", 60)

    files = exported_files(store, bucket, f"exports/{name}/")
    assert not (out / "model.safetensors").exists() and (out / "adapter_model.safetensors").is_file()  # the run's
    assert files["adapter/adapter_model.safetensors"] == (out / "adapter_model.safetensors").read_bytes()
    adapter_config = json.loads(files["adapter/adapter_config.json"])
    assert adapter_config["base_model_name_or_path"] == f"s3://{bucket}/{MODEL_KEY}"  # the run's, not the pod's copy
    assert adapter_config["r"] == LORA["r"] and sorted(adapter_config["target_modules"]) == LORA["targetModules"]
    assert "adapter_config.json" not in files  # the top is the merged model, which loads as a whole model
    merged = load_tensors(files["model.safetensors"])
    expected = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), out).merge_and_unload()
    expected_state = expected.state_dict()
    assert set(merged) <= set(expected_state)
    # PEFT's merge of the run's adapter, tensor by tensor. (Two teaching steps against the stand-in student, whose
    # answers never change, may leave lora_B at its zero start: merging non-zero adapters exactly is
    # tests/training/test_export.py's.)
    assert all(torch.allclose(merged[k], expected_state[k], atol=1e-6) for k in merged)


def test_a_lora_trainings_killed_worker_resumes_the_adapter_once_and_exports_it(sources: Sources):
    """A LoRA AtlasTraining on two nodes (PyTorchJob): its Worker SIGKILLed after a checkpoint, the adapter resumed
    once (kill_the_worker_and_check_the_resumed_adapter), and the adapter alone exported (no merge)."""
    from safetensors.torch import load as load_tensors

    from harness.manifests import tiny_training

    world, store = sources.world, sources.store
    bucket, name, steps, every = "lora-training", "lora-training", 12, 4
    store.server.create_bucket(bucket)
    export = f"s3://{bucket}/exports/{name}"
    out = world.nodes.claim_dir(NAMESPACE, "ckpt") / name
    training = tiny_training(
        name,
        resources={"nodes": 2, "gpusPerNode": 0, "cpu": "1", "memory": "1Gi"},
        checkpoint={"pvc": "ckpt", "path": "/checkpoints", "saveSteps": every},
        storage={"secretRef": {"name": SECRET}},
        output={"uri": export},
    )
    training["spec"]["training"].update(maxSteps=steps, lora=LORA, lrSchedulerType="constant")
    world.apply(training)
    saved = kill_the_worker_and_check_the_resumed_adapter(world, training, out, steps, every)

    # The export: the adapter alone, as the run saved it, naming the run's model as its base.
    world.wait_status(training, has_condition("Exported", "True"), "Exported=True", 60)
    files = exported_files(store, bucket, f"exports/{name}/")
    assert "model.safetensors" not in files
    assert files["adapter_model.safetensors"] == (out / "adapter_model.safetensors").read_bytes()
    assert load_tensors(files["adapter_model.safetensors"]).keys() == saved.keys()
    assert json.loads(files["adapter_config.json"])["base_model_name_or_path"] == "builtin://tiny-llama"


# ---------------------------------------------------------------------- experiment tracking


@pytest.fixture(scope="module")
def tracking_server(kube: Kube, nodes: ProcessNodes, tmp_path_factory) -> Iterator[MLflowServer]:
    """A real MLflow server on 127.0.0.1 and the nodes' gateway, where the pods reach it."""
    directory = tmp_path_factory.mktemp("mlflow-pods")
    server = MLflowServer(directory, kube.cluster.supervisor, hosts=("127.0.0.1", nodes.network.gateway)).start()
    try:
        yield server
    finally:
        server.stop()


def test_a_tracked_teacher_killed_once_resumes_into_one_mlflow_run_holding_each_step_once(
    sources: Sources, tracking_server: MLflowServer, tiny_model_dir: Path
):
    """A teacher on two nodes with spec.tracking.mlflow, its Worker SIGKILLed after a checkpoint: the restarted gang
    continues the same MLflow run (found by the run's uid), which ends with every step once and in order, the spec
    as params (no secret), the evaluation table, the artifacts; .status.tracking names it, condition Tracking is
    True, and .status.progress holds the final step, reward and KL."""
    import mlflow

    from atlas_contract import tracking

    world, store = sources.world, sources.store
    bucket, name, steps, every = "tracked", "tracked-teacher", 6, 2
    store.bucket_with_sources(bucket, tiny_model_dir)
    out = world.nodes.claim_dir(NAMESPACE, "ckpt") / name
    experiment = "kube-tracking"
    uri = tracking_server.endpoint_for(world.nodes.network.gateway)
    teacher = s3_teacher(
        name,
        bucket,
        nodes=2,
        checkpoint={"pvc": "ckpt", "path": "/checkpoints", "saveSteps": every},
        tracking={"mlflow": {"uri": uri, "experiment": experiment}},
    )
    teacher["spec"]["training"].update(maxSteps=steps, lrSchedulerType="constant")
    world.apply(teacher)
    kill_the_worker_once(world, teacher, out, steps, every)
    status = world.wait_status(teacher, lambda s: s.get("tracking"), ".status.tracking", 30)

    client = mlflow.MlflowClient(tracking_server.endpoint)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    run_id = run.info.run_id
    assert status["tracking"]["runId"] == run_id and run_id in status["tracking"]["url"]
    tracked = condition(status, "Tracking")
    assert tracked["status"] == "True" and run_id in tracked["message"], tracked
    history = sorted(client.get_metric_history(run_id, tracking.STEP_METRIC), key=lambda m: m.timestamp)
    assert [m.step for m in history] == list(range(1, steps + 1))  # the killed attempt's steps and the resumed ones
    assert run.info.status == "FINISHED" and run.data.tags[tracking.TAG_NAME] == name
    assert run.data.tags[tracking.TAG_UID] == world.kube.get("-n", NAMESPACE, "atlasteacher", name)["metadata"]["uid"]
    assert run.data.params["spec.model"] == f"s3://{bucket}/{MODEL_KEY}" and run.data.params["atlas.backend"]
    assert run.data.metrics["atlas_eval_problems"] == EVAL_LIMIT == status["result"]["evaluation"]["problems"]
    assert {"metrics.jsonl", "curves.png", "README.md", "eval.json"} <= {a.path for a in client.list_artifacts(run_id)}
    stored = {**run.data.params, **run.data.tags}
    assert not [key for key, value in stored.items() if store.server.secret_key in value]
    assert status["progress"]["step"] == steps and {"reward", "kl"} <= set(status["progress"])
    assert status["progress"]["kl"] == status["result"]["kl"]


def test_a_tracking_server_that_does_not_answer_is_said_and_the_run_still_succeeds(
    sources: Sources, tiny_model_dir: Path
):
    """spec.tracking.mlflow.uri where nothing answers: condition Tracking=False and one Warning Event name the URI
    (from the tick that sees the trainer say so, or from its end when it ended between two ticks); the run trains to
    Succeeded all the same, and says it ended with no MLflow run."""
    world = sources.world
    bucket, name = "untracked", "untracked"
    sources.store.bucket_with_sources(bucket, tiny_model_dir)
    uri = f"http://{world.nodes.network.gateway}:{free_port()}"  # nothing listens there
    run = world.apply(fault_run(name, bucket, tracking={"mlflow": {"uri": uri}}))
    said = world.wait_status(run, has_condition("Tracking", "False", "TrackingUnreachable"), "Tracking=False", 240)
    assert uri in condition(said, "Tracking")["message"]
    status = world.wait_phase(run, "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", world.pod_logs(name)
    warnings = [e for e in world.events(name) if e["reason"] == "TrackingUnreachable"]
    assert len(warnings) == 1 and uri in warnings[0]["message"]
    final = world.wait_status(
        run,
        lambda s: "no MLflow run" in (condition(s, "Tracking") or {}).get("message", ""),
        "Tracking says the run ended with no MLflow run",
        30,
    )
    assert condition(final, "Tracking")["status"] == "False" and "tracking" not in final
