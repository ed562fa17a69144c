#!/bin/bash
# Quickstart (CPU, about 3 minutes on 2 cores): train a tiny Llama on two processes (data parallel) with a
# fake-quantized format, capturing the GEMM operands of three iterations (their statistics over training, and
# what two other formats would do to them); train it again briefly unquantized (bf16), in MXFP8 and in NVFP4
# for the comparisons; render the report, in which every section draws, with a what-if comparison of formats.
#   set up as README.md says (torch, then pip install -e ".[test]")
#   bash examples/quickstart.sh
# CUSTOM_QUANT_TYPE (default hifp8), OUT (default ./quickstart_out), TENSOR_SAVER_ITERATION (default 8,16,24),
# TENSOR_SAVE_WHATIF (default mxfp8,nvfp4).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-./quickstart_out}
quant_type=${CUSTOM_QUANT_TYPE:-hifp8}
iterations=${TENSOR_SAVER_ITERATION:-8,16,24}  # three: the report's curves over training
first=${iterations%%,*}
last=${iterations##*,}
export TENSOR_SAVE_ENABLED=true
export TENSOR_SAVE_DIR=$out/tensor_logs
export TENSOR_SAVE_STATS=${TENSOR_SAVE_STATS:-sample}  # statistics and what-ifs from a sample: a CPU's minutes
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread for each of the two processes
rm -rf "$out"

train() {  # CUSTOM_QUANT_TYPE TRAIN_ITERS [flags]: llama-tiny, one process per core, the same data and seed
    local format=$1 iters=$2
    shift 2
    CUSTOM_QUANT_TYPE=$format torchrun --standalone --nproc-per-node 2 -m megatron.quant.training \
        --model llama-tiny --mock-data --train-iters "$iters" --micro-batch-size 2 --global-batch-size 4 \
        --lr 1e-3 --min-lr 1e-4 --lr-warmup-iters 3 --log-interval 8 --eval-interval 12 --eval-iters 2 "$@"
}

echo "== training llama-tiny on CPU with CUSTOM_QUANT_TYPE=$quant_type, capturing iterations $iterations"
TENSOR_SAVER_ITERATION=$iterations TENSOR_SAVE_WHATIF=${TENSOR_SAVE_WHATIF:-mxfp8,nvfp4} train "$quant_type" "$last" \
    --save "$out/checkpoints" --tensorboard-dir "$out/tensorboard"

# The report's comparisons: the same tensors unquantized, in HiFP8 and in MXFP8 (iteration $first, whole tensors;
# the run's own format is not trained twice), and the block scales of NVFP4 over training (statistics only).
for format in bf16 hifp8 mxfp8; do
    [ "$format" = "$quant_type" ] && continue
    echo "== the same run in $format up to iteration $first, capturing it"
    # the run's length is the main one's (the same learning-rate schedule); it ends once iteration $first is captured
    TENSOR_SAVER_ITERATION=$first TENSOR_SAVE_EXIT_AFTER=true train "$format" "$last"
done
if [ "$quant_type" != nvfp4 ]; then
    echo "== the same run in nvfp4, per-block statistics of iterations $iterations"
    TENSOR_SAVER_ITERATION=$iterations TENSOR_SAVE_MODE=stats train nvfp4 "$last"
fi

echo "== rendering the report"
bash script/one_click_visualize.sh "$out/tensor_logs" "$out/draw"

echo "== what if these tensors had been quantized with other formats?"
python script/compare_formats.py --tensor_dir "$out/tensor_logs" --output_dir "$out/draw" \
    --formats hifp8 mxfp8 mxfp4 nvfp4 fp8_e4m3 --iterations "$last"  # the last one: the main run's tensors

echo
echo "== where to look"
echo "captured tensors + manifests: $out/tensor_logs/<format>/"
echo "report (open in a browser):   $out/draw/index.html"
echo "checkpoint:                   $out/checkpoints/"
echo "TensorBoard:                  tensorboard --logdir $out/tensorboard"
