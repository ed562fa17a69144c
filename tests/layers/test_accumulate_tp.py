"""Hopper FP8 accumulation under tensor parallelism (two CPU processes over gloo), column- and
row-parallel: each rank's GEMM accumulates its own shard of K, as each GPU's tensor core does, and
the ranks' partial outputs are summed in the layer's dtype by megatron-core's all-reduce. Checked
against mmaemu's accumulator by hand: a GEMM whose K is not sharded (column fprop, row dgrad, every
wgrad) gives TP=1's bits; one whose K is (column dgrad, row fprop) the sum of the shards' results."""
import pytest
import torch

from tests._dist import run_distributed
from tests.layers.test_accumulate import TE_HOPPER, formats, oracle

TOKENS, WIDTH, TP = 32, 64, 2


def _data():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(TOKENS, 1, WIDTH, generator=g) * torch.exp(2 * torch.randn(TOKENS, 1, WIDTH, generator=g))
    weight = torch.randn(WIDTH, WIDTH, generator=g)
    weight[: WIDTH // 2] *= 8  # shards of different amax: the scales must be the whole tensor's
    return x, weight, torch.randn(TOKENS, 1, WIDTH, generator=g)


def _run(rank: int, world_size: int) -> dict:
    from megatron.quant import cpu
    from megatron.quant.layers.linear import QuantColumnParallelLinear, QuantRowParallelLinear
    from megatron.quant.layers.linear_function import LinearQuant
    from tests.layers._helpers import transformer_config

    cpu.init_parallel(tensor_model_parallel_size=world_size, seed=1)
    config = transformer_config(tensor_model_parallel_size=world_size)
    x, weight, grad = _data()
    results = {}
    for kind in ("column", "row"):
        if kind == "column":
            layer = QuantColumnParallelLinear(WIDTH, WIDTH, config=config, init_method=torch.nn.init.zeros_,
                                              bias=False, gather_output=True)
            shard, x_in = weight.chunk(world_size, 0)[rank], x
        else:
            layer = QuantRowParallelLinear(WIDTH, WIDTH, config=config, init_method=torch.nn.init.zeros_, bias=False,
                                           input_is_parallel=True, skip_bias_add=False)
            shard, x_in = weight.chunk(world_size, 1)[rank], x.chunk(world_size, -1)[rank]
        layer.configure_quant(LinearQuant.from_formats(formats(), accumulate=TE_HOPPER), None)
        with torch.no_grad():
            layer.weight.copy_(shard)
        x_in = x_in.clone().requires_grad_()
        y, _ = layer(x_in)
        y.backward(grad)
        results[kind] = (y.detach().reshape(TOKENS, WIDTH), x_in.grad.reshape(TOKENS, -1), layer.weight.grad)
    cpu.destroy_parallel()
    return results


def _quantized(x, weight, grad):
    """Every operand quantized once from the whole tensor (the per-tensor amax is TP-reduced), as (values, scale)."""
    from tests.layers._helpers import operand

    fmts = formats()
    return (operand(x, fmts["fprop.input"], -1), operand(weight, fmts["fprop.weight"], 1),
            operand(grad, fmts["dgrad.grad_output"], -1))


def _part(q, index, dim):
    """The ``index``-th of TP shards of a quantized operand along ``dim`` (per-tensor: the scale is shared)."""
    values, scale = q
    return values.chunk(TP, dim)[index], scale


def _t(q):
    return q[0].t(), q[1]


@pytest.mark.slow
def test_hopper_accumulation_under_tensor_parallelism_accumulates_each_rank_s_shard_of_k():
    ranks = run_distributed(_run, TP)
    x, weight, grad = _data()
    xq, wq, gq = _quantized(x.reshape(TOKENS, WIDTH), weight, grad.reshape(TOKENS, WIDTH))
    # column: W sharded along out. fprop's K (in) whole: TP=1's bits; dgrad's K (out) sharded: the shards' sum
    assert all(torch.equal(r["column"][0], oracle(xq, wq, fast=True)) for r in ranks)
    dx = oracle(_part(gq, 0, 1), _t(_part(wq, 0, 0)), fast=False) + oracle(_part(gq, 1, 1), _t(_part(wq, 1, 0)),
                                                                            fast=False)
    assert all(torch.equal(r["column"][1], dx) for r in ranks)
    for rank, r in enumerate(ranks):
        assert torch.equal(r["column"][2], oracle(_t(_part(gq, rank, 1)), _t(xq), fast=False))
    # row: W and X sharded along in. fprop's K (in) sharded: the shards' sum; dgrad's K (out) whole
    y = oracle(_part(xq, 0, 1), _part(wq, 0, 1), fast=True) + oracle(_part(xq, 1, 1), _part(wq, 1, 1), fast=True)
    assert all(torch.equal(r["row"][0], y) for r in ranks)
    for rank, r in enumerate(ranks):
        assert torch.equal(r["row"][1], oracle(gq, _t(_part(wq, rank, 1)), fast=False))
        assert torch.equal(r["row"][2], oracle(_t(gq), _t(_part(xq, rank, 1)), fast=False))
