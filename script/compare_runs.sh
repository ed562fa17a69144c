#!/bin/bash
# Compare training runs (e.g. examples/llama/sweep_recipes.sh OUTPUT_DIR): loss curves and gaps to a
# baseline, throughput, quantization statistics -> REPORT_DIR/index.html, runs.csv and PNGs.
#   bash script/compare_runs.sh OUTPUT_DIR [REPORT_DIR] [--baseline bf16] [--smoothing 0.6] [--dpi 100]
# REPORT_DIR defaults to OUTPUT_DIR/report.
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: $(basename "$0") OUTPUT_DIR [REPORT_DIR] [--baseline NAME] [--smoothing W] [--dpi N]" >&2
    exit 2
fi
runs=$1
shift
report=()
if [ $# -ge 1 ] && [ "${1#-}" = "$1" ]; then
    report=(--output_dir "$1")
    shift
fi
exec python -m megatron.quant.analysis runs "$runs" "${report[@]}" "$@"
