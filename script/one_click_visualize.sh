#!/usr/bin/env bash
# One-click visualization of captured tensors: every figure and an HTML report.
#   bash script/one_click_visualize.sh [TENSOR_DIR=./tensor_logs] [OUTPUT_DIR=./draw] [options]
# Options after the two directories go to `python -m megatron.quant.analysis` (filters such as
# --quant_types hifp8 mxfp8 --layers 0-3, --workers N; see --help). One pass does what
# quick_visualize.py, visualize_tensors.py and visualization/enhanced_tensor_visualizer.py
# do one after the other, reading each capture once.
set -euo pipefail

TENSOR_DIR="${1:-./tensor_logs}"
OUTPUT_DIR="${2:-./draw}"
shift $(( $# < 2 ? $# : 2 ))

"${PYTHON:-python}" -m megatron.quant.analysis \
    --tensor_dir "${TENSOR_DIR}" --output_dir "${OUTPUT_DIR}" --analyses all "$@"
echo "Open ${OUTPUT_DIR}/index.html in a browser."
