#!/usr/bin/env bash
# Capture layer 0's input/output under several modes on one fixed input and compare with fp32.
#
#   bash script/capture_first_layer.sh                      # all modes
#   bash script/capture_first_layer.sh essential            # fp32 bf16 hifp8 mxfp8 mxfp4
#   bash script/capture_first_layer.sh quant_only           # every fake-quantized format
#   bash script/capture_first_layer.sh fp32 bf16 mxfp4 --output_file io.npz --seq_len 256
#
# Modes come first; every option after them (--output_file, --seq_len, --model, --layers, ...)
# goes to script/save_first_layer_io.py unchanged. Without --model: the llama-tiny preset with a
# fixed seed, so it runs anywhere. PYTHON selects the interpreter (default python3).
set -euo pipefail

modes=()
while [[ $# -gt 0 && "$1" != -* ]]; do
    modes+=("$1")
    shift
done
if [[ ${#modes[@]} -eq 0 ]]; then
    modes=(all)
fi

exec "${PYTHON:-python3}" "$(dirname "$0")/save_first_layer_io.py" --modes "${modes[@]}" "$@"
