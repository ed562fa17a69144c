#!/bin/bash
# Llama 3.2 1B on one node of H100s (TP 1, distributed optimizer over data parallelism).
#   bash examples/llama/train_llama32_1b_h100_fp8.sh CHECKPOINT_DIR TENSORBOARD_DIR TOKENIZER DATA_PATH DTYPE [extra flags]
# e.g. CUSTOM_QUANT_TYPE=hifp8 bash examples/llama/train_llama32_1b_h100_fp8.sh ckpt tb MOCK MOCK bf16
set -euo pipefail
source "$(dirname "$0")/common.sh"
LLAMA_FLAGS=(--use-distributed-optimizer)
run_llama llama3.2-1b "${TP:-1}" "${PP:-1}" "${MICRO_BATCH_SIZE:-2}" "${GLOBAL_BATCH_SIZE:-128}" \
    "$@"
