"""``python -m atlas_core.cli.train recipe=<name> [key=value ...]`` — what trainer pods run.

Overrides use Hydra's syntax: ``model=…``, ``dataset.source=…``, ``trainer.<GRPOConfig field>=…``,
``recipe@_global_=<name>`` (or ``recipe=<name>``). Invalid input exits with status 2 and one
``error:`` line per problem on stderr.
"""

from __future__ import annotations

import os
import sys

USAGE = """usage: python -m atlas_core.cli.train [recipe=<name>] [key=value ...]

  recipe=<name>          one of: {recipes}
  model=<id|path>        policy to train (builtin://tiny-llama: the offline tiny model)
  dataset.source=<src>   builtin://arithmetic, a file, a save_to_disk folder, hf://org/name
  output_dir=<dir>       checkpoints, final model, metrics.jsonl (resumes from its newest checkpoint)
  trainer.<field>=<v>    any GRPOConfig / SFTConfig field
  --print-config         print the composed configuration and exit
"""


def report_problems(problems: list[str]) -> None:
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    from atlas_core.training.load_config import (
        InvalidFields,
        available_recipes,
        load_run_config,
        parse_run_config,
        validate_run_config,
    )

    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(USAGE.format(recipes=", ".join(available_recipes())))
        return 0
    print_only = "--print-config" in argv
    argv = [a for a in argv if a != "--print-config"]
    try:
        cfg = load_run_config(argv)
        if print_only:  # shown even when it would not run here (e.g. a GPU recipe on a laptop)
            from omegaconf import OmegaConf

            print(OmegaConf.to_yaml(cfg), end="")
            return 0
        problems = validate_run_config(cfg)
        if problems:
            raise InvalidFields(problems)
        run = parse_run_config(cfg)  # the typed settings past this point (atlas_contract/run_config.py)
        from atlas_core.training.runner import run_training

        result = run_training(run)
    except InvalidFields as exc:
        report_problems(exc.problems)
        return 2
    _leave_process_group()  # the evaluation runs on rank 0 alone: no rank waits on it in a collective
    if result.stopped is not None:  # SIGTERM: every rank saved the step in flight (atlas_core.training.preemption)
        from atlas_contract.names import STOP_EXIT_CODE
        from atlas_core.training.preemption import write_stop_report

        write_stop_report(result.stopped, result.local_process_index)
        return STOP_EXIT_CODE
    if result.process_index == 0:
        code = finish_run(run, result)
        if code:
            return code
    resumed = f", resumed from {result.resumed_from}" if result.resumed_from else ""
    if result.already_finished:
        resumed = f"; already finished ({result.resumed_from} is its last step): nothing trained"
    print(
        f"done: rank {result.process_index}/{result.num_processes} at global step {result.global_step}{resumed}; "
        f"model in {result.output_dir}",
        file=sys.stderr,
    )
    return 0


def finish_run(run, result) -> int:
    """Rank 0 after training: the evaluation the run asks for, the export of the trained model (``run.output``),
    then its result for ``.status.result``. Non-zero (SOURCES_EXIT_CODE) when the export failed: the model stays in
    ``output_dir`` and the job restarts the pod, whose re-run trains nothing (``already_finished``), reports the
    evaluation from its files and retries the export alone."""
    from atlas_contract.sources import SOURCES_EXIT_CODE
    from atlas_core.training.finish import (
        evaluate_after_training,
        export_trained_model,
        finish_tracking,
        last_kl,
        last_reward,
        note_pending_export,
        write_result,
    )

    evaluation = error = None
    if run.evaluation is not None:
        try:
            evaluation = evaluate_after_training(run, result.args)
        except Exception as exc:  # noqa: BLE001 - the model is trained and saved: an evaluation never fails the run
            error = " ".join(str(exc).split()) or type(exc).__name__
            print(f"warning: evaluation failed (the trained model is kept): {error}", file=sys.stderr)
    if evaluation is not None:
        print(
            f"evaluation: {evaluation['problems']} problems, student alone {evaluation['student_accuracy']:.3f}, "
            f"guided {evaluation['guided_accuracy']:.3f}, delta {100 * evaluation['accuracy_delta']:+.1f} points "
            f"[{100 * evaluation['accuracy_delta_low']:+.1f}, {100 * evaluation['accuracy_delta_high']:+.1f}], "
            f"non-degradation {evaluation['non_degradation_rate']:.3f}",
            file=sys.stderr,
        )
    reward = last_reward(result.log_history)
    output = export_error = None
    if run.output is not None:
        output, export_error = export_trained_model(
            run, result.global_step, reward, last_kl(result.log_history), evaluation
        )
        if output is not None:
            print(f"exported: {output['uri']} ({output['files']} files, {output['bytes']} bytes)", file=sys.stderr)
        else:
            assert export_error is not None  # export_trained_model gives the output or why there is none
            print(
                f"error: export to {run.output.uri} failed ({export_error['reason']}): {export_error['message']}; "
                f"the model stays in {run.output_dir}, and a re-run retries the export alone",
                file=sys.stderr,
            )
    if run.output is not None:
        pending = {"step": result.global_step, "reward": reward, "kl": last_kl(result.log_history)}
        note_pending_export(run, {**pending, "evaluation": evaluation, "evaluation_error": error}, bool(export_error))
    kl = last_kl(result.log_history)
    tracked = finish_tracking(run, result, reward, kl, evaluation, output)
    write_result(result.global_step, reward, evaluation, error, output, export_error, kl=kl, tracking=tracked)
    return SOURCES_EXIT_CODE if export_error else 0


_LEFT_GROUP = False


def _leave_process_group() -> bool:
    """Tear the process group down after training; True when one existed.

    Without it, gloo worlds on CPU sometimes abort at interpreter exit ("terminate called
    without an active exception") after a complete run, and the peer then waits on the store.
    """
    import torch.distributed as dist

    global _LEFT_GROUP
    if not (dist.is_available() and dist.is_initialized()):
        return _LEFT_GROUP
    dist.barrier()
    dist.destroy_process_group()
    _LEFT_GROUP = True
    return True


if __name__ == "__main__":
    code = main()
    if _leave_process_group():
        # DeepSpeed's CPU ops can still abort in their destructors: skip them once the work is saved.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
