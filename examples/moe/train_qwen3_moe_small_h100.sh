#!/bin/bash
# A Qwen3-MoE-style mixture of experts (qwen3-moe-small: 64 experts, top-8, no shared expert, every layer
# MoE, GQA 16/4) on one node of H100s; experts spread over the GPUs by expert parallelism (EP, default:
# all of them).
#   bash examples/moe/train_qwen3_moe_small_h100.sh CHECKPOINT_DIR TENSORBOARD_DIR TOKENIZER DATA_PATH DTYPE [extra flags]
# e.g. CUSTOM_QUANT_TYPE=te-mxfp8 bash examples/moe/train_qwen3_moe_small_h100.sh ckpt tb MOCK MOCK bf16
set -euo pipefail
source "$(dirname "$0")/../llama/common.sh"
gpus=${GPUS_PER_NODE:-$( (nvidia-smi -L 2>/dev/null || true) | wc -l)}
LLAMA_FLAGS=(--expert-model-parallel-size "${EP:-$(( gpus > 0 ? gpus : 1 ))}" --moe-token-dispatcher-type alltoall
             --moe-router-dtype fp32 --moe-aux-loss-coeff 1e-3)
run_llama qwen3-moe-small "${TP:-1}" "${PP:-1}" "${MICRO_BATCH_SIZE:-1}" "${GLOBAL_BATCH_SIZE:-64}" "$@"
