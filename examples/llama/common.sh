# Shared by the Llama launch scripts: Megatron-LM's positional convention -> megatron-quant-train.
#
#   run_llama PRESET TP PP MICRO_BATCH GLOBAL_BATCH CHECKPOINT_DIR TENSORBOARD_DIR TOKENIZER DATA_PATH DTYPE [extra flags]
#
# TOKENIZER / DATA_PATH may be MOCK (synthetic). DTYPE: bf16, or fp8 (real FP8 through
# Transformer Engine; to *simulate* FP8 use bf16 with CUSTOM_QUANT_TYPE=fp8_e4m3).
# The format comes from CUSTOM_QUANT_TYPE (or CUSTOM_QUANT_RECIPE), capture from TENSOR_SAVE_*:
# both are read by the package from the environment. Multi-node: set NNODES, NODE_RANK,
# MASTER_ADDR (and MASTER_PORT) on every node. Override run length etc. with TRAIN_ITERS,
# LR, MIN_LR, WARMUP_ITERS, SEQ_LENGTH, SAVE_INTERVAL, EVAL_INTERVAL, GPUS_PER_NODE.

run_llama() {
    local preset=$1 tp=$2 pp=$3 mbs=$4 gbs=$5
    shift 5
    if [ $# -lt 5 ]; then
        echo "usage: $(basename "$0") CHECKPOINT_DIR TENSORBOARD_DIR TOKENIZER DATA_PATH DTYPE [extra megatron flags]" >&2
        echo "       TOKENIZER: a local Hugging Face tokenizer directory or MOCK; DATA_PATH: an indexed-dataset prefix or MOCK; DTYPE: bf16 | fp8" >&2
        exit 2
    fi
    local checkpoint_dir=$1 tensorboard_dir=$2 tokenizer=$3 data_path=$4 dtype=$5
    shift 5

    local tokenizer_args=() data_args=() dtype_args=()
    if [ "$tokenizer" != "MOCK" ]; then
        tokenizer_args=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tokenizer")
    fi
    if [ "$data_path" = "MOCK" ]; then
        data_args=(--mock-data)
    else
        data_args=(--data-path "$data_path" --split 99,1,0)
    fi
    case "$dtype" in
        bf16) dtype_args=(--bf16) ;;
        fp8)  dtype_args=(--bf16 --fp8-format hybrid) ;;
        *) echo "DTYPE must be bf16 or fp8, got '$dtype' (to simulate a format: DTYPE=bf16 CUSTOM_QUANT_TYPE=<format>)" >&2; exit 2 ;;
    esac

    local gpus=${GPUS_PER_NODE:-$( (nvidia-smi -L 2>/dev/null || true) | wc -l)}
    [ "$gpus" -ge 1 ] || gpus=1
    echo "CUSTOM_QUANT_TYPE=${CUSTOM_QUANT_TYPE:-bf16} TENSOR_SAVE_ENABLED=${TENSOR_SAVE_ENABLED:-false} TENSOR_SAVE_DIR=${TENSOR_SAVE_DIR:-} TENSOR_SAVER_ITERATION=${TENSOR_SAVER_ITERATION:-}"
    set -x
    exec torchrun --nproc-per-node "$gpus" --nnodes "${NNODES:-1}" --node-rank "${NODE_RANK:-0}" \
        --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-6000}" \
        -m megatron.quant.train \
        --model "$preset" \
        --tensor-model-parallel-size "$tp" --pipeline-model-parallel-size "$pp" \
        --micro-batch-size "$mbs" --global-batch-size "$gbs" \
        ${SEQ_LENGTH:+--seq-length "$SEQ_LENGTH"} \
        --train-iters "${TRAIN_ITERS:-10000}" --lr "${LR:-3e-4}" --min-lr "${MIN_LR:-3e-5}" \
        --lr-decay-style cosine --lr-warmup-iters "${WARMUP_ITERS:-100}" \
        --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95 \
        --save "$checkpoint_dir" --load "$checkpoint_dir" --save-interval "${SAVE_INTERVAL:-1000}" \
        --eval-interval "${EVAL_INTERVAL:-1000}" --eval-iters 10 --log-interval 1 \
        --tensorboard-dir "$tensorboard_dir" \
        "${tokenizer_args[@]}" "${data_args[@]}" "${dtype_args[@]}" "$@"
}
