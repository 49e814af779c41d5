"""The ``atlas`` command: ``atlas demo``, ``atlas train``, ``atlas eval``, ``atlas render``, ``atlas operator``,
``atlas cluster``.

The thin CLI over both halves: the only module that imports both ``atlas_core`` (training) and
``atlas_operator`` (manifests), each lazily and only for its own subcommands, so ``atlas render`` and
``atlas operator`` need no training library (the operator image installs none).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from atlas_contract.names import TRAINER_METRICS_PORT


def _train(args: argparse.Namespace) -> int:
    from atlas_core.cli.train import main as train_main

    target = args.target
    if target.endswith((".yaml", ".yml")) and Path(target).is_file():
        import yaml

        from atlas_contract.errors import InvalidFields
        from atlas_contract.text import read_text

        try:
            document = next(iter(yaml.safe_load_all(read_text(target))), None)
        except InvalidFields as invalid:
            print("\n".join(f"error: {problem}" for problem in invalid.problems), file=sys.stderr)
            return 2
        except yaml.YAMLError as exc:
            print(f"error: {target}: not valid YAML ({' '.join(str(exc).split())})", file=sys.stderr)
            return 2
        if isinstance(document, dict) and "apiVersion" in document:
            return _train_manifest(target, args.overrides)
    return train_main([f"recipe={target}", *args.overrides])


def _train_manifest(path: str, overrides: list[str]) -> int:
    """An AtlasTraining/AtlasTeacher manifest, trained here in one process through the pods' entrypoint."""
    import tempfile

    import yaml
    from atlas_operator.cli import manifest_run_config

    from atlas_contract.errors import InvalidFields
    from atlas_core.cli.train import main as train_main

    try:
        name, config, notes, tracking_env = manifest_run_config(path)
    except InvalidFields as invalid:
        for problem in invalid.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    for key, value in tracking_env.items():  # the user's own environment wins (MLFLOW_TRACKING_URI=… atlas train …)
        os.environ.setdefault(key, value)
    with tempfile.TemporaryDirectory(prefix="atlas-run-") as staging:
        recipe = Path(staging) / f"{name}.yaml"
        recipe.write_text(yaml.safe_dump(config, sort_keys=False))
        return train_main([f"recipe={recipe}", *overrides])


def _demo(args: argparse.Namespace) -> int:
    from atlas_core.cli.demo import run_demo
    from atlas_core.cli.demo_options import size_of

    return run_demo(output=Path(args.output), size=size_of(args), metrics_port=args.metrics_port, seed=args.seed)


def _eval(args: argparse.Namespace) -> int:
    from atlas_core.cli.eval import run_args

    return run_args(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atlas", description="Atlas on Kubernetes: train LLM teachers with GRPO.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="offline tiny model: SFT warm-up, GRPO, teacher GRPO on CPU, in minutes")
    from atlas_core.cli.demo_options import add_arguments as add_demo_arguments

    add_demo_arguments(demo)
    demo.add_argument("--output", default="atlas-demo", help="output folder (default ./atlas-demo)")
    demo.add_argument(
        "--metrics-port",
        type=int,
        default=TRAINER_METRICS_PORT,
        help=f"Prometheus port on 127.0.0.1 while it runs; 0 = off (default {TRAINER_METRICS_PORT})",
    )
    demo.set_defaults(func=_demo)

    train = commands.add_parser("train", help="run a recipe or a run configuration file locally")
    train.add_argument(
        "target",
        help="a bundled recipe (see atlas_core/configs/recipe: tiny_sft, tiny_grpo, tiny_teacher, grpo, "
        "teacher_rcl), a run configuration YAML, or an AtlasTraining/AtlasTeacher manifest",
    )
    train.add_argument("overrides", nargs="*", help="key=value overrides (Hydra syntax)")
    train.set_defaults(func=_train)

    from atlas_core.cli.eval import add_arguments as add_eval_arguments

    evaluate = commands.add_parser(
        "eval",
        help="the two-pass evaluation of a teacher: its student alone vs with its guidance, on held-out problems",
        usage="atlas eval --teacher MODEL --student MODEL --dataset SOURCE [options]",
    )
    add_eval_arguments(evaluate)
    evaluate.set_defaults(func=_eval)

    render = commands.add_parser("render", add_help=False, help="print the objects the operator creates for a run")
    render.add_argument("args", nargs=argparse.REMAINDER)
    render.set_defaults(func=lambda a: _delegate("render_main", a.args))
    operator = commands.add_parser("operator", add_help=False, help="run the operator (kopf run options accepted)")
    operator.add_argument("args", nargs=argparse.REMAINDER)
    operator.set_defaults(func=lambda a: _delegate("operator_main", a.args))
    cluster = commands.add_parser("cluster", add_help=False, help="a local Kubernetes without Docker: up, down")
    cluster.add_argument("args", nargs=argparse.REMAINDER)
    cluster.set_defaults(func=lambda a: _cluster(a.args))
    return parser


def _cluster(argv: list[str]) -> int:
    from atlas_cluster.cli import main as cluster_main

    return cluster_main(argv)


DELEGATED = {"render": "render_main", "operator": "operator_main"}


def _delegate(function: str, argv: list[str]) -> int:
    import atlas_operator.cli

    return getattr(atlas_operator.cli, function)(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:  # their own parsers (and kopf's options) take every argument
        return _delegate(DELEGATED[argv[0]], argv[1:])
    if argv and argv[0] == "cluster":  # imports neither half of the project
        return _cluster(argv[1:])
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
