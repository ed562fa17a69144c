#!/bin/bash
# The headline study at 1B on GPUs: the recipes of examples/study_cpu.sh (3 seeds each) on
# Llama 3.2 1B shapes, bf16 training, sequence 2048, TRAIN_ITERS (default 1000) iterations of
# 32 x 2048 tokens (65M tokens a run), one GPU per run, SWEEP_PARALLEL (default: the visible GPUs)
# runs at once.
#   bash examples/study_gpu.sh [OUTPUT_DIR=./study_gpu] [extra training flags]
# Give real data: DATA_PATH (indexed dataset, e.g. FineWeb through preprocess_data.py) and SPLIT;
# the default corpus (the Python standard library, ~32M byte tokens) repeats twice at 1000 iterations.
set -euo pipefail
source "$(dirname "$0")/study_common.sh"
out=${1:-./study_gpu}
shift || true
gpus=$( (nvidia-smi -L 2>/dev/null || true) | wc -l)
export SWEEP_PARALLEL=${SWEEP_PARALLEL:-$((gpus > 0 ? gpus : 1))} NPROC=1
export CUSTOM_QUANT_SCOPE=${CUSTOM_QUANT_SCOPE:-linear}
iters=$(study_iterations 1000)
run_study "$out" --model llama3.2-1b --seq-length 2048 --max-position-embeddings 2048 --bf16 \
    --micro-batch-size 4 --global-batch-size 32 --train-iters "$iters" \
    --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters $((iters / 20)) \
    --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95 --log-interval 10 \
    --eval-interval $((iters / 10 > 0 ? iters / 10 : 1)) --eval-iters 10 \
    --save-interval $((iters / 4 > 0 ? iters / 4 : 1)) "$@"
