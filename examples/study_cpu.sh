#!/bin/bash
# The headline study on CPU: bf16, te-mxfp8, hifp8, te-nvfp4 and its ablations (-no-sr, -no-rht,
# -no-2d, +bf16-layers), mxfp4 with and without SR/RHT; 3 seeds each; a 3.3M-parameter Llama
# (4 layers, hidden 256), sequence 256, 150 iterations of 2,048 tokens on a real text corpus
# (built from the Python standard library unless DATA_PATH is given), linear layers quantized.
#   bash examples/study_cpu.sh [OUTPUT_DIR=./study_cpu] [extra training flags]
# 36 runs of 2 to 8 minutes each (on one core), SWEEP_PARALLEL (default: the number of cores) at a time.
# TRAIN_ITERS, SWEEP_SEEDS, RECIPES, SWEEP_ABLATE, DATA_PATH/SPLIT: see examples/study_common.sh.
set -euo pipefail
source "$(dirname "$0")/study_common.sh"
out=${1:-./study_cpu}
shift || true
export SWEEP_PARALLEL=${SWEEP_PARALLEL:-$(nproc)} SWEEP_LAUNCHER=${SWEEP_LAUNCHER:-python}
export CUSTOM_QUANT_SCOPE=${CUSTOM_QUANT_SCOPE:-linear}  # format names quantize what the te-* presets do
iters=$(study_iterations 150)
run_study "$out" --model llama-tiny --num-layers 4 --seq-length 256 --max-position-embeddings 256 \
    --micro-batch-size 8 --global-batch-size 8 --train-iters "$iters" \
    --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters $((iters / 10)) \
    --weight-decay 0.1 --clip-grad 1.0 --log-interval 5 --eval-interval $((iters / 6 > 0 ? iters / 6 : 1)) \
    --eval-iters 8 --save-interval $((iters / 3 > 0 ? iters / 3 : 1)) "$@"
