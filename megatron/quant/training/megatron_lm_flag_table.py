"""Megatron-LM's training flags, each with the trainer's answer: the one table ``megatron_lm_flags`` reads.

Read from Megatron-LM's ``megatron/training/arguments.py`` at its newest core release (tag core_v0.19.0,
commit 5be9626): every option string its parser defines (NVIDIA Kitchen's two included, which it adds where
Kitchen is installed). A block starts with ``KIND | CONCERN | TEXT``: ``honoured`` blocks list one flag a
line with its meaning (the trainer's own parser defines it);
``ignored`` and ``refused`` blocks list flags that share the reason or the way out. A flag's
suffix says what it takes: none, a switch; ``=``, one value; ``=+``, ``=*``, ``=?`` or ``=N``, values
as argparse's ``nargs`` counts them.
"""

MEGATRON_LM_RELEASE = "core_v0.19.0 (commit 5be9626)"

TABLE = """\
honoured | model |
--num-layers decoder layers
--hidden-size hidden size
--ffn-hidden-size the MLP's hidden size (SwiGLU: each of its two input projections)
--num-attention-heads attention heads
--group-query-attention grouped-query attention, with --num-query-groups key/value groups
--num-query-groups key/value head groups (with --group-query-attention)
--kv-channels the head width; must be --hidden-size / --num-attention-heads, as in Llama
--seq-length sequence length of a sample
--max-position-embeddings longest position RoPE covers (default: --seq-length)
--position-embedding-type rope only (Llama)
--rotary-base RoPE base
--rotary-percent share of each head RoPE rotates; 1.0 only (Llama)
--rope-scaling-factor Llama 3.1-style RoPE scaling factor
--normalization RMSNorm only (Llama)
--norm-epsilon RMSNorm epsilon
--swiglu the Llama MLP is always SwiGLU
--untie-embeddings-and-output-weights a separate output layer instead of the input embedding's transpose
--disable-bias-linear Llama linears never have a bias
--init-method-std standard deviation of the normal weight initialisation
--attention-dropout dropout after the attention softmax
--hidden-dropout dropout on the residual branches
honoured | mixture of experts |
--num-experts routed experts per MoE layer (none: a dense model)
--moe-router-topk experts per token, 1 to --num-experts (top-1 softmax routing turns --moe-router-pre-softmax on)
--moe-router-pre-softmax softmax over all experts before the top-k choice
--moe-ffn-hidden-size one expert's FFN size (default: --ffn-hidden-size)
--moe-shared-expert-intermediate-size the shared experts' total FFN size
--moe-layer-freq N (every N-th layer is MoE) or a 0/1 list per layer with at least one 1
--moe-router-score-function softmax or sigmoid
--moe-router-dtype the router's GEMM and softmax dtype
--moe-router-load-balancing-type aux_loss, seq_aux_loss or none
--moe-aux-loss-coeff the load-balancing loss's weight
--moe-token-dispatcher-type allgather, or alltoall on GPUs
--expert-model-parallel-size ranks the experts are spread over; divides --num-experts and the data-parallel size
honoured | precision |
--bf16 bf16 parameters and compute, fp32 master weights
--fp16 fp16 with dynamic loss scaling (GPUs)
--fp8-format e4m3 or hybrid: real FP8 in Transformer Engine on a GPU; emulated otherwise, or with --fp8-recipe
--fp8-recipe the emulated TE recipe: tensorwise, delayed, mxfp8 or blockwise (default with --fp8-format: delayed)
--fp8-margin delayed scaling's margin
--fp8-amax-history-len delayed scaling's amax history
--fp8-amax-compute-algo delayed scaling's amax choice: most_recent or max
--no-fp8-wgrad the wgrad GEMM's operands stay unquantized
--disable-fp8-wgrad the same as --no-fp8-wgrad
--fp4-format e2m1: emulated NVFP4 training
--fp4-recipe nvfp4
--first-last-layers-bf16 the first and last decoder layers stay unquantized
--num-layers-at-start-in-bf16 with --first-last-layers-bf16 (default 1)
--num-layers-at-end-in-bf16 with --first-last-layers-bf16 (default 1)
--te-precision-config-file per-module precision (docs/recipes.md)
--kitchen-config-file per-module precision (docs/recipes.md)
honoured | parallelism |
--tensor-model-parallel-size tensor parallelism
--pipeline-model-parallel-size pipeline parallelism (GPUs)
--sequence-parallel sequence parallelism (with tensor parallelism on GPUs; at TP 1 it is off, as in Megatron-LM)
--context-parallel-size 1 only: the trainer does not split sequences over ranks
--use-distributed-optimizer shards optimizer state over data-parallel ranks (GPUs; on CPU: the plain optimizer)
honoured | speed and memory |
--recompute-granularity full or selective activation recompute
--recompute-method uniform or block (with full)
--recompute-num-layers layers per recompute chunk or stage (with full)
honoured | optimizer and learning rate |
--lr peak learning rate
--min-lr learning rate at the end of the decay
--lr-decay-style constant, linear, cosine or inverse-square-root
--lr-decay-iters iterations the learning rate decays over (default: --train-iters)
--lr-decay-samples the same in samples (with --train-samples)
--lr-warmup-iters linear warm-up iterations
--lr-warmup-samples the same in samples (with --train-samples)
--weight-decay AdamW weight decay
--clip-grad global gradient-norm clip
--adam-beta1 Adam's beta1
--adam-beta2 Adam's beta2
--adam-eps Adam's epsilon
honoured | batch and run length |
--micro-batch-size samples per micro-batch
--global-batch-size samples per iteration (default: micro-batch x data-parallel size)
--train-iters iterations to train
--train-samples samples to train: --train-iters is this over --global-batch-size
--exit-interval stop (saving with --save) at a multiple of this iteration
--seed seed of weights, data order and dropout
honoured | data and tokenizer |
--data-path indexed dataset prefixes, optionally weighted
--split training, validation and test shares
--mock-data megatron-core's mock GPT dataset
--data-cache-path where dataset indexes are cached
--tokenizer-type ByteTokenizer, HuggingFaceTokenizer or NullTokenizer
--tokenizer-model a local Hugging Face tokenizer directory
--vocab-size vocabulary size (NullTokenizer, mock data)
--make-vocab-size-divisible-by vocabulary padding multiple
honoured | checkpoints |
--save checkpoint directory
--save-interval iterations between checkpoints
--persistent-save-interval the same as --save-interval
--load checkpoint directory to resume from
--ckpt-step the checkpoint iteration to load
--no-load-optim load weights and iteration only
--no-load-rng keep fresh random states
honoured | logging and profiling |
--log-interval iterations between log lines
--tensorboard-dir TensorBoard event directory
--wandb-project Weights & Biases project
--wandb-exp-name Weights & Biases run name
--wandb-save-dir Weights & Biases local directory
honoured | validation |
--eval-interval iterations between validations
--eval-iters validation iterations
ignored | batch and run length | give the run its length with --train-iters or --exit-interval (with --save it
    resumes with --load)
--exit-duration-in-mins= --exit-signal-handler --exit-signal= --exit-signal-handler-for-dataloader
--exit-signal-handler-for-training
refused | batch and run length | the trainer runs one --global-batch-size from the first iteration to the last:
    drop it
--rampup-batch-size=3 --step-batch-size-schedule= --decrease-batch-size-if-needed --iterations-to-skip=+ --batch-size=
--phase-transition-iterations=
ignored | checkpoints | Megatron-LM's checkpoint machinery (formats, async and parallel saves); the trainer
    always saves megatron-core torch_dist checkpoints in Megatron-LM's layout, synchronously
--save-retain-interval= --non-persistent-save-interval= --non-persistent-ckpt-type= --non-persistent-global-ckpt-dir=
--non-persistent-local-ckpt-dir= --non-persistent-local-ckpt-algo= --exit-on-missing-checkpoint --ckpt-format=
--auto-detect-ckpt-format --no-ckpt-fully-parallel-save --async-save --async-strategy= --use-persistent-ckpt-worker
--async-ckpt-cpu-priority= --async-ckpt-io-priority= --async-ckpt-use-cpu-shm --ckpt-fully-parallel-load
--ckpt-fully-parallel-load-exchange-algo= --ckpt-fully-parallel-save-process-group=
--ckpt-fully-parallel-load-process-group= --ckpt-assume-constant-structure --no-ckpt-load-validate-sharding-integrity
--disable-ckpt-load-validate-sharding-integrity --no-strict-fsdp-dtensor-load --disable-strict-fsdp-dtensor-load
--dist-ckpt-strictness= --dist-ckpt-save-pre-mcore-014 --dist-ckpt-optim-fully-reshardable
--distrib-optim-fully-reshardable-mem-efficient --replication --replication-jump= --replication-factor=
--verify-integrity --no-stream-ckpt-dequant --disable-stream-ckpt-dequant --no-save-optim --no-save-rng
--use-dist-ckpt --dist-ckpt-format= --dist-ckpt-workers= --ckpt-fully-parallel-save
refused | checkpoints | capture tensors with TENSOR_SAVE_* instead (docs/capture.md)
--save-params-interval= --save-activations-interval= --save-tokens-per-expert-interval= --save-wgrads-interval=
--save-dgrads-interval=
refused | checkpoints | changes what a checkpoint load means; use --load with --ckpt-step, --no-load-optim or
    --no-load-rng (docs/training.md#checkpoints-and-resume)
--override-opt_param-scheduler --override-opt-param-scheduler --use-checkpoint-opt_param-scheduler
--use-checkpoint-opt-param-scheduler --load-main-params-from-ckpt --finetune --pretrained-checkpoint=
--use-checkpoint-args --use-mp-args-from-checkpoint-args --no-use-tokenizer-model-from-checkpoint-args
--disable-use-tokenizer-model-from-checkpoint-args --ckpt-convert-format= --ckpt-convert-save=
--ckpt-convert-update-legacy-dist-opt-format --override-ckpt-iteration=
refused | cluster and fault tolerance | the trainer takes Megatron-LM's flags, not its YAML config: give them as flags
--yaml-cfg=
ignored | cluster and fault tolerance | cluster, restart and fault-tolerance machinery of Megatron-LM's
    launcher; the trainer runs under torchrun as it is
--deterministic-mode --check-weight-hash-across-dp-replicas-interval= --gpu-sniff-test-interval=
--train-sync-interval= --no-check-for-nan-in-loss-and-grad --check-for-large-grads --result-rejected-tracker-filename=
--nccl-communicator-config-path= --disable-gloo-process-groups --use-sharp --sharp-enabled-group=
--flight-recorder-dump-path= --flight-recorder-trace-buffer-size= --no-flight-recorder-dump-on-timeout
--disable-flight-recorder-dump-on-timeout --flight-recorder-include-stack-trace
--no-flight-recorder-include-only-active --disable-flight-recorder-include-only-active
--no-flight-recorder-extra-dump-on-exec --disable-flight-recorder-extra-dump-on-exec --disable-jit-fuser
--fake-process-group --adlr-autoresume --adlr-autoresume-interval= --straggler-ctrlr-port= --straggler-minmax-count=
--disable-straggler-on-startup --run-workload-inspector-server --enable-experimental --no-one-logger
--one-logger-project= --one-logger-run-name= --one-logger-async --app-tag-run-name= --app-tag-run-version=
--inprocess-restart --inprocess-max-iterations= --inprocess-monitor-thread-interval=
--inprocess-monitor-process-interval= --inprocess-progress-watchdog-interval= --inprocess-heartbeat-interval=
--inprocess-soft-timeout= --inprocess-hard-timeout= --inprocess-heartbeat-timeout= --inprocess-barrier-timeout=
--inprocess-completion-timeout= --inprocess-last-call-wait= --inprocess-termination-grace-time=
--inprocess-granularity= --inprocess-active-world-size= --inprocess-empty-cuda-cache --enable-ft-package
--calc-ft-timeouts --ft-num-warmup-iters= --error-injection-rate= --error-injection-type= --rerun-mode=
--check-for-spiky-loss --enable-msc --disable-msc --fault-injector-ranks= --fault-injector-num-ranks=
--fault-injector-fault-types= --fault-injector-fault-probabilities= --fault-injector-fault-delay=
--fault-injector-delay-start-iteration= --fault-injector-mtti-seconds= --fault-injector-offset-seconds=
--fault-injector-seed=
ignored | data and tokenizer | a data-loader setting that changes loading speed, not the samples: the trainer
    reads megatron-core's GPTDataset in the main process
--dataloader-type= --per-dataset-sequences-path= --dataloader-fast-cache-load --dataloader-defer-npy-index-mmap
--no-mmap-bin-files --num-workers= --dataloader-inter-document-masking --no-create-attention-mask-in-dataloader
--num-dataset-builder-threads= --object-storage-cache-path= --mid-level-dataset-surplus=
ignored | data and tokenizer | an option of a tokenizer the run does not use, or of tokenizer loading the
    trainer does itself
--vocab-extra-ids= --tokenizer-metadata= --tokenizer-special-tokens=+ --tiktoken-pattern=
--tiktoken-num-special-tokens= --tokenizer-sentencepiece-legacy --no-tokenizer-sentencepiece-ignore-extra-whitespaces
--disable-tokenizer-sentencepiece-ignore-extra-whitespaces --tokenizer-hf-no-use-fast
--tokenizer-hf-no-include-special-tokens --trust-remote-code --null-tokenizer-eod-id= --null-tokenizer-pad-id=
--chat-template=
refused | data and tokenizer | a data layout the trainer does not build; give --data-path (optionally weighted)
    or --mock-data with --split
--start-eval-at-iter= --eval-global-batch-size= --eval-micro-batch-size= --full-validation --multiple-validation-sets
--validation-set-names=+ --train-data-path=* --valid-data-path=* --test-data-path=* --data-args-path=
--per-split-data-args-path= --reset-position-ids --reset-attention-mask --eod-mask-loss --allow-ambiguous-pad-tokens
refused | data and tokenizer | a tokenizer the trainer does not build; use --tokenizer-type ByteTokenizer,
    HuggingFaceTokenizer (--tokenizer-model DIR) or NullTokenizer
--padded-vocab-size= --no-pad-vocab-size --disable-pad-vocab-size --vocab-file= --merge-file=
ignored | logging and profiling | a Megatron-LM logging option; the trainer logs loss, throughput, memory and
    time every --log-interval, and scalars to --tensorboard-dir
--moe-per-layer-logging --config-logger-dir= --log-params-norm --log-throughput --log-progress --timing-log-level=
--timing-log-option= --tensorboard-log-interval= --tensorboard-queue-size= --log-timers-to-tensorboard
--no-log-loss-scale-to-tensorboard --disable-log-loss-scale-to-tensorboard --log-validation-ppl-to-tensorboard
--log-memory-to-tensorboard --log-memory-interval= --log-device-memory-used --log-num-zeros-in-grad
--log-max-attention-logit --no-barrier-with-level-1-timing --log-world-size-to-tensorboard --wandb-entity=
--logging-level= --log-energy --moe-routing-trace-path= --moe-routing-trace-max-training-iters=
--moe-routing-trace-capture-logits --moe-routing-trace-capture-hidden-states --moe-routing-trace-dump-weights
--log-straggler
ignored | logging and profiling | profiling: run the trainer under nsys or torch.profiler yourself
--profile --profile-step-start= --profile-step-end= --use-pytorch-profiler --pytorch-profiler-collect-shapes
--pytorch-profiler-collect-callstack --pytorch-profiler-collect-chakra --profile-ranks=+ --record-memory-history
--memory-snapshot-path= --record-shapes --nvtx-ranges
refused | mixture of experts | an MoE variant the lab's router and SequentialMLP experts do not emulate: drop it
    (docs/training.md#mixture-of-experts)
--moe-apply-probs-on-input --moe-shared-expert-gate --use-grouped-gemm-for-shared-expert
--moe-shared-expert-glu-interleave-size= --moe-enable-routing-replay --moe-router-num-groups= --moe-router-group-topk=
--moe-router-topk-scaling-factor= --moe-router-enable-expert-bias --moe-router-bias-update-rate=
--moe-router-quantile-balancing-ema= --moe-router-force-load-balancing --moe-router-force-biased=
--moe-single-grouped-weight --moe-single-grouped-bias --moe-z-loss-coeff= --moe-input-jitter-eps=
--moe-expert-capacity-factor= --moe-pad-expert-input-to-capacity --moe-token-drop-policy= --moe-latent-size=
--moe-mlp-glu-interleave-size= --moe-expert-rank-capacity-factor= --moe-use-upcycling --moe-upcycling-granularity=
refused | mixture of experts | builds megatron-core's GroupedMLP (one weight for all experts), which has no
    emulated counterpart: drop it (the experts run as grouped GEMMs anyway, each with its own scales)
--moe-grouped-gemm
ignored | model | Llama's positions are always rotary (RoPE), with no learned position embedding
--use-rotary-position-embeddings --no-position-embedding
ignored | model | RMSNorm weights are stored as they are, not as an offset from 1: the same function at
    initialisation (weight decay pulls towards 0 rather than 1)
--apply-layernorm-1p
ignored | model | the lab's layers are the implementation (megatron-core's local modules with fake-quantized GEMMs)
--transformer-impl=
ignored | model | the model is always megatron-core's GPTModel
--use-mcore-models
ignored | model | the trainer builds its layers itself; --spec is for Megatron-LM's pretrain_gpt.py (docs/from-
    megatron-lm.md)
--spec=*
refused | model | a model feature Llama does not have; the trainer builds Llama models (dense or MoE): drop it
--mtp-standalone --mtp-num-layers= --mtp-loss-scaling-factor= --mtp-use-repeated-layer --mtp-detach-heads
--mtp-hybrid-override-pattern= --softmax-type= --apply-residual-connection-post-layernorm --add-qkv-bias
--glu-linear-offset= --activation-func-clamp-value= --rotary-interleaved --qk-layernorm --qk-l2-norm --qk-clip
--qk-clip-alpha= --qk-clip-threshold= --attention-output-gate --multi-latent-attention
--experimental-attention-variant= --dsa-indexer-n-heads= --dsa-indexer-head-dim= --dsa-indexer-topk=
--dsa-indexer-topk-freq= --dsa-indexer-skip-topk-offset= --dsa-indexer-loss-coeff= --dsa-indexer-use-sparse-loss
--dsa-kernel-backend= --dsa-indexer-rope-interleaved --no-dsa-indexer-rotate-activation
--disable-dsa-indexer-rotate-activation --no-dsa-indexer-scoring-relu --disable-dsa-indexer-scoring-relu
--dsa-indexer-k-norm-epsilon= --dsa-indexer-k-norm-fp32 --linear-conv-kernel-dim= --linear-key-head-dim=
--linear-value-head-dim= --linear-num-key-heads= --linear-num-value-heads= --use-mup --mup-width-mult=
--mup-base-hidden-size= --mup-embedding-mult= --mup-output-mult= --mup-base-head-dim= --mup-attn-scale-power=
--mrope-section=+ --is-hybrid-model --mamba-state-dim= --mamba-head-dim= --mamba-num-groups= --mamba-num-heads=
--disable-mamba-mem-eff-path --decoder-num-layers= --window-size= --window-attn-skip-freq=
--yarn-original-max-position-embeddings= --yarn-beta-fast= --yarn-beta-slow= --yarn-correction-range-round-to-int
--no-yarn-correction-range-round-to-int --relative-attention-num-buckets= --relative-attention-max-distance=
--rotary-seq-len-interpolation-factor= --use-rope-scaling --no-rope-freq= --openai-gelu --squared-relu --quick-geglu
--rope-type= --q-lora-rank= --kv-lora-rank= --qk-head-dim= --qk-pos-emb-head-dim= --v-head-dim=
--rotary-scaling-factor= --mscale= --mscale-all-dim= --cache-mla-latents --mla-down-proj-fusion
--linear-attention-freq= --heterogeneous-layers-config-path= --heterogeneous-layers-config-encoded-json=
--hybrid-layer-pattern= --hybrid-override-pattern=
refused | model | the trainer initialises every weight from a normal distribution of --init-method-std, as
    Megatron-LM's default: drop it
--no-initialization --embedding-init-method-std= --data-parallel-random-init --init-method-xavier-uniform
ignored | optimizer and learning rate | every sample is a full sequence with no masked token, so the per-token
    and per-micro-batch means are the same loss
--calculate-per-token-loss
ignored | optimizer and learning rate | the embedding and output layer train at --lr and --min-lr like every
    other parameter
--decoupled-lr= --decoupled-min-lr=
refused | optimizer and learning rate | a learning-rate schedule the trainer does not run; use --lr-decay-style
    constant, linear, cosine or inverse-square-root with --lr-warmup-iters
--lr-wsd-decay-style= --lr-wsd-decay-iters= --lr-wsd-decay-samples= --lr-warmup-fraction= --lr-warmup-init= --warmup=
refused | optimizer and learning rate | the trainer's optimizer is Adam(W) with --weight-decay, --adam-beta1/2
    and --adam-eps: drop it
--apply-wd-to-qk-layernorm --sgd-momentum= --muon-momentum= --muon-no-split-qkv --muon-nesterov --muon-scale-mode=
--muon-fp32-matmul-prec= --muon-coefficient-type= --muon-num-ns-steps= --muon-tp-mode= --muon-extra-scale-factor=
--muon-scalar-optimizer= --lion-beta1= --lion-beta2= --no-weight-decay-cond-type= --optimizer= --start-weight-decay=
--end-weight-decay= --weight-decay-incr-style= --freeze-all-layers
refused | other programs | belongs to another Megatron-LM program (inference, RL, vision, retrieval,
    distillation, fine-tuning); the trainer pretrains Llama: drop it or use that program
--moe-pad-experts-for-cuda-graph-inference --inference-cuda-graph-scope= --flash-decode --symmetric-ar-type=
--nccl-all-reduce-for-prefill --inference-fuse-tp-communication --inference-disable-triton-nvls-kernels
--inference-grouped-gemm-backend= --inference-moe-disable-fused-quant-kernels --inference-moe-token-dispatcher-type=
--mlp-chunks-for-prefill= --encoder-num-layers= --onnx-safe= --bert-no-binary-head --perform-rl-step
--rl-prompts-per-eval= --grpo-prompts-per-step= --grpo-group-size= --rl-generation-lag= --rl-submission-granularity=
--rl-consumption-granularity= --grpo-iterations= --grpo-clamp-eps-lower= --grpo-clamp-eps-upper= --grpo-kl-beta=
--grpo-entropy-term-weight= --grpo-filter-groups-with-same-reward --langrl-env-config= --rl-default-temperature=
--rl-default-top-p= --rl-default-top-k= --rl-offload-optimizer-during-inference --rl-kv-cache-management-mode=
--rl-persist-cuda-graphs --no-rl-persist-cuda-graphs --rl-partial-rollouts --no-rl-partial-rollouts
--rl-inference-logprobs-is-correction --no-rl-inference-logprobs-is-correction
--rl-importance-sampling-truncation-coef= --rl-use-sequence-packing --no-rl-use-sequence-packing
--rl-sequence-packing-max-sequences-per-bin= --rl-sequence-packing-algo= --rl-training-cuda-graphs
--no-rl-training-cuda-graphs --rl-inference-tensor-model-parallel-size= --rl-inference-pipeline-model-parallel-size=
--rl-inference-expert-model-parallel-size= --rl-inference-expert-tensor-model-parallel-size=
--rl-inference-model-unified-memory-level= --rl-offload-inference-model-weights-when-idle
--no-rl-offload-inference-model-weights-when-idle --refit-method= --rl-verify-model-weights-swap
--no-rl-verify-model-weights-swap --rl-skip-bos-token --no-rl-skip-bos-token --rl-profile --rl-profile-dir=
--rl-inference-parsers=* --inference-rng-tracker --skip-train --test-mode --encoder-seq-length= --decoder-seq-length=
--sample-rate= --mask-prob= --short-seq-prob= --fim-data --fim-rate= --fim-spm-rate= --fim-split-sample=
--fim-fragment-rate= --fim-no-prefix= --fim-prefix-token= --fim-middle-token= --fim-suffix-token= --fim-pad-token=
--fim-eod-token= --ict-head-size= --biencoder-projection-dim= --biencoder-shared-query-context-model --ict-load=
--bert-load= --titles-data-path= --query-in-block-prob= --use-one-sent-docs --evidence-data-path=
--retriever-report-topk-accuracies=+ --retriever-score-scaling --block-data-path= --embedding-path=
--indexer-batch-size= --indexer-log-interval= --num-classes= --img-h= --img-w= --num-channels= --patch-dim=
--classes-fraction= --data-per-class-fraction= --no-data-sharding --head-lr-mult= --vision-pretraining
--vision-pretraining-type= --vision-backbone-type= --swin-backbone-type= --mask-type= --mask-factor= --iter-per-epoch=
--dino-local-img-size= --dino-local-crops-number= --dino-head-hidden-size= --dino-bottleneck-size=
--dino-freeze-last-layer= --dino-norm-last-layer --dino-warmup-teacher-temp= --dino-teacher-temp=
--dino-warmup-teacher-temp-epochs= --logits-save-top-k= --logits-save-top-p= --logits-save-top-p-min-k=
--logits-save-dir= --logits-save-dtype= --logits-load-dir= --logits-load-decode-threads=
--logits-load-prefetch-factor= --logits-load-msc-prefetch-depth= --logits-load-kd-loss-alpha=
--logits-load-ignore-errors --inference-batch-times-seqlen-threshold= --max-tokens-to-oom= --output-bert-embeddings
--bert-embedder-type= --use-legacy-static-engine --inference-max-requests= --inference-max-seq-length=
--inference-dynamic-batching --inference-dynamic-batching-buffer-size-gb=
--inference-dynamic-batching-paused-buffer-size-gb= --inference-dynamic-batching-mamba-memory-ratio=
--inference-dynamic-batching-block-size= --inference-dynamic-batching-max-requests=
--inference-dynamic-batching-max-tokens= --inference-dynamic-batching-num-cuda-graphs=
--inference-dynamic-batching-track-paused-request-events --inference-dynamic-batching-track-generated-token-events
--decode-only-cuda-graphs --inference-cuda-graph-all-prefills --inference-cuda-graph-max-tokens=
--inference-dynamic-batching-unified-memory-level= --enable-chunked-prefill --num-speculative-tokens=
--inference-dynamic-batching-prefix-caching --no-inference-dynamic-batching-prefix-caching
--inference-dynamic-batching-prefix-caching-eviction-policy=
--inference-dynamic-batching-prefix-caching-coordinator-policy=
--inference-dynamic-batching-prefix-caching-routing-alpha= --inference-dynamic-batching-prefix-caching-mamba-gb=
--inference-dynamic-batching-cuda-graph-mixed-prefill-count=
--inference-dynamic-batching-cuda-graph-sizing-distribution= --inference-dynamic-batching-sampling-backend=
--use-same-sampling-seed-across-dp-ranks --inference-dynamic-batching-async-sched-mode=
--inference-dynamic-batching-logprobs-mode= --inference-logging-step-interval= --inference-text-gen-server-logging
--no-inference-text-gen-server-logging --inference-wandb-logging --no-inference-wandb-logging
--inference-coordinator-port= --mamba-inference-conv-states-dtype= --mamba-inference-ssm-states-dtype=
--inference-use-synchronous-zmq-collectives --no-inference-use-synchronous-zmq-collectives
--inference-disable-ep-consensus --no-inference-disable-ep-consensus --inference-shards= --sft
--sft-tokenizer-prompt-format=
ignored | parallelism | the backend follows the device: nccl on GPUs, gloo on CPU
--distributed-backend=
ignored | parallelism | torchrun's defaults: the trainer reads its rank from the environment
--distributed-timeout-minutes= --local-rank= --lazy-mpu-init --distributed-timeout-seconds-after-init=
refused | parallelism | a parallel layout the trainer does not run; use --tensor-model-parallel-size,
    --pipeline-model-parallel-size and --expert-model-parallel-size
--tensor-parallel-num-weight-shards= --hierarchical-context-parallel-sizes=+ --max-seqlen-per-dp-cp-rank=
--hybrid-context-parallel --expert-tensor-parallel-size= --expert-tensor-parallel-num-weight-shards=
--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split --use-megatron-fsdp --use-torch-fsdp2
--decoder-first-pipeline-num-layers= --decoder-last-pipeline-num-layers= --pipeline-model-parallel-layout=
--model-parallel-size= --num-layers-per-virtual-pipeline-stage= --num-virtual-stages-per-pipeline-rank=
--data-parallel-sharding-strategy= --outer-dp-sharding-strategy= --enable-full-sharding-in-hsdp
--num-distributed-optimizer-instances= --torch-fsdp2-no-reshard-after-forward --cp-comm-type=+
--megatron-fsdp-main-params-dtype= --megatron-fsdp-main-grads-dtype= --megatron-fsdp-grad-comm-dtype=
--megatron-fsdp-enable-fine-grained-param-gather --megatron-fsdp-max-pool-double-buffer
--fsdp-db-use-persist-buf-on-alloc-fail
ignored | precision | gradients are reduced and accumulated in fp32 and master weights are fp32, as the trainer
    always does
--grad-reduce-in-bf16 --attention-softmax-in-fp32 --accumulate-allreduce-grads-in-fp32
ignored | precision | parameters are gathered in bf16: an emulated recipe quantizes each GEMM operand where it
    is used
--reuse-grad-buf-for-mxfp8-param-ag --keep-fp8-transpose-cache --fp4-param-gather --fp8-param-gather
refused | precision | NVIDIA Kitchen's numbered recipes; give the recipe in --kitchen-config-file or CUSTOM_QUANT_TYPE
--kitchen-recipe-number=
refused | precision | a precision path the lab does not emulate; choose the format with
    --fp8-recipe/--fp4-format, CUSTOM_QUANT_TYPE or a recipe file (docs/recipes.md)
--fp32-residual-connection --apply-query-key-layer-scaling --fp8-quantizer-factory= --fp8-interval= --fp8-output-proj
--use-kitchen-attention --kitchen-attention-backend= --fp4-quantizer-factory= --loss-scale= --initial-loss-scale=
--min-loss-scale= --loss-scale-window= --hysteresis= --fp16-lm-cross-entropy --mamba-training-ssm-states-dtype=
--use-precision-aware-optimizer --main-grads-dtype= --main-params-dtype= --exp-avg-dtype= --exp-avg-sq-dtype=
ignored | speed and memory | a speed or memory setting of Megatron-LM's kernels, communication or scheduling;
    the lab's layers compute the same values without it
--pipeline-model-parallel-comm-backend= --use-cpu-initialization --tp-comm-overlap --no-tp-comm-bulk-wgrad
--disable-tp-comm-bulk-wgrad --no-tp-comm-bulk-dgrad --disable-tp-comm-bulk-dgrad --no-tp-comm-overlap-ag
--disable-tp-comm-overlap-ag --no-tp-comm-overlap-rs --disable-tp-comm-overlap-rs --tp-comm-overlap-rs-dgrad
--no-tp-comm-split-ag --disable-tp-comm-split-ag --no-tp-comm-split-rs --disable-tp-comm-split-rs
--cross-entropy-loss-fusion --cross-entropy-fusion-impl= --tp-comm-bootstrap-backend=
--overlap-moe-expert-parallel-comm --delay-wgrad-compute --overlap-dispatch-backward-with-experts-wgrad
--ep-overlap-early-attn-memory-release --use-ring-exchange-p2p --defer-embedding-wgrad-compute --wgrad-deferral-limit=
--overlap-p2p-communication-warmup-flush --microbatch-group-size-per-virtual-pipeline-stage=
--cpu-offloading-num-layers= --cpu-offloading-retain-pinned-cpu-buffers --init-model-with-meta-device
--disable-bf16-reduced-precision-matmul --use-fused-weighted-squared-relu --fused-residual-rmsnorm
--use-transformer-engine-op-fuser --distribute-saved-activations --recompute-modules=+ --high-priority-a2a-comm-stream
--moe-shared-expert-overlap --moe-router-padding-for-quantization --moe-router-padding-for-fp8
--use-grouped-gemm-for-dense-mlp --moe-enable-deepep --moe-flex-dispatcher-backend= --moe-permute-fusion-into-hybridep
--moe-hybridep-pad-uneven-dispatch-inputs --moe-layer-recompute --moe-permute-fusion --moe-router-fusion
--moe-flex-dispatcher-num-sms= --moe-deepep-num-sms= --moe-hybridep-num-sms= --moe-hybridep-num-blocks-permute=
--moe-hybridep-num-blocks-unpermute= --moe-hybridep-num-sms-preprocessing= --moe-ncclep-static-shape
--moe-ncclep-zero-copy --enable-cuda-graph --cuda-graph-warmup-steps= --external-cuda-graph --cuda-graph-impl=
--no-clone-scatter-output-in-embedding --disable-clone-scatter-output-in-embedding --batch-invariant-mode
--use-te-activation-func --mlp-chunks-for-training= --fine-grained-activation-offloading --offload-modules=+
--min-offloaded-tensor-size= --delay-offload-until-cuda-graph --delta-offload-bytes-across-pp-ranks=
--activation-offload-fraction= --moe-paged-stash --moe-paged-stash-page-size=
--moe-paged-stash-buffer-size-factor-cuda= --moe-paged-stash-buffer-size-factor-cpu=
--fine-grained-offloading-max-inflight-offloads= --empty-unused-memory-level= --manual-gc --manual-gc-interval=
--no-manual-gc-eval --disable-manual-gc-eval --recompute-activations --tp-comm-overlap-cfg= --checkpoint-activations
--no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-swiglu-fusion --no-bias-dropout-fusion --no-rope-fusion
--optimizer-cpu-offload --optimizer-cuda-graph --optimizer-offload-fraction= --use-torch-optimizer-for-cpu-offload
--overlap-cpu-optimizer-d2h-h2d --dump-param-to-param-group-map= --no-pin-cpu-grads --no-pin-cpu-params
--no-persist-layer-norm --no-gradient-accumulation-fusion --te-rng-tracker --no-align-grad-reduce
--disable-align-grad-reduce --use-tp-pp-dp-mapping --high-priority-stream-groups=+ --no-overlap-p2p-communication
--overlap-grad-reduce --ddp-num-buckets= --ddp-bucket-size= --ddp-pad-buckets-for-high-nccl-busbw
--ddp-reduce-scatter-with-fp32-accumulation --ddp-param-name-patterns-for-fp32-local-accumulation=+
--ddp-average-in-collective --overlap-param-gather --overlap-param-gather-with-optimizer-step --no-align-param-gather
--no-use-layer-wise-param-layout --use-nccl-ub --disable-symmetric-registration --fsdp-manual-registration
--create-all-gather-group --no-gradient-reduce-div-fusion --fsdp-double-buffer --suggested-communication-unit-size=
--cuda-graph-scope=+ --cuda-graph-modules=+
ignored | speed and memory | attention runs in megatron-core's local attention or PyTorch SDPA, chosen by
    CUSTOM_QUANT_FUSIONS (docs/training.md#cpu-and-gpu)
--attention-backend= --flash-attention-version= --use-flash-attn
"""
