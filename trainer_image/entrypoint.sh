#!/usr/bin/env bash
# Entrypoint of the Atlas trainer image. The first argument picks a role:
#
#   train   ARGS…   exec accelerate launch ARGS…   (e.g. --config_file accelerate/deepspeed_zero3.yaml
#                                                    -m atlas_core.cli.train recipe@_global_=teacher_rcl)
#   rollout ARGS…   exec vllm serve ARGS… + TRL's  (policy rollout server: :8000, weight sync :51216; what
#                   weight-transfer flags, dev mode  `trl vllm-serve`, deprecated, runs: ARGS start with the model)
#   serve   ARGS…   exec vllm serve ARGS…          (frozen student, OpenAI API on :8000)
#   anything else   exec it as given               (atlas demo, python -m …, bash)
#
# Pods created by the operator set `command` themselves and bypass this script; it serves
# `docker run IMAGE <role> …` and pods written by hand.
set -euo pipefail

usage() {
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
}

if [[ $# -eq 0 ]]; then
    usage
    exit 64
fi

role="$1"
case "$role" in
    train)
        shift
        exec accelerate launch "$@"
        ;;
    rollout)
        shift
        # TRL 1.16's trl/scripts/vllm_serve.py: the weight-transfer endpoints live behind vLLM's dev mode.
        export VLLM_SERVER_DEV_MODE=1
        exec vllm serve "$@" --weight-transfer-config '{"backend": "nccl"}' \
            --logprobs-mode processed_logprobs --max-logprobs -1
        ;;
    serve)
        shift
        exec vllm serve "$@"
        ;;
    -h | --help | help)
        usage
        exit 0
        ;;
    *)
        exec "$@"
        ;;
esac
