"""Megatron-LM argument names, presets under explicit flags, and clear refusals of bad input."""
import subprocess

import pytest

from megatron.quant.training.arguments import ArgumentError, parse_args, validate_args
from megatron.quant.training.main import main
from megatron.quant.training.presets import PRESETS

TINY = ["--model", "llama-tiny", "--mock-data", "--train-iters", "2"]


def test_presets_have_published_shapes():
    one_b, eight_b = PRESETS["llama3.2-1b"], PRESETS["llama3.1-8b"]
    assert ((one_b["num_layers"], one_b["hidden_size"], one_b["ffn_hidden_size"], one_b["num_attention_heads"],
             one_b["num_query_groups"], one_b["vocab_size"], one_b["rotary_base"])
            == (16, 2048, 8192, 32, 8, 128256, 500000.0))
    assert not one_b["untie_embeddings_and_output_weights"]
    assert (eight_b["num_layers"], eight_b["hidden_size"], eight_b["ffn_hidden_size"], eight_b["num_attention_heads"],
            eight_b["num_query_groups"]) == (32, 4096, 14336, 32, 8)
    assert eight_b["untie_embeddings_and_output_weights"]


def test_tiny_preset_shards_in_multiples_of_64_at_tp2():
    tiny = PRESETS["llama-tiny"]
    head_dim = tiny["hidden_size"] // tiny["num_attention_heads"]
    for dim in (tiny["hidden_size"], tiny["ffn_hidden_size"], tiny["num_query_groups"] * head_dim,
                tiny["num_attention_heads"] * head_dim, tiny["vocab_size"]):
        assert (dim // 2) % 64 == 0, dim


def test_explicit_flags_override_the_preset():
    args = validate_args(parse_args(TINY + ["--hidden-size", "512", "--num-query-groups", "4"]), 1, cuda=False)
    assert (args.hidden_size, args.num_query_groups, args.num_layers) == (512, 4, PRESETS["llama-tiny"]["num_layers"])


def test_derived_batch_values():
    args = validate_args(parse_args(TINY + ["--micro-batch-size", "2", "--global-batch-size", "8"]), 2, cuda=False)
    assert (args.data_parallel_size, args.num_microbatches) == (2, 2)


def test_training_config_takes_the_checked_flags():
    from dataclasses import FrozenInstanceError

    from megatron.quant.training.config import TrainingConfig

    args = validate_args(parse_args(TINY + ["--global-batch-size", "4", "--save", "ckpt", "--eval-iters", "0"]),
                         2, cuda=False)
    config = TrainingConfig.from_flags(vars(args))
    assert (config.train_iters, config.global_batch_size, config.num_microbatches, config.save, config.eval_iters,
            config.save_interval) == (2, 4, 2, "ckpt", 0, None)
    with pytest.raises(FrozenInstanceError):
        config.train_iters = 3


@pytest.mark.parametrize("extra, world, message", [
    (["--micro-batch-size", "4", "--global-batch-size", "6"], 1, "--global-batch-size 6 is not divisible"),
    (["--micro-batch-size", "1", "--global-batch-size", "3"], 2, "data-parallel size 2"),
    (["--tensor-model-parallel-size", "2"], 3, "world size 3"),
    (["--tensor-model-parallel-size", "3"], 3, "must divide --num-attention-heads"),
    (["--hidden-size", "250"], 1, "--hidden-size 250 is not divisible by --num-attention-heads"),
    (["--seq-length", "4096"], 1, "exceeds --max-position-embeddings"),
    (["--tensor-model-parallel-size", "2", "--sequence-parallel"], 2, "Transformer Engine"),
    (["--pipeline-model-parallel-size", "2"], 2, "pipeline schedules are CUDA-only"),
    (["--fp16"], 1, "use --bf16 on CPU"),
    (["--bf16", "--fp16"], 1, "mutually exclusive"),
    (["--data-path", "x"], 1, "exactly one of --data-path"),
    (["--lr", "1e-4", "--min-lr", "1e-3"], 1, "--min-lr"),
    (["--save-interval", "5"], 1, "--save-interval needs --save"),
    (["--normalization", "LayerNorm"], 1, "Llama uses RMSNorm"),
    (["--recompute-method", "uniform"], 1, "--recompute-num-layers need --recompute-granularity full"),
    (["--recompute-num-layers", "1"], 1, "need --recompute-granularity full"),
    (["--recompute-granularity", "full"], 1, "full needs --recompute-method {uniform,block}"),
    (["--recompute-granularity", "full", "--recompute-method", "block"], 1, "--recompute-num-layers between 1 and"),
    (["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "99"], 1,
     "got 99"),
    (["--recompute-granularity", "selective", "--recompute-method", "block"], 1,
     "--recompute-method block is not supported with --recompute-granularity selective"),
    (["--recompute-granularity", "selective", "--recompute-num-layers", "1"], 1, "--recompute-num-layers 1 must not"),
])
def test_inconsistent_arguments_are_refused(extra, world, message):
    with pytest.raises(ArgumentError, match=message.replace("(", r"\(").replace("+", r"\+")):
        validate_args(parse_args(TINY + extra), world, cuda=False)


def test_recompute_flags_reach_megatron_cores_config():
    from megatron.quant.training.model import transformer_config
    from megatron.quant.training.presets import get_preset

    flags = ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"]
    args = validate_args(parse_args(TINY + flags), 1, cuda=False)
    config = transformer_config(get_preset("llama-tiny"), recompute_granularity=args.recompute_granularity,
                                recompute_method=args.recompute_method, recompute_num_layers=args.recompute_num_layers)
    assert (config.recompute_granularity, config.recompute_method, config.recompute_num_layers) == ("full", "block", 1)
    assert validate_args(parse_args(TINY + ["--recompute-granularity", "selective"]), 1, cuda=False)


def test_shape_is_required_without_a_preset():
    with pytest.raises(ArgumentError, match="--num-layers is required"):
        validate_args(parse_args(["--mock-data", "--train-iters", "1"]), 1, cuda=False)


def test_unknown_argument_and_preset_exit_with_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(TINY + ["--num-layer", "3"])
    assert exc.value.code == 2 and "unrecognized arguments: --num-layer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--model", "llama-huge", "--train-iters", "1"])
    assert "llama3.2-1b" in capsys.readouterr().err


def test_main_reports_bad_input_in_one_line(capsys, monkeypatch):
    with pytest.raises(SystemExit) as exc:
        main(TINY + ["--global-batch-size", "3", "--micro-batch-size", "2"])
    assert exc.value.code == 2
    assert "error: --global-batch-size 3 is not divisible" in capsys.readouterr().err
    monkeypatch.setenv("CUSTOM_QUANT_TYPE", "hifp9")
    with pytest.raises(SystemExit):
        main(TINY)
    err = capsys.readouterr().err
    assert "hifp9" in err and "hifp8" in err


def test_dtype_fp8_without_transformer_engine_emulates_megatron_lms_default_recipe(capsys):
    """The launch scripts' DTYPE=fp8 (--bf16 --fp8-format hybrid) on CPU: Megatron-LM's default --fp8-recipe
    delayed, emulated, said in one notice at start."""
    assert main([*TINY, "--bf16", "--fp8-format", "hybrid", "--check-args"]) == []
    out = capsys.readouterr().out
    assert "notice: --fp8-format hybrid without Transformer Engine on a GPU: emulated with Megatron-LM's default " \
           "--fp8-recipe delayed" in out


def test_launch_script_needs_five_positionals():
    result = subprocess.run(["bash", "examples/llama/train_llama31_8b_h100_fp8.sh", "only", "two"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "CHECKPOINT_DIR TENSORBOARD_DIR TOKENIZER DATA_PATH DTYPE" in result.stderr


def test_hf_checkpoint_sets_the_shape_including_query_groups(hf_models):
    path = hf_models["untied_llama3_rope"][0]
    args = validate_args(parse_args(["--hf-checkpoint", path, "--mock-data", "--train-iters", "1"]), 1, cuda=False)
    assert (args.num_layers, args.hidden_size, args.num_attention_heads, args.num_query_groups) == (2, 256, 4, 2)
    assert args.untie_embeddings_and_output_weights and args.rope_scaling_factor == 8.0
    with pytest.raises(SystemExit):
        parse_args(["--hf-checkpoint", path, "--model", "llama-tiny", "--train-iters", "1"])
