"""``atlas render``, ``atlas operator`` and the manifest side of ``atlas train`` (the run configuration a
manifest becomes; training it is the thin ``atlas`` CLI's job, so this package never imports atlas_core)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

import yaml

from atlas_contract.errors import InvalidFields
from atlas_contract.names import BACKENDS, TRAINJOB_RUNTIME
from atlas_contract.text import decode_text, read_text
from atlas_operator.spec import AtlasTeacherSpec, Run
from atlas_operator.validation import parse_run

if TYPE_CHECKING:
    from atlas_operator.config import OperatorConfig


def load_manifests(path: str) -> list[dict[str, Any]]:
    """The documents of a YAML file; raises InvalidFields with a readable problem."""
    text = decode_text(sys.stdin.buffer.read(), "stdin") if path == "-" else read_text(path)
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise InvalidFields([f"{path}: not valid YAML ({' '.join(str(exc).split())})"]) from exc
    if not documents:
        raise InvalidFields([f"{path}: no YAML document"])
    return documents


def parse_file(path: str, namespace: str | None = None, default_backend: str | None = None) -> list[Run]:
    """Every run in the file; InvalidFields lists every problem of every document."""
    runs, problems = [], []
    documents = load_manifests(path)
    for index, document in enumerate(documents):
        try:
            runs.append(parse_run(document, namespace, default_backend))
        except InvalidFields as invalid:
            prefix = f"document {index + 1}: " if len(documents) > 1 else ""
            problems += [prefix + p for p in invalid.problems]
    if problems:
        raise InvalidFields(problems)
    return runs


def render_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="atlas render", description="Print the objects the operator would create for a run."
    )
    parser.add_argument("file", help="AtlasTraining / AtlasTeacher manifest (- for stdin)")
    parser.add_argument("-n", "--namespace", help="namespace (default: the manifest's, else default)")
    parser.add_argument("--trainer-image", help="default trainer image ($ATLAS_TRAINER_IMAGE, else the operator's)")
    parser.add_argument("--rollout-image", help="default vLLM image ($ATLAS_ROLLOUT_IMAGE, else the trainer image)")
    parser.add_argument(
        "--default-backend",
        choices=BACKENDS,
        help=f"backend of a run without spec.backend ($ATLAS_DEFAULT_BACKEND, else {BACKENDS[0]})",
    )
    parser.add_argument(
        "--trainjob-runtime",
        help=f"ClusterTrainingRuntime a TrainJob names ($ATLAS_TRAINJOB_RUNTIME, else {TRAINJOB_RUNTIME})",
    )
    args = parser.parse_args(argv)
    from atlas_operator.config import OperatorConfig
    from atlas_operator.manifests import render_children
    from atlas_operator.reconcile import reward_yaml

    settings = OperatorConfig.from_env(
        trainer_image=args.trainer_image,
        rollout_image=args.rollout_image,
        default_backend=args.default_backend,
        trainjob_runtime=args.trainjob_runtime,
    )
    images = settings.images
    try:
        runs = parse_file(args.file, args.namespace, settings.default_backend)
        documents = [
            child for run in runs for child in render_children(run, images, reward_yaml(run), settings.network)
        ]
    except InvalidFields as invalid:
        for problem in invalid.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    from atlas_operator.backends import checkpoint_warning
    from atlas_operator.render import best_effort_warning

    for run in runs:
        for warning in (checkpoint_warning(run), best_effort_warning(run)):
            if warning:
                print(f"warning: {run.name}: {warning}", file=sys.stderr)
    print(dump_documents(documents), end="")
    return 0


class _PlainDumper(yaml.SafeDumper):
    """Plain manifests: multi-line strings (the ConfigMap's files) as readable ``|`` blocks, and no YAML
    anchors or aliases (``&id001``/``*id001``) where two objects share a value: kubectl and every
    other tool read each document on its own."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value and not any(line != line.rstrip() for line in value.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_PlainDumper.add_representer(str, _str)


def dump_documents(documents: list[dict[str, Any]]) -> str:
    return yaml.dump_all(documents, Dumper=_PlainDumper, sort_keys=False, width=120)


# --------------------------------------------------------------------------- atlas train FILE.yaml


def local_run_config(run: Run) -> tuple[dict[str, Any], list[str]]:
    """The run configuration for one local process, and what differs from the cluster's (told to the user)."""
    from atlas_operator.backends import for_run
    from atlas_operator.render import run_config

    config = run_config(run, server_hostnames=for_run(run).servers_in_job)
    notes = []
    trainer = config["trainer"]
    config["output_dir"] = f"outputs/{run.name}"
    notes.append(f"output in {config['output_dir']} (the cluster uses {run.spec.checkpoint.path}/{run.name})")
    trainer["metrics_host"] = "127.0.0.1"
    if trainer.pop("use_vllm", False):  # vLLM needs a GPU: neither a server nor colocated vLLM here
        for key in [k for k in trainer if k.startswith("vllm_")]:
            trainer.pop(key)
        notes.append("generating inside the trainer (spec.rollout applies on the cluster)")
    student = run.spec.student if isinstance(run.spec, AtlasTeacherSpec) else None
    if run.kind == "AtlasTeacher" and student and student.rollout.replicas:
        config["student"] = student.model
        notes.append(f"student {student.model} loaded in this process (spec.student.rollout applies on the cluster)")
    if run.spec.reward.config:
        config["reward"]["config"] = run.spec.reward.config
    if run.spec.reward.config_map_ref:
        raise InvalidFields(["spec.reward.configMapRef: a ConfigMap cannot be read locally; use spec.reward.config"])
    nodes = run.spec.resources.nodes * run.spec.resources.processes()
    if nodes > 1:
        notes.append(
            f"one process (the cluster runs {nodes}: {run.spec.resources.nodes} nodes x "
            f"{run.spec.resources.processes()})"
        )
    return config, notes


def manifest_run_config(path: str) -> tuple[str, dict[str, Any], list[str], dict[str, str]]:
    """``atlas train run.yaml``: (run name, the run configuration to train here in one process, notes on
    what differs from the cluster, the tracking environment spec.tracking gives the trainer). Raises InvalidFields
    with every problem."""
    runs = parse_file(path)
    if len(runs) != 1:
        raise InvalidFields([f"{path}: expected one run, found {len(runs)}"])
    config, notes = local_run_config(runs[0])
    return runs[0].name, config, notes, local_tracking_env(runs[0], config["output_dir"])


def local_tracking_env(run: Run, output_dir: str) -> dict[str, str]:
    """spec.tracking's environment with literal values (MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME, WANDB_PROJECT,
    …) for a local run; what the pods read from a Secret (WANDB_API_KEY) comes from the user's own environment."""
    from atlas_operator.render.tracking import tracking_env

    return {entry["name"]: entry["value"] for entry in tracking_env(run, output_dir) if "value" in entry}


# --------------------------------------------------------------------------- atlas operator


def operator_main(argv: list[str] | None = None) -> int:
    """``atlas operator [options] [kopf run options]``: our options become ATLAS_* settings, the rest
    goes to ``kopf run`` (e.g. --verbose, --liveness, --peering)."""
    from atlas_operator import config

    settings, command = operator_command(argv)
    config.configure(settings)  # what the handlers module reads when kopf imports it
    if settings.leader_election_lease:
        _lead(settings)
    from kopf.cli import main as kopf_main

    code: int = kopf_main(args=command, prog_name="atlas operator")
    return code


def _lead(settings: OperatorConfig) -> None:
    """Stand by until this replica leads (atlas_operator/leader.py); then renew in the background, exit when
    leadership is lost, and give the Lease up when the process ends."""
    import atexit
    import logging

    from atlas_operator import leader
    from atlas_operator.config import ENV
    from atlas_operator.kube import Kube

    if not settings.operator_namespace:
        raise SystemExit(
            f"error: {ENV['leader_election_lease']} needs {ENV['operator_namespace']} (the Lease's namespace)"
        )

    # kopf configures logging only once it starts: until then the election logs through a handler of its own.
    standby_log = logging.StreamHandler()
    standby_log.setFormatter(logging.Formatter("[%(asctime)s] %(name)s [%(levelname)s] %(message)s"))
    level = leader.log.level
    leader.log.addHandler(standby_log)
    leader.log.setLevel(logging.INFO)
    elector = leader.Elector(Kube(), settings.operator_namespace, settings.leader_election_lease)
    try:
        elector.acquire(settings.metrics_port, settings.metrics_host)
    finally:
        leader.log.removeHandler(standby_log)
        leader.log.setLevel(level)
    elector.hold(on_lost=lambda: os._exit(1))  # as controller-runtime's manager: a lost leader stops at once
    atexit.register(elector.release)


#: The operator settings ``atlas operator`` takes as flags: (setting, flag, meaning, extra argparse options).
#: Each flag's help names its environment variable and the default that applies (both from ``config``).
SETTING_FLAGS: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
    ("trainer_image", "--trainer-image", "default trainer image", {}),
    ("rollout_image", "--rollout-image", "default vLLM image", {}),
    ("progress_interval", "--progress-interval", "seconds between status refreshes", {"type": float}),
    ("metrics_port", "--metrics-port", "port of /metrics and /healthz; 0 = off", {"type": int}),
    ("metrics_url_template", "--metrics-url-template", "trainer metrics URL", {}),
    ("default_backend", "--default-backend", "backend of a run without spec.backend", {"choices": BACKENDS}),
    ("trainjob_runtime", "--trainjob-runtime", "ClusterTrainingRuntime of TrainJob runs (the chart's)", {}),
    (
        "network_policy",
        "--network-policy",
        "a NetworkPolicy per run (needs a CNI that enforces it)",
        {"action": argparse.BooleanOptionalAction},
    ),
    ("monitoring_namespace", "--monitoring-namespace", "namespace whose pods may scrape trainer metrics", {}),
)


def _shown_default(defaults: Any, setting: str) -> Any:
    """A setting's default as ``--help`` shows it (``defaults``: an ``OperatorConfig()``)."""
    if setting in ("trainer_image", "rollout_image"):
        return getattr(defaults.images, setting.removesuffix("_image"))
    if setting == "trainjob_runtime":
        return defaults.images.trainjob_runtime
    value = getattr(defaults, setting)
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else value


def operator_parser() -> argparse.ArgumentParser:
    from atlas_operator.config import ENV, OperatorConfig

    defaults = OperatorConfig()
    parser = argparse.ArgumentParser(prog="atlas operator", description="Run the Atlas operator (kopf).")
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=None,
        help=f"namespace to watch (repeatable; default ${ENV['watch_namespaces']}, else all)",
    )
    parser.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    for setting, flag, meaning, options in SETTING_FLAGS:
        shown = f"${ENV[setting]}, default {_shown_default(defaults, setting)}"
        parser.add_argument(flag, dest=setting, default=None, help=f"{meaning} ({shown})", **options)
    parser.add_argument(
        "--log-format", choices=("json", "plain", "full"), default=os.environ.get("ATLAS_LOG_FORMAT", "plain")
    )
    return parser


def operator_command(argv: list[str] | None = None) -> tuple[OperatorConfig, list[str]]:
    """The operator's settings (``OperatorConfig``: flags over ATLAS_* variables) and the ``kopf run`` command line
    for ``argv``: the namespaces kopf watches runs in are the ones the operator watches children in."""
    args, kopf_args = operator_parser().parse_known_args(argv)
    from atlas_operator import config

    settings = config.OperatorConfig.from_env(
        # -A wins over $ATLAS_WATCH_NAMESPACES: the runs and their children are then watched in every namespace.
        watch_namespaces=() if args.all_namespaces else args.namespace,
        **{setting: getattr(args, setting) for setting, *_ in SETTING_FLAGS},
    )
    namespaces = settings.watch_namespaces
    scope = ["--all-namespaces"] if not namespaces else [part for n in namespaces for part in ("--namespace", n)]
    command = ["run", "--standalone", f"--log-format={args.log_format}", *scope, *kopf_args]
    return settings, [*command, "-m", "atlas_operator.handlers"]
