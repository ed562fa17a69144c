#!/bin/bash
# A tiny Llama on CPU (development, CI). NPROC=2 with TP=2 or data parallelism over two processes.
#   bash examples/llama/train_llama_tiny_cpu.sh [OUTPUT_DIR] [extra flags]
# DATA_PATH (indexed-dataset prefix, byte tokenizer) instead of mock data; CUSTOM_QUANT_TYPE picks the format.
# Bad arguments exit with status 2 and one error line before torchrun starts.
set -euo pipefail
source "$(dirname "$0")/common.sh"
USAGE="[OUTPUT_DIR=./tiny_cpu_run] [extra megatron-quant-train flags]"
[ -z "${1:-}" ] || require_positional OUTPUT_DIR "$1"
out=${1:-./tiny_cpu_run}
shift || true
data_args=(--mock-data)
[ -n "${DATA_PATH:-}" ] && data_args=(--data-path "$DATA_PATH" --split 98,2,0)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
flags=(--model llama-tiny --tensor-model-parallel-size "${TP:-1}"
       --micro-batch-size 4 --global-batch-size 8 --train-iters "${TRAIN_ITERS:-50}"
       --lr 1e-3 --min-lr 1e-4 --lr-warmup-iters 5 --log-interval 5 --eval-interval 25 --eval-iters 2
       --save "$out/checkpoints" --save-interval 25 --load "$out/checkpoints" --tensorboard-dir "$out/tensorboard"
       "${data_args[@]}" "$@")
check_train_args "${NPROC:-1}" "${flags[@]}" || exit $?
exec torchrun --nproc-per-node "${NPROC:-1}" --master-port "${MASTER_PORT:-29511}" -m megatron.quant.training "${flags[@]}"
