#!/bin/bash
# A DeepSeek-V3-style mixture of experts (deepseek-v3-small: 64 fine-grained experts, top-6, one shared
# expert, the first layer dense, sigmoid router scores in FP32) on one node of H100s; experts spread
# over the GPUs by expert parallelism (EP, default: all of them).
#   bash examples/moe/train_deepseek_v3_small_h100.sh CHECKPOINT_DIR TENSORBOARD_DIR TOKENIZER DATA_PATH DTYPE [extra flags]
# e.g. CUSTOM_QUANT_TYPE=deepseek-v3-fp8 bash examples/moe/train_deepseek_v3_small_h100.sh ckpt tb MOCK MOCK bf16
set -euo pipefail
source "$(dirname "$0")/../llama/common.sh"
gpus=${GPUS_PER_NODE:-$( (nvidia-smi -L 2>/dev/null || true) | wc -l)}
LLAMA_FLAGS=(--expert-model-parallel-size "${EP:-$(( gpus > 0 ? gpus : 1 ))}" --moe-token-dispatcher-type alltoall
             --moe-router-dtype fp32 --moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-4)
run_llama deepseek-v3-small "${TP:-1}" "${PP:-1}" "${MICRO_BATCH_SIZE:-1}" "${GLOBAL_BATCH_SIZE:-64}" "$@"
