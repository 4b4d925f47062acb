#!/usr/bin/env bash
# The accelerator check of docs/accelerators.md as one command: the real voxcpm2 shape, bf16, B=4,
# L=830, FSDP2 world of 1 -> eager vs compile, step time, MFU (voxpipe's and the port's
# conventions), peak memory, micro-batch 1..8 full vs LoRA and the largest that fits. One JSON on
# stdout (progress on stderr); under a time limit (LIMIT_S, default 540 s) the parts measured so
# far are in $OUT/accel_step.json (or ./accel_step.json) even when the limit stops the run.
# Then `voxpipe plan` against the measured peak (benchmarks/plan_check.py: the plan vs
# torch.cuda.max_memory_allocated of the same step, LoRA and full, at B=1, L=830) under its own
# limit (PLAN_LIMIT_S, default 300 s): its JSON in $OUT/plan_check.json (and on stderr).
#
#   benchmarks/gpu_check.sh                 # the H200 / NPU check
#   benchmarks/gpu_check.sh --preset tiny --device cpu --steps 2 --warmup 1 --table-max 2 --search-max 2
#   OUT=/tmp/check benchmarks/gpu_check.sh --smoke   # both scripts' --smoke on the CPU: seconds
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then py=$PYTHON; elif [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
out=${OUT:-.}/accel_step.json
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
status=0
timeout "${LIMIT_S:-540}" "$py" benchmarks/accel_step.py --partial "$out" "$@" || status=$?
if [ "$status" -ne 0 ]; then
  echo "[gpu_check] accel_step.py exited $status (124: the time limit); the parts measured so far:" >&2
  cat "$out" 2>/dev/null || true
fi
# plan vs measured, for the same --preset / --device (and --smoke) as above
plan_args=()
while [ $# -gt 0 ]; do
  case "$1" in --preset|--device) plan_args+=("$1" "$2"); shift 2 ;; --smoke) plan_args+=("$1"); shift ;; *) shift ;; esac
done
plan_out=${OUT:-.}/plan_check.json
plan_status=0
timeout "${PLAN_LIMIT_S:-300}" "$py" benchmarks/plan_check.py "${plan_args[@]}" > "$plan_out" || plan_status=$?
echo "[gpu_check] plan vs measured (exit $plan_status): $(cat "$plan_out" 2>/dev/null)" >&2
[ "$status" -ne 0 ] && exit "$status"
exit "$plan_status"
