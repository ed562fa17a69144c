#!/bin/bash
# Train the same model once per recipe, then compare the runs (script/compare_runs.sh).
#   bash examples/llama/sweep_recipes.sh OUTPUT_DIR "bf16 mxfp8 mxfp4 nvfp4 hifp8" [training flags...]
# Recipes: format names, presets (te-nvfp4, ...), their variants (te-nvfp4-no-sr, mxfp4+sr, ...),
# comparison presets (essential, quant_only, all) or recipe files. Each run goes to
# OUTPUT_DIR/<recipe>/ (checkpoints, tensorboard, run.json); re-running skips finished runs and
# resumes interrupted ones. NPROC: processes per run (torchrun); SWEEP_PRINT=1: print one launch
# command per run (a job array) instead of running; SWEEP_SEEDS="1 2": extra seeds of every recipe
# (runs <recipe>-seed<N>; SWEEP_BASELINE=NAME: of that recipe only); SWEEP_ABLATE="te-nvfp4 mxfp4":
# add each preset and its variants with one component removed or added; SWEEP_PARALLEL=N: N runs
# at once, each on its own GPUs or share of the cores (SWEEP_RUNS_PER_GPU=K: K of them share each
# GPU); SWEEP_LAUNCHER replaces the torchrun command
# (MASTER_PORT fixes torchrun's port; unset, torchrun picks a free one, as parallel runs need).
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $(basename "$0") OUTPUT_DIR \"RECIPE ...\" [training flags...]" >&2
    exit 2
fi
out=$1 recipes=$2
shift 2
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
launcher=${SWEEP_LAUNCHER:-torchrun --nproc-per-node ${NPROC:-1}${MASTER_PORT:+ --master-port $MASTER_PORT}}
options=(--launcher "$launcher" --seeds "${SWEEP_SEEDS:-}" --parallel "${SWEEP_PARALLEL:-1}"
         --runs-per-gpu "${SWEEP_RUNS_PER_GPU:-1}")
for preset in ${SWEEP_ABLATE:-}; do
    options+=(--ablate "$preset")
done
[ -n "${SWEEP_BASELINE:-}" ] && options+=(--baseline "$SWEEP_BASELINE")
[ "${SWEEP_PRINT:-0}" != "0" ] && options+=(--print)
exec python -m megatron.quant.lab.sweep "${options[@]}" "$out" "$recipes" -- "$@"
