#!/bin/bash
# Quickstart (CPU, a few minutes): train a tiny Llama with a fake-quantized format, capture the GEMM
# operands of three iterations (their statistics over training, and what two other formats would do to
# them), render the report with a what-if comparison of formats.
#   set up as README.md says (torch, then pip install -e ".[test]")
#   bash examples/quickstart.sh
# CUSTOM_QUANT_TYPE (default hifp8), OUT (default ./quickstart_out), TENSOR_SAVER_ITERATION (default 8,16,24),
# TENSOR_SAVE_WHATIF (default mxfp8,nvfp4).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-./quickstart_out}
export CUSTOM_QUANT_TYPE=${CUSTOM_QUANT_TYPE:-hifp8}
export TENSOR_SAVE_ENABLED=true
export TENSOR_SAVE_DIR=$out/tensor_logs
export TENSOR_SAVER_ITERATION=${TENSOR_SAVER_ITERATION:-8,16,24}  # three: the report's curves over training
export TENSOR_SAVE_STATS=${TENSOR_SAVE_STATS:-sample}  # statistics and what-ifs from a sample: a CPU's minutes
export TENSOR_SAVE_WHATIF=${TENSOR_SAVE_WHATIF:-mxfp8,nvfp4}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
rm -rf "$out"

echo "== training llama-tiny on CPU with CUSTOM_QUANT_TYPE=$CUSTOM_QUANT_TYPE, capturing iterations $TENSOR_SAVER_ITERATION"
python -m megatron.quant.training --model llama-tiny --mock-data \
    --train-iters 24 --micro-batch-size 4 --global-batch-size 4 \
    --lr 1e-3 --min-lr 1e-4 --lr-warmup-iters 3 --log-interval 5 --eval-interval 12 --eval-iters 2 \
    --save "$out/checkpoints" --tensorboard-dir "$out/tensorboard"

echo "== rendering the report"
bash script/one_click_visualize.sh "$out/tensor_logs" "$out/draw"

echo "== what if these tensors had been quantized with other formats?"
python script/compare_formats.py --tensor_dir "$out/tensor_logs" --output_dir "$out/draw" \
    --formats hifp8 mxfp8 mxfp4 nvfp4 fp8_e4m3 --iterations "${TENSOR_SAVER_ITERATION##*,}"  # the last one

echo
echo "== where to look"
echo "captured tensors + manifests: $out/tensor_logs/$CUSTOM_QUANT_TYPE/"
echo "report (open in a browser):   $out/draw/index.html"
echo "checkpoint:                   $out/checkpoints/"
echo "TensorBoard:                  tensorboard --logdir $out/tensorboard"
