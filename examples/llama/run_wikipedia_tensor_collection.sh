#!/bin/bash
# Capture one training iteration's tensors from a Llama run on Wikipedia (or mock) data, show
# progress as files appear, and exit when the capture window is over.
#   bash examples/llama/run_wikipedia_tensor_collection.sh [DATA_PATH|MOCK] [TOKENIZER|MOCK]
# DATA_PATH: prefix from script/data_processing/prepare_wikipedia.sh, e.g.
# dataset/wikipedia_processed/wikipedia_processed_text_document. MODEL defaults to llama3.2-1b on
# GPUs and llama-tiny on CPU. CUSTOM_QUANT_TYPE (default hifp8), TENSOR_SAVE_DIR
# (./enhanced_tensor_logs), TENSOR_SAVER_ITERATION (default 2), TENSOR_SAVE_MODE as usual.
set -euo pipefail
data=${1:-MOCK}
tokenizer=${2:-MOCK}
if nvidia-smi -L >/dev/null 2>&1; then model=${MODEL:-llama3.2-1b}; else model=${MODEL:-llama-tiny}; fi
export CUSTOM_QUANT_TYPE=${CUSTOM_QUANT_TYPE:-hifp8}
export TENSOR_SAVE_ENABLED=true TENSOR_SAVE_EXIT_AFTER=true
export TENSOR_SAVE_DIR=${TENSOR_SAVE_DIR:-./enhanced_tensor_logs}
export TENSOR_SAVER_ITERATION=${TENSOR_SAVER_ITERATION:-2}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

args=(--model "$model" --micro-batch-size 1 --global-batch-size "${GLOBAL_BATCH_SIZE:-2}"
      --train-iters "${TRAIN_ITERS:-100}" --lr 1e-4 --eval-iters 0 --log-interval 1)
if [ "$data" = "MOCK" ]; then args+=(--mock-data); else args+=(--data-path "$data" --split 99,1,0); fi
if [ "$tokenizer" != "MOCK" ]; then args+=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tokenizer"); fi
[ "$model" = "llama-tiny" ] || args+=(--bf16)

echo "collecting $CUSTOM_QUANT_TYPE tensors of iteration $TENSOR_SAVER_ITERATION into $TENSOR_SAVE_DIR"
torchrun --nproc-per-node "${NPROC:-1}" --master-port "${MASTER_PORT:-29512}" -m megatron.quant.training "${args[@]}" \
    > "$TENSOR_SAVE_DIR.train.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' INT TERM
mkdir -p "$TENSOR_SAVE_DIR"
while kill -0 "$pid" 2>/dev/null; do
    files=$(find "$TENSOR_SAVE_DIR" -name '*.pt' 2>/dev/null | wc -l)
    size=$(du -sh "$TENSOR_SAVE_DIR" 2>/dev/null | cut -f1)
    echo "[$(date +%H:%M:%S)] $files tensor files ($size) | $(grep '^iteration' "$TENSOR_SAVE_DIR.train.log" | tail -1 | cut -d'|' -f1-2)"
    sleep "${POLL_SECONDS:-5}"
done
wait "$pid" || { echo "training failed; see $TENSOR_SAVE_DIR.train.log" >&2; tail -20 "$TENSOR_SAVE_DIR.train.log" >&2; exit 1; }
echo "done: $(find "$TENSOR_SAVE_DIR" -name '*.pt' | wc -l) tensor files and manifests in $TENSOR_SAVE_DIR (log: $TENSOR_SAVE_DIR.train.log)"
echo "next: bash script/one_click_visualize.sh $TENSOR_SAVE_DIR ./draw"
