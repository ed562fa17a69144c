# Shared by examples/study_cpu.sh and examples/study_gpu.sh: corpus -> sweep -> report.
#
#   run_study OUTPUT_DIR [training flags...]
#
# Data: DATA_PATH (an indexed-dataset prefix, e.g. FineWeb preprocessed with
# script/data_processing/preprocess_data.py) with SPLIT (e.g. 99,1,0); without DATA_PATH, a corpus
# is built once in CORPUS_DIR (default OUTPUT_DIR/corpus) from CORPUS_SOURCE (a directory of text
# files; default the Python standard library). Recipes: RECIPES plus SWEEP_ABLATE's presets and their
# variants; SWEEP_SEEDS extra seeds of every recipe; SWEEP_PARALLEL runs at once. Runs go to
# OUTPUT_DIR/runs, the report (index.html, runs.csv, recipes.csv, PNGs) to OUTPUT_DIR/report.
# Re-running resumes: finished runs are skipped, interrupted ones continue from their checkpoints.

STUDY_RECIPES="bf16 te-mxfp8 hifp8"

# study_iterations DEFAULT: TRAIN_ITERS (or DEFAULT) once checked to be a plain positive integer, before
# the launch scripts' shell arithmetic reads it (which would run $(...) inside it); else one line, status 2.
study_iterations() {
    local value=${TRAIN_ITERS:-$1}
    if [[ ! $value =~ ^[1-9][0-9]{0,8}$ ]]; then
        echo "error: TRAIN_ITERS='${value:0:80}' is not an iteration count; allowed: an integer from 1 to 999999999" >&2
        exit 2
    fi
    echo "$value"
}
STUDY_ABLATE="te-nvfp4 mxfp4"  # te-nvfp4 -no-sr -no-rht -no-2d +bf16-layers; mxfp4 +sr +rht +sr+rht

run_study() {
    local out=$1
    shift
    local data_args=()
    if [ -n "${DATA_PATH:-}" ]; then
        data_args=(--data-path "$DATA_PATH" --split "${SPLIT:?SPLIT (e.g. 99,1,0) goes with DATA_PATH}")
    else
        local corpus=${CORPUS_DIR:-$out/corpus}
        if [ ! -f "$corpus/corpus.json" ]; then
            python -m megatron.quant.lab.corpus "$corpus" ${CORPUS_SOURCE:+--source "$CORPUS_SOURCE"}
        fi
        local manifest
        manifest=$(python -m megatron.quant.lab.corpus "$corpus" --print-data) || return 2
        data_args=(--data-path "${manifest% *}" --split "${manifest##* }")  # the path may hold spaces
    fi
    local status=0
    SWEEP_SEEDS=${SWEEP_SEEDS-1 2} SWEEP_ABLATE=${SWEEP_ABLATE-$STUDY_ABLATE} \
        bash "$(dirname "${BASH_SOURCE[0]}")/llama/sweep_recipes.sh" "$out/runs" "${RECIPES:-$STUDY_RECIPES}" \
        "${data_args[@]}" "$@" || status=$?
    # Bad input (status 2: the data, recipes, seeds or flags, named on stderr) started no run: no report.
    [ "$status" -ne 2 ] || return 2
    # The report also when a run crashed (it shows which); the exit status still says so.
    python -m megatron.quant.analysis runs "$out/runs" --output_dir "$out/report" --baseline bf16 || status=$?
    return $status
}
