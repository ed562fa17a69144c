"""An MoE layer at expert parallelism 2 and at (expert) tensor parallelism 2, on two CPU processes over
gloo, against the same layer on one rank holding every expert. Under expert parallelism each expert
sees exactly the tokens it sees on one rank (the all-gather dispatcher gathers them in the same order),
so its outputs, input gradients and weight gradients are the same bits, under round to nearest and
under stochastic rounding (noise keyed by the global expert and the element, not the EP rank); and each
rank's grouped experts (``QuantGroupedMLP``) give the bits of its experts run one after another. Under
tensor parallelism (with sequence parallelism, as megatron-core trains MoE layers) fc2's partial sums
are added across ranks: equal up to that order."""
import functools

import pytest
import torch

from tests._dist import run_distributed

SEQ, BATCH, HIDDEN = 16, 2, 128
RECIPES = {"rtn": "mxfp8", "sr": {"format": "mxfp8", "options": {"rounding": "stochastic"}, "seed": 5}}


def _precision(name: str):
    from megatron.quant.recipes.precision_file import precision_from_dict

    experts = RECIPES[name]
    return precision_from_dict({  # the routed experts quantized; the shared expert too under round to nearest
        "configs": {"experts": experts, "rest": "mxfp8" if name == "rtn" else "bf16"},
        "matchers": {"e": {"type": "glob", "pattern": "*.experts.*", "config": "experts", "enabled": True},
                     "d": {"type": "glob", "pattern": "*", "config": "rest", "enabled": True}}}, name, "<test>")


def _run(recipe: str, tp: int, ep: int, reference: dict | None, rank: int, sequential: bool = False) -> dict:
    """Forward and backward of one MoE layer at (tp, ep); weights copied from ``reference`` (the full
    layer's, by global module name) when given; ``sequential``: the experts run by megatron-core's
    ``SequentialMLP.forward``, one after another. Returns output, input gradient, weights and gradients."""
    from megatron.core.transformer.moe.experts import SequentialMLP

    from megatron.quant import cpu, position
    from megatron.quant.layers.linear import QuantLinearMixin
    from tests.layers._helpers import moe_config, moe_mlp

    cpu.init_parallel(tensor_model_parallel_size=tp, seed=3, expert_model_parallel_size=ep)
    # Tensor parallelism with sequence parallelism, as megatron-core trains MoE layers under TP.
    config = moe_config(hidden_size=HIDDEN, tensor_model_parallel_size=tp, expert_model_parallel_size=ep,
                        sequence_parallel=tp > 1, moe_aux_loss_coeff=0.0, quant_recipe=_precision(recipe))
    moe = moe_mlp(config)
    grouped = moe.experts.grouped_reason() is None
    if sequential:
        moe.experts.forward = functools.partial(SequentialMLP.forward, moe.experts)
    linears = {m.capture_site.module: m for m in moe.modules() if isinstance(m, QuantLinearMixin)}
    if reference is not None:
        with torch.no_grad():
            moe.router.weight.copy_(reference["weights"]["router"])
            for name, module in linears.items():
                module.weight.copy_(_shard(reference["weights"][name], name, tp, rank))
    g = torch.Generator().manual_seed(0)
    x, dy = torch.randn(2 * SEQ, BATCH, HIDDEN, generator=g), torch.randn(2 * SEQ, BATCH, HIDDEN, generator=g)
    if ep > 1 or tp > 1:  # each rank holds half of the sequence (data or sequence parallel)
        x, dy = x[rank * SEQ:(rank + 1) * SEQ], dy[rank * SEQ:(rank + 1) * SEQ]
    x.requires_grad_()
    position.set_iteration(0)
    position.set_microbatch(0, 0)
    y, _ = moe(x)
    y.backward(dy)
    experts = [m.weight for name, m in linears.items() if ".experts." in name]
    for weight in experts:
        weight.main_grad = weight.grad  # what megatron-core's DDP hands the optimizer
    return {"grouped": grouped and not sequential, "output": y.detach(), "grad_input": x.grad,
            "experts_grad_norm": _grad_norm(experts),
            "weights": {"router": moe.router.weight.detach().clone(),
                        **{name: m.weight.detach().clone() for name, m in linears.items()}},
            "grads": {name: m.weight.grad for name, m in linears.items() if ".experts." in name}}


def _grad_norm(params) -> float:
    """The training optimizer's gradient norm over ``params`` (expert-parallel ones summed over ranks)."""
    from megatron.quant.training.optimizer import CpuAdamW

    return CpuAdamW([(str(i), p) for i, p in enumerate(params)], lr=1e-3, weight_decay=0.0, betas=(0.9, 0.95),
                    eps=1e-8, clip_grad=1.0).grad_norm().item()


def _shard(full: torch.Tensor, name: str, tp: int, rank: int) -> torch.Tensor:
    """This TP rank's shard: fc1 column-parallel over [gate; up] halves, fc2 row-parallel."""
    if tp == 1:
        return full
    if name.endswith("fc1"):
        return torch.cat([half.chunk(tp, 0)[rank] for half in full.chunk(2, 0)])
    return full.chunk(tp, 1)[rank]


def _layouts(rank: int, world_size: int) -> dict:
    results = {}
    for recipe in RECIPES:
        reference = _run(recipe, 1, 1, None, rank)
        results[recipe] = {"reference": reference, "ep2": _run(recipe, 1, 2, reference, rank),
                           "tp2": _run(recipe, 2, 1, reference, rank)}
    results["rtn"]["ep2_sequential"] = _run("rtn", 1, 2, results["rtn"]["reference"], rank, sequential=True)
    from megatron.quant import cpu

    cpu.destroy_parallel()
    return results


def test_expert_and_tensor_parallelism_against_one_rank():
    # One test: its two spawned processes run every layout and recipe (a spawn costs more than the runs).
    for rank, results in enumerate(run_distributed(_layouts, 2)):
        part = slice(rank * SEQ, (rank + 1) * SEQ)
        for recipe in RECIPES:
            _check_expert_parallel(results[recipe]["reference"], results[recipe]["ep2"], rank, part)
            _check_tensor_parallel(results[recipe]["reference"], results[recipe]["tp2"], rank, part)
        grouped, sequential = results["rtn"]["ep2"], results["rtn"]["ep2_sequential"]
        assert grouped["grouped"] and not results["sr"]["ep2"]["grouped"]  # stochastic rounding: per expert
        assert not results["rtn"]["tp2"]["grouped"]  # expert tensor parallelism: per expert
        for key in ("output", "grad_input"):
            assert torch.equal(grouped[key], sequential[key]), (rank, key)
        assert grouped["grads"].keys() == sequential["grads"].keys()
        for name, grad in sequential["grads"].items():
            assert torch.equal(grouped["grads"][name], grad), (rank, name)


def _check_expert_parallel(reference: dict, ep2: dict, rank: int, part: slice) -> None:
    """Expert parallelism 2: the bits of one rank."""
    assert torch.equal(ep2["output"], reference["output"][part]), rank
    assert torch.equal(ep2["grad_input"], reference["grad_input"][part]), rank
    assert len(ep2["grads"]) == 4 and {n.split(".experts.")[1][0] for n in ep2["grads"]} == \
        ({"0", "1"} if rank == 0 else {"2", "3"})  # this rank's global experts
    for name, grad in ep2["grads"].items():
        assert torch.equal(grad, reference["grads"][name]), (rank, name)
    # every rank clips by the norm of all experts' gradients, not of its own experts'
    assert ep2["experts_grad_norm"] == pytest.approx(reference["experts_grad_norm"], rel=1e-12)


def _check_tensor_parallel(reference: dict, tp2: dict, rank: int, part: slice) -> None:
    """Expert tensor parallelism 2 (sequence parallel): one rank's values up to fc2's summation order."""
    torch.testing.assert_close(tp2["output"], reference["output"][part], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tp2["grad_input"], reference["grad_input"][part], rtol=1e-5, atol=1e-5)
    for name, grad in tp2["grads"].items():
        torch.testing.assert_close(grad, _shard(reference["grads"][name], name, 2, rank), rtol=1e-5, atol=1e-5)
