"""``python -m atlas_core.cli.export --config run.yaml``: retry a run's failed export, alone.

When training succeeded and its export did not (the store down, a bucket missing), the trainer leaves the model in
its output folder with ``EXPORT_PENDING_FILE`` beside it (what the export needs: step, reward, KL, the evaluation)
and exits with SOURCES_EXIT_CODE, so that its job restarts the pod. The restarted pod's launch script finds the file
and runs this instead of the trainer on the first node: no model is trained, evaluated or even loaded again (unless
``output.merge`` merges an adapter), and no rank waits for a rendezvous. Exit 0 once exported (the file removed, the
result with ``output`` written to ``$ATLAS_RESULT_FILE``), SOURCES_EXIT_CODE when it failed again.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml


def main(argv: list[str] | None = None) -> int:
    from atlas_contract.errors import InvalidFields
    from atlas_contract.run_config import RunConfig
    from atlas_contract.sources import EXPORT_PENDING_FILE, SOURCES_EXIT_CODE
    from atlas_core.training.finish import export_trained_model, note_pending_export, write_result

    parser = argparse.ArgumentParser(prog="python -m atlas_core.cli.export", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the run configuration (the pods' /etc/atlas/run.yaml)")
    args = parser.parse_args(argv)
    try:
        run = RunConfig.from_dict(yaml.safe_load(Path(args.config).read_text(encoding="utf-8")))
    except InvalidFields as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    pending_file = Path(run.output_dir) / EXPORT_PENDING_FILE
    if run.output is None or not pending_file.is_file():
        print(f"export: nothing pending in {run.output_dir}", file=sys.stderr)
        return 0
    pending = json.loads(pending_file.read_text(encoding="utf-8"))
    step, reward, kl, evaluation = pending["step"], pending.get("reward"), pending.get("kl"), pending.get("evaluation")
    output, error = export_trained_model(run, step, reward, kl, evaluation)
    if output is not None:
        note_pending_export(run, pending, False)
        print(f"exported: {output['uri']} ({output['files']} files, {output['bytes']} bytes)", file=sys.stderr)
    else:
        assert error is not None  # export_trained_model gives the output or why there is none
        print(
            f"error: export to {run.output.uri} failed again ({error['reason']}): {error['message']}", file=sys.stderr
        )
    write_result(step, reward, evaluation, pending.get("evaluation_error"), output=output, export_error=error)
    return 0 if output is not None else SOURCES_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
