"""The MoE model trains: bad MoE settings stop at start in one line naming the value; the tiny MoE preset
trains with capture, the router records each expert's load, sites name experts globally, and the report
draws the load beside each expert's quantization; parameters and FLOPs count every expert and the
top-k active ones (written out by hand)."""
import json

import pytest

from megatron.quant.analysis.captures.families import resolve
from megatron.quant.analysis.captures.pipeline import ReportOptions, run_report
from megatron.quant.lab import sweep
from megatron.quant.tensor_saver import expert_index
from megatron.quant.training import metrics
from megatron.quant.training.arguments import ArgumentError
from megatron.quant.training.main import check_inputs, main
from megatron.quant.training.model import transformer_config
from megatron.quant.training.moe import moe_run_fields
from megatron.quant.training.presets import get_preset

TINY_MOE = ["--model", "llama-moe-tiny", "--mock-data", "--train-iters", "2"]


@pytest.mark.parametrize("flags, message", [
    (["--moe-router-topk", "5"], "--moe-router-topk 5 must be between 1 and --num-experts 4"),
    (["--expert-model-parallel-size", "3"], "--expert-model-parallel-size 3 does not divide --num-experts 4"),
    (["--expert-model-parallel-size", "2"], "--expert-model-parallel-size 2 does not divide the data-parallel size 1"),
    (["--moe-grouped-gemm"], r"--moe-grouped-gemm \(Megatron-LM\) is refused: builds megatron-core.s GroupedMLP"),
    (["--moe-token-dispatcher-type", "alltoall"], "alltoall needs a GPU"),
    (["--moe-layer-freq", "[0,1,1]"], "--moe-layer-freq lists 3 layers; the model has --num-layers 2"),
], ids=["topk", "ep_experts", "ep_data", "grouped", "alltoall", "layer_freq"])
def test_bad_moe_settings_stop_at_start_in_one_line(clean_env, flags, message):
    with pytest.raises(ArgumentError, match=message) as error:
        check_inputs(TINY_MOE + flags)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("flags, message", [
    (["--moe-layer-freq", "[0,0]"], r"--moe-layer-freq \[0, 0\] makes no layer MoE; allowed: at least one 1"),
    (["--num-experts", "0"], "--num-experts must be positive, got 0"),
], ids=["layer_freq_without_moe", "zero_experts"])
def test_moe_settings_megatron_core_would_take_wrongly_stop_at_start(clean_env, flags, message):
    with pytest.raises(ArgumentError, match=message) as error:
        check_inputs(TINY_MOE + flags)
    assert "\n" not in str(error.value)


def test_top1_softmax_routing_turns_pre_softmax_on_and_megatron_core_takes_it(clean_env, capsys):
    """megatron-core demands --moe-router-pre-softmax for top-1 softmax routing; the trainer turns it on (a notice)
    and passes it on, where it had stopped the run after --check-args passed."""
    inputs = check_inputs(TINY_MOE + ["--moe-router-topk", "1"])
    assert inputs.tree.moe.moe_router_pre_softmax
    assert any(n.startswith("--moe-router-pre-softmax turned on for top-1") for n in inputs.tree.notices)
    config = transformer_config(inputs.shape, moe_run=moe_run_fields(inputs.tree))
    assert (config.moe_router_topk, config.moe_router_pre_softmax) == (1, True)
    explicit = check_inputs(TINY_MOE + ["--moe-router-pre-softmax"])
    assert explicit.tree.moe.moe_router_pre_softmax and not explicit.tree.notices
    assert transformer_config(explicit.shape, moe_run=moe_run_fields(explicit.tree)).moe_router_pre_softmax


def test_a_router_rule_for_a_dense_model_stops_at_start_naming_its_source(clean_env, tmp_path):
    recipe = tmp_path / "router8.yaml"
    recipe.write_text("format: mxfp8\nrules:\n  - match: {roles: [router]}\n    format: mxfp8\n")
    clean_env.setenv("CUSTOM_QUANT_RECIPE", str(recipe))
    with pytest.raises(ValueError, match=r"CUSTOM_QUANT_RECIPE.*recipe 'router8' has a rule for the MoE router, but "
                                         r"the model is dense \(no --num-experts\)"):
        check_inputs(["--model", "llama-tiny", "--mock-data", "--train-iters", "1"])


def test_a_router_recipe_the_lab_cannot_emulate_stops_at_start(clean_env, tmp_path):
    recipe = tmp_path / "router8.yaml"
    recipe.write_text("format: mxfp8\nrules:\n  - match: {roles: [router]}\n    format: mxfp8\n")
    clean_env.setenv("CUSTOM_QUANT_RECIPE", str(recipe))
    with pytest.raises(ValueError, match="quantizes the MoE router, but moe_router_dtype 'fp64'"):
        check_inputs(TINY_MOE + ["--moe-router-dtype", "fp64"])
    assert check_inputs(TINY_MOE + ["--moe-router-dtype", "fp32"]).precision.configs["router8"].quantizes_router(2)


def test_moe_parameters_and_flops_count_every_expert_and_the_active_ones():
    shape = get_preset("llama-moe-tiny")
    h, experts, topk, ffn, shared, layers = 128, 4, 2, 128, 128, 2
    attention = h * (h + 2 * 64) + h * h + 2 * h  # qkv (2 of 4 heads' width for k and v), proj, two norms
    mlp_params = experts * 3 * h * ffn + 3 * h * shared + h * experts
    assert metrics.num_parameters(shape) == 512 * h + layers * (attention + mlp_params) + h
    tokens = 10
    mlp_flops = 2 * tokens * (topk * 3 * h * ffn + 3 * h * shared + h * experts)
    dense = metrics.forward_gemm_flops({**shape, "num_experts": None}, tokens=tokens, seq_length=5, vocab_size=512)
    moe = metrics.forward_gemm_flops(shape, tokens=tokens, seq_length=5, vocab_size=512)
    assert moe - dense == layers * (mlp_flops - 2 * tokens * 3 * h * 256)  # the dense MLP: ffn_hidden_size 256


@pytest.mark.slow
def test_tiny_moe_trains_with_capture_and_the_report_draws_expert_load(clean_env, tmp_path):
    for key, value in {"CUSTOM_QUANT_TYPE": "mxfp8", "TENSOR_SAVE_ENABLED": "1", "TENSOR_SAVE_DIR": str(tmp_path),
                       "TENSOR_SAVER_ITERATION": "1", "TENSOR_SAVE_ROLES": "fc1,router", "TENSOR_SAVE_LAYERS": "1",
                       "TENSOR_SAVE_TENSORS": "input,tokens_per_expert"}.items():
        clean_env.setenv(key, value)
    history = main(TINY_MOE + ["--seq-length", "32", "--micro-batch-size", "2", "--eval-iters", "0",
                               "--moe-router-dtype", "fp32", "--moe-aux-loss-coeff", "0.01"])
    assert len(history) == 2 and all(row["lm loss"] == row["lm loss"] for row in history)
    records = [json.loads(line)["metadata"] for line in (tmp_path / "mxfp8" / "manifest-rank00.jsonl").open()]
    modules = {r["module"] for r in records}
    assert {f"decoder.layers.1.mlp.experts.{e}.linear_fc1" for e in range(4)} < modules
    assert "decoder.layers.1.mlp.shared_experts.linear_fc1" in modules
    [load] = [r for r in records if r["tensor_name"] == "tokens_per_expert"]
    assert load["module"] == "decoder.layers.1.mlp.router" and load["shape"] == [4]
    assert load["stats"]["mean"] * 4 == 2 * 32 * 2  # every token slot of the micro-batch: tokens x top-2
    tokens = {expert_index(r["module"]): r["shape"][0] for r in records
              if r["tensor_name"] == "input" and ".experts." in r["module"]}
    assert len(tokens) == 4 and sum(tokens.values()) == 2 * 32 * 2  # each expert's fc1 saw its routed tokens
    result = run_report(ReportOptions(tmp_path, tmp_path / "draw", resolve(["experts"]), progress=False))
    assert result.figures == ("experts/mxfp8_load_and_error.png",) and not result.failed


@pytest.mark.slow
def test_a_toy_moe_sweep_trains_the_deepseek_recipe(clean_env, tmp_path):
    out = tmp_path / "sweep"
    flags = ["--model", "llama-moe-tiny", "--mock-data", "--train-iters", "1", "--seq-length", "32",
             "--micro-batch-size", "2", "--eval-iters", "0", "--moe-router-dtype", "fp32"]
    assert sweep.main([str(out), "deepseek-v3-fp8", "--", *flags]) == 0
    assert json.loads((out / "deepseek-v3-fp8" / "run.json").read_text())["status"] == "finished"


def test_a_study_plan_takes_an_moe_preset(clean_env, tmp_path):
    from pathlib import Path

    import yaml

    from megatron.quant.lab.study_plan import parse_plan

    path = Path(__file__).resolve().parents[2] / "docs" / "study" / "plan.yaml"
    raw = dict(yaml.safe_load(path.read_text()), model={"preset": "llama-moe-tiny", "seq_length": 128})
    plan = parse_plan(raw, path)
    assert plan.non_embedding_parameters == metrics.num_parameters(get_preset("llama-moe-tiny")) - 512 * 128
    assert plan.flops_per_iteration == metrics.flops_per_iteration(
        get_preset("llama-moe-tiny"), global_batch_size=plan.global_batch_size, seq_length=128, vocab_size=512)
    flags = [*plan.model_flags(), "--mock-data", "--train-iters", "1", "--save", str(tmp_path)]
    assert check_inputs(flags).shape["num_experts"] == 4
