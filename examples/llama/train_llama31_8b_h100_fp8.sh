#!/bin/bash
# Llama 3.1 8B on H100 nodes (TP 2 within a node; several nodes via NNODES/NODE_RANK/MASTER_ADDR).
#   bash examples/llama/train_llama31_8b_h100_fp8.sh CHECKPOINT_DIR TENSORBOARD_DIR TOKENIZER DATA_PATH DTYPE [extra flags]
set -euo pipefail
source "$(dirname "$0")/common.sh"
LLAMA_FLAGS=(--use-distributed-optimizer)
run_llama llama3.1-8b "${TP:-2}" "${PP:-1}" "${MICRO_BATCH_SIZE:-1}" "${GLOBAL_BATCH_SIZE:-128}" \
    "$@"
