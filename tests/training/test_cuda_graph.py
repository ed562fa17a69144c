"""``--cuda-graph`` (training/cuda_graph.py): what it cannot keep correct is refused in one line before
the run starts; its static input buffers (without them the checker finds the inputs moving); on the CPU
(no graph) its path trains bit for bit as the plain loop, delayed scaling's amax histories advancing each
step; and each preset's training step (megatron-core's schedule, the GPU's path), checked by
``training.graph_check``, is safe to graph but for stochastic rounding's noise key."""
import dataclasses

import pytest
import torch

from megatron.quant.layers.graph_safety import GraphSafety, replay_hazards_of
from megatron.quant.training.arguments import ArgumentError
from megatron.quant.training.cuda_graph import GraphedStep, phase, refusal
from megatron.quant.training.main import check_inputs, main
from tests.training.conftest import DELAYED_FLAGS

ARGV = ["--model", "llama-tiny", "--num-layers", "1", "--mock-data", "--seq-length", "32", "--micro-batch-size", "1",
        "--global-batch-size", "2", "--train-iters", "3", "--eval-iters", "0", "--lr", "1e-3", "--bf16", "--seed", "3"]
SCHEDULED = "format: bf16\nscope: [linear]\nschedule:\n  - {from: 2, forward: fp8_e4m3}\n"


@pytest.mark.parametrize("extra, env, named", [
    ([], {"CUSTOM_QUANT_TYPE": "te-nvfp4"}, "stochastic rounding: its noise key is a host integer"),
    ([], {"TENSOR_SAVE_ENABLED": "1", "TENSOR_SAVE_DIR": "{tmp}"}, "capture (TENSOR_SAVE_ENABLED"),
    ([], {"CUSTOM_QUANT_RECIPE": "{tmp}/scheduled.yaml"}, "a scheduled recipe"),
    (["--recompute-granularity", "selective"], {}, "--recompute-granularity selective"),
    (["--attention-dropout", "0.1"], {}, "--attention-dropout 0.1: megatron-core's random-state tracker"),
    (["--model", "llama-moe-tiny"], {}, "--num-experts"),
])
def test_what_a_graph_cannot_keep_correct_is_refused_in_one_line(clean_env, tmp_path, extra, env, named):
    (tmp_path / "scheduled.yaml").write_text(SCHEDULED)
    for key, value in env.items():
        clean_env.setenv(key, value.format(tmp=tmp_path))
    argv = [*ARGV, *extra]
    check_inputs(argv)  # without the flag the run is fine
    with pytest.raises(ArgumentError) as refused:
        check_inputs([*argv, "--cuda-graph"])
    message = str(refused.value)
    assert message.startswith("--cuda-graph cannot keep ") and named in message and "\n" not in message


@pytest.mark.parametrize("section, field, value, named", [
    ("parallel", "pipeline_model_parallel_size", 2, "--pipeline-model-parallel-size 2: "),
    ("precision", "fp16", True, "--fp16: megatron-core's dynamic loss scaler"),
])
def test_gpu_only_settings_are_refused(clean_env, section, field, value, named):
    """What the CPU refuses before (GPU-only settings), on the configuration a GPU would have."""
    inputs = check_inputs([*ARGV, "--cuda-graph"])
    tree = dataclasses.replace(inputs.tree, **{section: dataclasses.replace(getattr(inputs.tree, section),
                                                                            **{field: value})})
    assert refusal(inputs.tree, inputs.precision, capturing=False) is None
    assert refusal(tree, inputs.precision, capturing=False).startswith(f"--cuda-graph cannot keep {named}")


def test_the_trainer_refuses_before_the_run_starts(clean_env, capsys):
    clean_env.setenv("CUSTOM_QUANT_TYPE", "te-nvfp4")
    with pytest.raises(SystemExit) as exited:
        main([*ARGV, "--cuda-graph"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("megatron-quant-train: error: --cuda-graph cannot keep stochastic")


def test_a_gpu_warms_up_captures_once_then_replays():
    assert [phase(call, warmup=3, cuda=True) for call in range(1, 7)] == [
        "warm-up", "warm-up", "warm-up", "capture", "replay", "replay"]
    assert {phase(call, warmup=3, cuda=False) for call in range(1, 7)} == {"eager"}


def test_the_step_reads_its_micro_batches_from_static_buffers():
    seen = []

    def step(batches):
        seen.append([batch["tokens"] for batch in batches])
        return [batch["tokens"].sum() for batch in batches]

    graphed = GraphedStep(step, cuda=False)
    first = [{"tokens": torch.arange(4)}, {"tokens": torch.arange(4, 8)}]
    second = [{"tokens": torch.arange(10, 14)}, {"tokens": torch.arange(20, 24)}]
    assert [r.item() for r in graphed(first)] == [6, 22]
    assert [r.item() for r in graphed(iter(second))] == [46, 86]
    assert all(a is b for a, b in zip(*seen))  # the same buffers, refilled
    assert all(batch["tokens"] is not given["tokens"] for batch, given in zip(graphed.inputs, second))
    with pytest.raises(ValueError, match=r"^--cuda-graph: this iteration's micro-batches have shapes .*fixed shapes$"):
        graphed([{"tokens": torch.arange(5)}, {"tokens": torch.arange(5)}])


def test_the_static_buffers_keep_the_inputs_where_a_graph_reads_them():
    """A step fed each iteration's fresh micro-batches reads them at new addresses (a graph would read the
    captured ones); through ``GraphedStep`` it reads the same buffers every step."""
    weight = torch.randn(4, 4)
    records = []

    def step(batches):
        with GraphSafety() as mode:
            outputs = [batch["x"] @ weight for batch in batches]
        records.append(mode.record)
        return outputs

    def fresh(i):
        return [{"x": torch.full((2, 4), float(i))}]

    for i in range(2):
        step(fresh(i))
    assert [finding.kind for finding in replay_hazards_of(records)] == ["input moved"]
    records.clear()
    graphed = GraphedStep(step, cuda=False)
    for i in range(2):
        graphed(fresh(i))
    assert replay_hazards_of(records) == []


def _train(argv, graphed: bool):
    """Losses and final amax histories of a run through the loop (its --cuda-graph path or not)."""
    from megatron.quant.training import loop
    from megatron.quant.training.main import setup, teardown

    run, logger = setup(check_inputs(argv))
    try:
        history = loop.train(run, logger)
        assert isinstance(run.step_runner, GraphedStep) == graphed
        histories = {name: buffer.clone() for name, buffer in run.gpt.named_buffers() if "amax_history" in name}
    finally:
        logger.close()
        teardown(True)
    return [row["lm loss"] for row in history], histories


@pytest.mark.slow  # two 3-iteration runs of a one-layer llama-tiny (about 8 s)
def test_the_graph_path_trains_as_the_plain_loop_and_delayed_histories_advance(clean_env, capsys):
    argv = [*ARGV, *DELAYED_FLAGS]
    plain_losses, plain = _train(argv, graphed=False)
    capsys.readouterr()
    losses, histories = _train([*argv, "--cuda-graph"], graphed=True)
    assert "cuda graph: no GPU, so no graph: each iteration runs eagerly" in capsys.readouterr().out
    assert losses == plain_losses
    assert histories.keys() == plain.keys() and len(histories) > 0
    assert all(torch.equal(histories[name], plain[name]) for name in plain)
    # A forward weight's history gains one amax per step: after 3 steps its 3 entries are all filled
    # (dgrad reuses the forward's quantized weight: its own history is not consulted).
    weights = [name for name in histories if "fprop_weight" in name]
    assert weights and all(bool((histories[name] > 0).all()) for name in weights)


# The training step's own hazards: the Hopper accumulation model (te-fp8-current), delayed scaling's histories
# through megatron-core's schedule, stochastic rounding's keys (te-nvfp4) and te-nvfp4 rounding to nearest, what
# its refusal suggests; every preset's quantized layer is checked in tests/layers/test_graph_safety.py.
PRESETS = ("te-fp8-current", "te-fp8-delayed", "te-nvfp4", "te-nvfp4-no-sr")


@pytest.mark.slow  # three training iterations of a one-layer llama-tiny per preset (about 4 s each)
@pytest.mark.parametrize("preset", PRESETS)
def test_each_presets_training_step_is_graph_safe_but_for_stochastic_rounding(clean_env, preset):
    from megatron.quant.training.graph_check import check_training_steps

    clean_env.setenv("CUSTOM_QUANT_TYPE", preset)
    result = check_training_steps(ARGV)
    print(result.report())
    assert [record.lines() for record in result.records] == [[], []]  # no host sync, no data-dependent shape
    if preset == "te-nvfp4":
        assert {(finding.kind, _where(finding)) for finding in result.hazards} == {
            ("host value differs", ("megatron/quant/formats/random_bits.py", "uniform"))}
        assert not result.safe
    else:
        assert result.hazards == [] and result.safe


@pytest.mark.slow  # three training iterations of a one-layer llama-moe-tiny (about 5 s)
def test_the_mixture_of_experts_step_shows_why_it_is_refused(clean_env):
    """Today's list: megatron-core's token dispatch selects tokens by mask (data-dependent shapes) and the
    grouped experts make their row offsets from the per-expert counts on the host (values that change)."""
    from megatron.quant.training.graph_check import check_training_steps

    clean_env.setenv("CUSTOM_QUANT_TYPE", "te-mxfp8")
    result = check_training_steps(["--model", "llama-moe-tiny", *ARGV[2:]])
    print(result.report())
    assert {(finding.kind, finding.op, _where(finding)) for finding in result.records[0].findings} == {
        ("data-dependent shape", "masked_select", ("megatron/core/transformer/moe/moe_utils.py", "permute")),
        ("data-dependent shape", "masked_select",
         ("megatron/core/transformer/moe/token_dispatcher.py", "dispatch_postprocess"))}
    assert {(finding.kind, _where(finding)) for finding in result.hazards} == {
        ("host value differs", ("megatron/quant/layers/grouped_operand.py", "ends")),
        ("host value differs", ("megatron/quant/layers/grouped_operand.py", "padded_rows"))}


def _where(finding) -> tuple[str, str]:
    """(file, function) of a finding's place, without the line (which edits move)."""
    path, _, function = finding.place.partition(" ")
    return path.rsplit(":", 1)[0], function.strip("()")


def test_the_graph_check_refuses_too_few_iterations_in_one_line(clean_env, capsys):
    from megatron.quant.training import graph_check

    argv = [*ARGV[:ARGV.index("--train-iters")], "--train-iters", "2", *ARGV[ARGV.index("--train-iters") + 2:]]
    assert graph_check.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["graph check: error: --train-iters 2 is below the 2 steps checked and the one before them"]
