"""Activation recompute (megatron-core's full and selective granularity) changes no bit: the loss
and every gradient equal the run without recompute, for a round-to-nearest, a stochastic-rounding
and a delayed-scaling recipe, at TP=1 and TP=2; capture writes the same files.

Each run interleaves micro-batches as a pipeline schedule does (both forwards, then both
backwards), so a recompute runs while the run position names another micro-batch: its
stochastic rounding must be keyed by the recomputed micro-batch, and its delayed scales must be
those of its first forward, with the histories recording each amax once (TE's recompute
bookkeeping, ``quantization.py`` ``copy_forward_fp8_meta_tensors_for_recompute`` /
``get_old_fp8_meta_tensors_for_recompute``, TE d0067d0)."""
import pytest
import torch

from megatron.quant import position, tensor_saver
from tests._dist import run_distributed

VOCAB, SEQ, BATCH = 128, 32, 2
RECIPES = {
    "rne": {"format": "mxfp8"},
    "stochastic": {"format": "mxfp8", "options": {"rounding": "stochastic"}},
    # exact sums: the preset's Hopper accumulation model made each run several seconds longer on the CPU
    "delayed": {"format": "te-fp8-delayed", "scope": ["linear", "attention"], "accumulate": "exact"},
}
RECOMPUTE = {
    "full-uniform": {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
    "full-block": {"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 1},
    "selective": {"recompute_granularity": "selective"},
}


def _build(recipe: dict, tp: int, recompute: dict):
    from megatron.quant.layers.spec import build_llama_model
    from megatron.quant.recipes.recipe import QuantRecipe
    from tests.layers._helpers import transformer_config

    torch.manual_seed(0)
    config = transformer_config(tensor_model_parallel_size=tp, **recompute)
    return build_llama_model(config, QuantRecipe.from_dict(recipe), vocab_size=VOCAB, max_sequence_length=SEQ)


def _tokens(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def _loss(model, seed: int) -> torch.Tensor:
    tokens = _tokens(seed)
    return model(tokens, torch.arange(SEQ).expand(BATCH, SEQ), None, labels=tokens).float().mean()


def _interleaved(model) -> dict[str, torch.Tensor]:
    """An iteration of two micro-batches, both forwards before both backwards (the second forward
    already takes delayed scales from the first's amaxes); the losses and the gradients after
    each backward."""
    out = {}
    for iteration in range(1):
        position.set_iteration(iteration)
        losses = []
        for mb in range(2):
            position.set_microbatch(mb, (2 * iteration + mb) * BATCH)
            losses.append(_loss(model, 2 * iteration + mb))
        for mb, loss in enumerate(losses):
            loss.backward()
            out[f"loss {iteration}.{mb}"] = loss.detach()
            out.update({f"{n} {iteration}.{mb}": p.grad.clone() for n, p in model.named_parameters()
                        if p.grad is not None})
        model.zero_grad(set_to_none=True)
    return out


def _differences(rank: int, world_size: int, settings: tuple[str, ...]) -> dict[tuple[str, str], list[str]]:
    """Per recipe and recompute setting, the results that differ from the run without recompute."""
    from megatron.quant import cpu

    cpu.init_parallel(tensor_model_parallel_size=world_size, seed=1)
    try:
        found = {}
        for name, recipe in RECIPES.items():
            reference = _interleaved(_build(recipe, world_size, {}))
            for setting in settings:
                recompute = RECOMPUTE[setting]
                ours = _interleaved(_build(recipe, world_size, recompute))
                found[name, setting] = sorted(k for k in reference if k not in ours or
                                              not torch.equal(ours[k], reference[k]))
                assert ours.keys() == reference.keys()
        return found
    finally:
        cpu.destroy_parallel()


def _expected(settings) -> dict[tuple[str, str], list[str]]:
    return {(name, setting): [] for name in RECIPES for setting in settings}


def test_recompute_changes_no_bit_at_tp1():
    assert _differences(0, 1, tuple(RECOMPUTE)) == _expected(RECOMPUTE)


def test_recompute_changes_no_bit_at_tp2():
    settings = ("full-uniform", "selective")  # block recomputes through the same call as uniform
    assert run_distributed(_differences, 2, settings) == [_expected(settings)] * 2


def test_recompute_runs_at_the_first_forwards_position(parallel):
    """The noise key directly: a layer's recomputed forward reads the position its first forward
    ran at, though the loop has moved on to another micro-batch."""
    from megatron.quant.layers import recompute

    seen = []
    position.set_iteration(3)
    position.set_microbatch(0, 6)
    x = torch.ones(2, requires_grad=True)
    y = recompute.checkpoint(lambda t: seen.append(_key(position.current())) or t * 2, False, x)
    position.set_microbatch(1, 8)
    y.sum().backward()
    assert seen == [(3, 6), (3, 6)] and _key(position.current()) == (3, 8)


def _key(at: position.Position) -> tuple[int, int]:
    return at.iteration, at.sample


def _regions(model, monkeypatch) -> list[bool]:
    """Per checkpointed region of one forward of ``model``: whether it runs through our wrapper."""
    from megatron.core.tensor_parallel.random import CheckpointFunction

    from megatron.quant.layers import recompute

    regions, apply = [], CheckpointFunction.apply
    monkeypatch.setattr(CheckpointFunction, "apply", lambda function, *args: (
        regions.append(isinstance(function, recompute._Checkpointed)), apply(function, *args))[1])
    _loss(model, 0).backward()
    monkeypatch.undo()
    return regions


def test_recompute_is_routed_per_model_only_while_it_runs(parallel, monkeypatch):
    """The wrapper serves the model built with recompute, during its forward only: megatron-core's
    own checkpoint is in place before and after, and a stock model recomputes through it."""
    from megatron.core import tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import checkpoint as megatron_checkpoint

    from tests.layers._helpers import transformer_config

    ours = _build(RECIPES["rne"], 1, RECOMPUTE["full-uniform"])
    stock = GPTModel(transformer_config(**RECOMPUTE["full-uniform"]), get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=VOCAB, max_sequence_length=SEQ, position_embedding_type="rope")
    assert tensor_parallel.checkpoint is megatron_checkpoint
    assert _regions(ours, monkeypatch) == [True, True]  # one region per layer
    assert tensor_parallel.checkpoint is megatron_checkpoint
    assert _regions(stock, monkeypatch) == [False, False]


def _captured(capture_session, tmp_path, recompute: dict) -> tuple[list[str], dict]:
    from megatron.quant import cpu

    cpu.init_parallel(seed=1)
    try:
        model = _build(RECIPES["stochastic"], 1, recompute)
        capture_session(tmp_path, iterations="0", mode="full", save_quantized=True)
        position.set_iteration(0)
        position.set_microbatch(0, 0)
        _loss(model, 0).backward()
        summary = {k: v for k, v in tensor_saver.iteration_summary().items() if not k.endswith("wait_s")}
        tensor_saver.close()
    finally:
        cpu.destroy_parallel()
    # Names start with the date and time of the run: compare what follows (counter, site, tensor).
    return sorted(p.name.split("_", 2)[2] for p in tmp_path.rglob("*.pt")), summary


@pytest.mark.parametrize("setting", ["full-uniform", "selective"])
def test_capture_with_recompute_writes_the_same_files(tmp_path, setting, capture_session):
    files, summary = _captured(capture_session, tmp_path / "plain", {})
    recomputed, recomputed_summary = _captured(capture_session, tmp_path / setting, RECOMPUTE[setting])
    assert files and recomputed == files
    assert recomputed_summary == summary
