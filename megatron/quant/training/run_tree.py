"""The run's configuration tree: every setting of a training run, one typed section per concern.

``run_tree_build.build_run_tree`` makes it once from the command line, the environment
(``settings.environment``, the one reader of ``os.environ``) and the files the flags name (a
``--model`` preset, a ``--hf-checkpoint``'s config.json); ``--print-config`` shows it with where each
value came from (``run_tree_show``). Flag fields keep their Megatron-LM destination names, so
``--num-layers`` is ``tree.model.num_layers``. Paths stay paths: a recipe, precision or inspect file
is read by its own reader (``run_config``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional, Sequence, Union

from megatron.quant.settings.environment import Environment
from megatron.quant.settings.variables import RECIPE_PREFIX

# Where a value may come from, the first that has it winning: the one precedence rule of the tree.
SOURCES = ("flag", "environment", "file", "default")


def first_given(key: str, layers: Sequence[tuple[str, Mapping[str, Any]]]) -> tuple[Any, str]:
    """(value, source) of ``key`` from the first of ``layers`` (in ``SOURCES`` order) that has it."""
    for source, values in layers:
        if key in values:
            return values[key], source
    raise KeyError(f"{key}: no source gives a value ({', '.join(source for source, _ in layers)})")


@dataclass(frozen=True)
class ModelSection:
    """The model's shape and initialisation (Llama; the presets are in training/presets.py)."""

    model: Optional[str]                 # --model: the shape preset
    hf_checkpoint: Optional[str]         # --hf-checkpoint: a local Hugging Face Llama directory (shape and weights)
    num_layers: int                      # --num-layers: decoder layers
    hidden_size: int                     # --hidden-size
    ffn_hidden_size: int                 # --ffn-hidden-size: the MLP's inner width
    num_attention_heads: int             # --num-attention-heads
    group_query_attention: bool          # --group-query-attention: use --num-query-groups
    num_query_groups: int                # --num-query-groups: key/value heads (the heads without GQA)
    kv_channels: Optional[int]           # --kv-channels: hidden / heads only (Megatron-LM's)
    seq_length: int                      # --seq-length: tokens per sample
    max_position_embeddings: int         # --max-position-embeddings (default: --seq-length)
    position_embedding_type: str         # --position-embedding-type: rope
    rotary_base: float                   # --rotary-base: RoPE's theta
    rotary_percent: float                # --rotary-percent: 1.0 only
    rope_scaling_factor: Optional[float]  # --rope-scaling-factor: Llama 3.1-style scaling
    normalization: str                   # --normalization: RMSNorm
    norm_epsilon: float                  # --norm-epsilon
    swiglu: bool                         # --swiglu: always on for Llama
    untie_embeddings_and_output_weights: bool  # --untie-embeddings-and-output-weights
    disable_bias_linear: bool            # --disable-bias-linear: always on for Llama
    vocab_size: Optional[int]            # --vocab-size: NullTokenizer / mock data (None: the tokenizer's)
    make_vocab_size_divisible_by: int    # --make-vocab-size-divisible-by: padding of the vocabulary
    init_method_std: float               # --init-method-std: the weights' initial standard deviation
    attention_dropout: float             # --attention-dropout
    hidden_dropout: float                # --hidden-dropout
    # Multi-latent attention (training/mla.py), set by a preset's shape only (deepseek-v3-small); no flag:
    # Megatron-LM's MLA flags are refused (docs/training.md).
    multi_latent_attention: bool         # megatron-core's MLA in place of GQA attention
    q_lora_rank: Optional[int]           # the queries' latent width (None: one projection)
    kv_lora_rank: Optional[int]          # the keys' and values' latent width
    qk_head_dim: Optional[int]           # a head's query/key width without RoPE
    qk_pos_emb_head_dim: Optional[int]   # the shared RoPE part of queries and keys
    v_head_dim: Optional[int]            # a head's value width


@dataclass(frozen=True)
class MoESection:
    """Mixture of experts (training/moe.py); num_experts None is a dense model."""

    num_experts: Optional[int]           # --num-experts: routed experts per MoE layer
    moe_router_topk: int                 # --moe-router-topk: experts per token
    moe_ffn_hidden_size: Optional[int]   # --moe-ffn-hidden-size: an expert's inner width
    moe_shared_expert_intermediate_size: Optional[int]  # --moe-shared-expert-intermediate-size
    moe_layer_freq: Union[int, list]     # --moe-layer-freq: every Nth layer, or a 0/1 pattern
    moe_router_score_function: str       # --moe-router-score-function: softmax | sigmoid
    moe_router_pre_softmax: bool         # --moe-router-pre-softmax
    moe_token_dispatcher_type: str       # --moe-token-dispatcher-type: allgather | alltoall
    moe_router_dtype: Optional[str]      # --moe-router-dtype: fp32 | fp64 router math
    moe_router_load_balancing_type: str  # --moe-router-load-balancing-type
    moe_aux_loss_coeff: float            # --moe-aux-loss-coeff


@dataclass(frozen=True)
class DataSection:
    """Training data and tokenizer."""

    data_path: Optional[list]            # --data-path: [W1] PREFIX1 [W2 PREFIX2 ...] indexed datasets
    split: str                           # --split: train,valid,test shares
    mock_data: bool                      # --mock-data: synthetic tokens instead of --data-path
    data_cache_path: Optional[str]       # --data-cache-path: where megatron-core caches its indices
    tokenizer_type: str                  # --tokenizer-type: ByteTokenizer | HuggingFaceTokenizer | NullTokenizer
    tokenizer_model: Optional[str]       # --tokenizer-model: a local Hugging Face tokenizer directory


@dataclass(frozen=True)
class ScheduleSection:
    """Run length, batch and logging of the loop."""

    train_iters: int                     # --train-iters (or from --train-samples)
    train_samples: Optional[int]         # --train-samples: Megatron-LM's samples, translated to iterations
    micro_batch_size: int                # --micro-batch-size: sequences per micro-batch per data-parallel rank
    global_batch_size: int               # --global-batch-size (default: micro-batch x data-parallel size)
    num_microbatches: int                # global batch / (micro-batch x data-parallel size)
    seed: int                            # --seed: weights, data order and stochastic rounding
    log_interval: int                    # --log-interval
    eval_interval: int                   # --eval-interval
    eval_iters: int                      # --eval-iters: 0 = no validation
    exit_interval: Optional[int]         # --exit-interval: stop at a multiple of it
    divergence_threshold: Optional[float]  # --divergence-threshold: stop when the loss exceeds it
    cuda_graph: bool                     # --cuda-graph: replay each iteration's forward-backward as a CUDA graph


@dataclass(frozen=True)
class OptimizerSection:
    """Adam and the learning-rate schedule."""

    lr: float                            # --lr: peak learning rate
    min_lr: float                        # --min-lr
    lr_decay_style: str                  # --lr-decay-style
    lr_warmup_iters: int                 # --lr-warmup-iters
    lr_decay_iters: int                  # --lr-decay-iters (default: --train-iters)
    lr_warmup_samples: Optional[int]     # --lr-warmup-samples: with --train-samples
    lr_decay_samples: Optional[int]      # --lr-decay-samples: with --train-samples
    weight_decay: float                  # --weight-decay
    clip_grad: float                     # --clip-grad: gradient-norm clipping
    adam_beta1: float                    # --adam-beta1
    adam_beta2: float                    # --adam-beta2
    adam_eps: float                      # --adam-eps
    use_distributed_optimizer: bool      # --use-distributed-optimizer: shard optimizer state (GPU)


@dataclass(frozen=True)
class ParallelSection:
    """How the run is laid out over ranks, and activation recomputation."""

    tensor_model_parallel_size: int      # --tensor-model-parallel-size
    pipeline_model_parallel_size: int    # --pipeline-model-parallel-size
    context_parallel_size: int           # --context-parallel-size: 1 only
    expert_model_parallel_size: int      # --expert-model-parallel-size
    data_parallel_size: int              # world size / (tensor x pipeline)
    sequence_parallel: bool              # --sequence-parallel (Transformer Engine on a GPU)
    recompute_granularity: Optional[str]  # --recompute-granularity: full | selective
    recompute_method: Optional[str]      # --recompute-method: uniform | block
    recompute_num_layers: Optional[int]  # --recompute-num-layers


@dataclass(frozen=True)
class PrecisionSection:
    """Compute precision, and Megatron-LM's precision flags and files.

    The recipe they choose is built by ``run_config.build_precision``."""

    bf16: bool                           # --bf16
    fp16: bool                           # --fp16 (GPU)
    fp8_format: Optional[str]            # --fp8-format: alone real FP8 in Transformer Engine; with a recipe emulated
    fp8_recipe: Optional[str]            # --fp8-recipe: an emulated TE recipe
    fp8_margin: Optional[int]            # --fp8-margin: delayed scaling only
    fp8_amax_history_len: Optional[int]  # --fp8-amax-history-len: delayed scaling only
    fp8_amax_compute_algo: Optional[str]  # --fp8-amax-compute-algo: delayed scaling only
    tp_only_amax_red: bool               # --tp-only-amax-red: reduce amaxes over tensor-parallel ranks only
    no_fp8_wgrad: bool                   # --no-fp8-wgrad: wgrad GEMM operands not quantized
    fp4_format: Optional[str]            # --fp4-format: emulate FP4 (te-nvfp4)
    fp4_recipe: Optional[str]            # --fp4-recipe: nvfp4
    kitchen_config_file: Optional[str]   # --kitchen-config-file: a per-module precision file (path)
    te_precision_config_file: Optional[str]  # --te-precision-config-file: a per-module precision file (path)
    first_last_layers_bf16: bool         # --first-last-layers-bf16
    num_layers_at_start_in_bf16: Optional[int]  # --num-layers-at-start-in-bf16
    num_layers_at_end_in_bf16: Optional[int]    # --num-layers-at-end-in-bf16

    def compute(self) -> str:
        """The 16-bit or fp32 compute precision: bf16, fp16 or fp32."""
        return "bf16" if self.bf16 else "fp16" if self.fp16 else "fp32"


@dataclass(frozen=True)
class QuantSection:
    """The CUSTOM_QUANT_* variables as given (None: unset).

    Named in ``settings.variables.RECIPE_VARIABLES`` (field ``type`` is CUSTOM_QUANT_TYPE); the recipe
    readers parse them."""

    type: Optional[str] = None           # CUSTOM_QUANT_TYPE: a format or preset recipe
    scope: Optional[str] = None          # CUSTOM_QUANT_SCOPE: which GEMMs
    recipe: Optional[str] = None         # CUSTOM_QUANT_RECIPE: a recipe file (path)
    compile: Optional[str] = None        # CUSTOM_QUANT_COMPILE: torch.compile the quantizers
    kernels: Optional[str] = None        # CUSTOM_QUANT_KERNELS: auto | torch | compile | triton
    fusions: Optional[str] = None        # CUSTOM_QUANT_FUSIONS: auto | off
    accumulate: Optional[str] = None     # CUSTOM_QUANT_ACCUMULATE: te | exact


def quant_variable(name: str) -> str:
    """The variable of ``QuantSection`` field ``name``: type -> CUSTOM_QUANT_TYPE."""
    return RECIPE_PREFIX + name.upper()


@dataclass(frozen=True)
class CheckpointSection:
    """Saving and resuming."""

    save: Optional[str]                  # --save: checkpoint directory
    save_interval: Optional[int]         # --save-interval
    load: Optional[str]                  # --load: resume from this directory
    ckpt_step: Optional[int]             # --ckpt-step: the iteration to load (default: the latest)
    no_load_optim: bool                  # --no-load-optim: weights and iteration only
    no_load_rng: bool                    # --no-load-rng: fresh RNG states


@dataclass(frozen=True)
class OutputSection:
    """What the run writes besides checkpoints, and what it captures."""

    tensorboard_dir: Optional[str]       # --tensorboard-dir
    wandb_project: Optional[str]         # --wandb-project
    wandb_exp_name: Optional[str]        # --wandb-exp-name
    wandb_save_dir: Optional[str]        # --wandb-save-dir
    peak_tflops: Optional[float]         # --peak-tflops: one device's peak for MFU (default: the device table)
    tensor_inspect_config: Optional[str]  # --tensor-inspect-config: an nvdlfw-inspect config (path)


@dataclass(frozen=True)
class ActionSection:
    """What the command does instead of training."""

    check_args: bool                     # --check-args: check everything, then exit
    print_config: bool                   # --print-config: print this tree with its sources, then exit


SECTIONS: dict[str, type] = {
    "model": ModelSection, "moe": MoESection, "data": DataSection, "schedule": ScheduleSection,
    "optimizer": OptimizerSection, "parallel": ParallelSection, "precision": PrecisionSection,
    "checkpoint": CheckpointSection, "output": OutputSection, "action": ActionSection}
"""The sections the flags fill, by name; every flag destination is a field of exactly one."""


@dataclass(frozen=True)
class RunTree:
    """A run's whole configuration and, for each ``section.field``, where its value came from."""

    model: ModelSection
    moe: MoESection
    data: DataSection
    schedule: ScheduleSection
    optimizer: OptimizerSection
    parallel: ParallelSection
    precision: PrecisionSection
    checkpoint: CheckpointSection
    output: OutputSection
    action: ActionSection
    quant: QuantSection                  # CUSTOM_QUANT_*
    environment: Environment             # the launcher's variables and every CUSTOM_QUANT_*/TENSOR_SAVE_* as given
    notices: tuple[str, ...] = ()        # one line per Megatron-LM flag answered (ignored or adjusted)
    sources: Mapping[str, str] = field(default_factory=dict)  # "model.num_layers" -> "flag --num-layers"

    def flags(self) -> dict[str, Any]:
        """Every flag field by its destination name (what checkpoints keep as ``args``)."""
        return {f.name: getattr(section, f.name) for name in SECTIONS
                for section in [getattr(self, name)] for f in fields(section)}

    def shape(self, keys: Sequence[str]) -> dict[str, Any]:
        """The model fields ``keys`` name (``presets.SHAPE_KEYS``), from the model and MoE sections."""
        flags = self.flags()
        return {key: flags[key] for key in keys}
