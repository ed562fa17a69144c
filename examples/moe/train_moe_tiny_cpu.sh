#!/bin/bash
# A tiny mixture of experts on CPU in a few minutes (llama-moe-tiny: 2 MoE layers of 4 routed experts,
# top-2, and one shared expert): train with a fake-quantized format, capture one iteration, render the
# report, whose experts/ figure sets each expert's load beside its quantization error and underflow.
#   CUSTOM_QUANT_TYPE=mxfp8 bash examples/moe/train_moe_tiny_cpu.sh [OUTPUT_DIR=./moe_tiny_out] [extra flags]
# TRAIN_ITERS (default 12), TENSOR_SAVER_ITERATION (default 8). Bad arguments exit with status 2 and one
# error line before training starts.
set -euo pipefail
cd "$(dirname "$0")/../.."
source examples/llama/common.sh
USAGE="[OUTPUT_DIR=./moe_tiny_out] [extra megatron-quant-train flags]"
[ -z "${1:-}" ] || require_positional OUTPUT_DIR "$1"
out=${1:-./moe_tiny_out}
shift || true
export CUSTOM_QUANT_TYPE=${CUSTOM_QUANT_TYPE:-mxfp8}
export TENSOR_SAVE_ENABLED=true
export TENSOR_SAVE_DIR=$out/tensor_logs
export TENSOR_SAVER_ITERATION=${TENSOR_SAVER_ITERATION:-8}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
flags=(--model llama-moe-tiny --mock-data --moe-router-dtype fp32 --moe-aux-loss-coeff 0.01
       --train-iters "${TRAIN_ITERS:-12}" --micro-batch-size 4 --global-batch-size 4
       --lr 1e-3 --min-lr 1e-4 --lr-warmup-iters 2 --log-interval 4 --eval-interval 12 --eval-iters 1
       --tensorboard-dir "$out/tensorboard" "$@")
check_train_args 1 "${flags[@]}" || exit $?
rm -rf "$out/tensor_logs" "$out/draw"

echo "== training llama-moe-tiny on CPU with CUSTOM_QUANT_TYPE=$CUSTOM_QUANT_TYPE, capturing iteration $TENSOR_SAVER_ITERATION"
"${PYTHON:-python}" -m megatron.quant.training "${flags[@]}"

echo "== rendering the report"
bash script/one_click_visualize.sh "$out/tensor_logs" "$out/draw"
echo "load per expert beside its quantization: $out/draw/experts/"
