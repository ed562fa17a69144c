# Shared by the Llama launch scripts: Megatron-LM's positional convention -> megatron-quant-train.
#
#   run_llama PRESET TP PP MICRO_BATCH GLOBAL_BATCH CHECKPOINT_DIR TENSORBOARD_DIR TOKENIZER DATA_PATH DTYPE [extra flags]
#
# The positionals are checked before anything is appended, and the whole command line is
# validated by `megatron-quant-train --check-args` before torchrun starts: bad arguments exit
# with status 2 and one error line.
#
# TOKENIZER / DATA_PATH may be MOCK (synthetic). DTYPE: bf16, or fp8 (real FP8 through
# Transformer Engine on a GPU; without it, Megatron-LM's default delayed recipe, emulated).
# The format comes from CUSTOM_QUANT_TYPE (or CUSTOM_QUANT_RECIPE), capture from TENSOR_SAVE_*:
# both are read by the package from the environment. Multi-node: set NNODES, NODE_RANK,
# MASTER_ADDR (and MASTER_PORT) on every node. Override run length etc. with TRAIN_ITERS,
# LR, MIN_LR, WARMUP_ITERS, SEQ_LENGTH, SAVE_INTERVAL, EVAL_INTERVAL, GPUS_PER_NODE.

# usage_error MESSAGE: the error and the calling script's usage line ($USAGE) on stderr, status 2.
usage_error() {
    echo "$(basename "$0"): error: $1" >&2
    echo "usage: $(basename "$0") $USAGE" >&2
    exit 2
}

# require_positional NAME VALUE: a positional argument must be given, and must not be a flag
# (a flag in its place means the positionals before it are missing).
require_positional() {
    case "$2" in
        "") usage_error "$1 is missing" ;;
        -*) usage_error "$1 is missing: got the flag '$2' in its place" ;;
    esac
}

# check_train_args WORLD_SIZE FLAGS...: the entry point validates the flags, the environment and
# the --load checkpoint in one process, so a bad argument is reported once (status 2) instead of
# by every rank and torchrun's traceback.
check_train_args() {
    local world_size=$1
    shift
    WORLD_SIZE=$world_size PYTHONWARNINGS=ignore "${PYTHON:-python}" -m megatron.quant.training --check-args "$@" >/dev/null
}

# Flags a launch script always adds, after the user's (set by the script before run_llama).
LLAMA_FLAGS=()

run_llama() {
    local preset=$1 tp=$2 pp=$3 mbs=$4 gbs=$5
    shift 5
    USAGE="CHECKPOINT_DIR TENSORBOARD_DIR TOKENIZER DATA_PATH DTYPE [extra megatron flags]   (TOKENIZER, DATA_PATH: a path or MOCK; DTYPE: bf16 | fp8)"
    local name positional=()
    for name in CHECKPOINT_DIR TENSORBOARD_DIR TOKENIZER DATA_PATH DTYPE; do
        require_positional "$name" "${1:-}"
        positional+=("$1")
        shift
    done
    local checkpoint_dir=${positional[0]} tensorboard_dir=${positional[1]} tokenizer=${positional[2]}
    local data_path=${positional[3]} dtype=${positional[4]}

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
        *) usage_error "DTYPE must be bf16 or fp8, got '$dtype' (to simulate a format: DTYPE=bf16 CUSTOM_QUANT_TYPE=<format>)" ;;
    esac

    local gpus=${GPUS_PER_NODE:-$( (nvidia-smi -L 2>/dev/null || true) | wc -l)}
    [ "$gpus" -ge 1 ] || gpus=1
    local flags=(
        --model "$preset"
        --tensor-model-parallel-size "$tp" --pipeline-model-parallel-size "$pp"
        --micro-batch-size "$mbs" --global-batch-size "$gbs"
        ${SEQ_LENGTH:+--seq-length "$SEQ_LENGTH"}
        --train-iters "${TRAIN_ITERS:-10000}" --lr "${LR:-3e-4}" --min-lr "${MIN_LR:-3e-5}"
        --lr-decay-style cosine --lr-warmup-iters "${WARMUP_ITERS:-100}"
        --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95
        --save "$checkpoint_dir" --load "$checkpoint_dir" --save-interval "${SAVE_INTERVAL:-1000}"
        --eval-interval "${EVAL_INTERVAL:-1000}" --eval-iters 10 --log-interval "${LOG_INTERVAL:-10}"
        --tensorboard-dir "$tensorboard_dir"
        "${tokenizer_args[@]}" "${data_args[@]}" "${dtype_args[@]}" "$@" "${LLAMA_FLAGS[@]}"
    )
    check_train_args $((gpus * ${NNODES:-1})) "${flags[@]}" || exit $?
    echo "CUSTOM_QUANT_TYPE=${CUSTOM_QUANT_TYPE:-bf16} TENSOR_SAVE_ENABLED=${TENSOR_SAVE_ENABLED:-false} TENSOR_SAVE_DIR=${TENSOR_SAVE_DIR:-} TENSOR_SAVER_ITERATION=${TENSOR_SAVER_ITERATION:-}"
    set -x
    exec torchrun --nproc-per-node "$gpus" --nnodes "${NNODES:-1}" --node-rank "${NODE_RANK:-0}" \
        --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-6000}" \
        -m megatron.quant.training "${flags[@]}"
}
