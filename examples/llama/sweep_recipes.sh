#!/bin/bash
# Train the same model once per recipe, then compare the runs (script/compare_runs.sh).
#   bash examples/llama/sweep_recipes.sh OUTPUT_DIR "bf16 mxfp8 mxfp4 nvfp4 hifp8" [training flags...]
# Recipes: format names, presets (essential, quant_only, all) or recipe files. Each run goes to
# OUTPUT_DIR/<recipe>/ (checkpoints, tensorboard, run.json); re-running skips finished runs and
# resumes interrupted ones. NPROC: processes per run (torchrun); SWEEP_PRINT=1: print one launch
# command per run (a job array) instead of running; SWEEP_SEEDS="1 2": extra seeds of the baseline
# (SWEEP_BASELINE, default the first recipe) for the report's noise band; SWEEP_LAUNCHER replaces
# the torchrun command.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $(basename "$0") OUTPUT_DIR \"RECIPE ...\" [training flags...]" >&2
    exit 2
fi
out=$1 recipes=$2
shift 2
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
launcher=${SWEEP_LAUNCHER:-torchrun --nproc-per-node ${NPROC:-1} --master-port ${MASTER_PORT:-29512}}
options=(--launcher "$launcher" --seeds "${SWEEP_SEEDS:-}")
[ -n "${SWEEP_BASELINE:-}" ] && options+=(--baseline "$SWEEP_BASELINE")
[ "${SWEEP_PRINT:-0}" != "0" ] && options+=(--print)
exec python -m megatron.quant.training.sweep "${options[@]}" "$out" "$recipes" -- "$@"
