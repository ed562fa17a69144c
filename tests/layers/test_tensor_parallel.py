"""TP=1 and TP=2 (two CPU processes over gloo) give the same outputs and gradients for a block
format, a per-tensor format and every recipe preset, column- and row-parallel; block/shard
mismatch is refused; delayed scaling's histories agree across TP and DP ranks."""
import pytest
import torch

from tests._dist import run_distributed
from tests.layers._helpers import BLOCK_FORMAT, TENSOR_FORMAT

TOKENS = 64
STOCHASTIC = "+sr"  # suffix: the format with stochastic rounding on every operand
CASES = [(kind, fmt) for kind in ("column", "row")
         for fmt in (BLOCK_FORMAT, TENSOR_FORMAT, BLOCK_FORMAT + STOCHASTIC, "nvfp4" + STOCHASTIC,
                     "te-nvfp4", "te-mxfp8", "te-fp8-current", "te-fp8-blockwise", "te-fp8-delayed",
                     "te-nvfp4-row-scaled")]
# Layer width: TP=2 shards must hold whole 1x128 blocks and 128x128 tiles for te-fp8-blockwise.
WIDTH = {"te-fp8-blockwise": 256}
# Per-tensor amax all-reduces per forward+backward at TP=2, one per TP-sharded operand whose format
# needs one (column: W, dY; row: X, W); operands identical on every rank (column X, row dY) and
# second uses of the same tensor (wgrad, dgrad's cached W) reduce nothing.
AMAX_REDUCTIONS = {("column", TENSOR_FORMAT): 2, ("row", TENSOR_FORMAT): 2,
                   ("column", "nvfp4" + STOCHASTIC): 2, ("row", "nvfp4" + STOCHASTIC): 2}


def _formats(fmt: str) -> dict:
    from megatron.quant.recipes.recipe import QuantRecipe
    from tests.layers._helpers import linear_formats

    if fmt.startswith("te-"):
        return QuantRecipe.from_dict({"format": fmt}).resolve("fc1", 0, 1)
    name, stochastic, _ = fmt.partition(STOCHASTIC)
    return linear_formats(name, **({"rounding": "stochastic"} if stochastic else {}))


class _CountAmaxReductions:
    """Counts MAX all-reduces (the amax reductions) while installed."""

    def __init__(self):
        import torch.distributed as dist

        self.count, self._dist, self._original = 0, dist, dist.all_reduce

    def __enter__(self):
        def counting(tensor, op=None, *args, **kwargs):
            self.count += op == self._dist.ReduceOp.MAX
            return self._original(tensor, *args, op=op, **kwargs) if op is not None else \
                self._original(tensor, *args, **kwargs)

        self._dist.all_reduce = counting
        return self

    def __exit__(self, *exc):
        self._dist.all_reduce = self._original


def _full_data(width: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(TOKENS, 1, width, generator=g)
    x[..., : width // 2] *= 8  # shards with different amax: a missing TP reduction would show
    weight = torch.randn(width, width, generator=g)
    weight[: width // 2] *= 8
    grad = torch.randn(TOKENS, 1, width, generator=g)
    grad[..., : width // 2] *= 8
    return x, weight, grad


def _layer_results(rank: int, world_size: int) -> dict:
    """Each case's output and gradients on this rank, as full (un-sharded) tensors where sharded."""
    from megatron.quant import cpu, position
    from megatron.quant.layers.linear import QuantColumnParallelLinear, QuantRowParallelLinear
    from megatron.quant.layers.linear_function import LinearQuant
    from tests.layers._helpers import transformer_config

    cpu.init_parallel(tensor_model_parallel_size=world_size, seed=1)
    # TP=1 runs in the test process, where earlier tests may have moved the run position that
    # keys stochastic rounding: start both layouts from the same one.
    position.set_iteration(0)
    config = transformer_config(tensor_model_parallel_size=world_size)
    results = {}
    for kind, fmt in CASES:
        width = WIDTH.get(fmt, 128)
        if kind == "column":
            layer = QuantColumnParallelLinear(width, width, config=config, init_method=torch.nn.init.zeros_,
                                              bias=False, gather_output=True)
        else:
            layer = QuantRowParallelLinear(width, width, config=config, init_method=torch.nn.init.zeros_, bias=False,
                                           input_is_parallel=True, skip_bias_add=False)
        layer.configure_quant(LinearQuant.from_formats(_formats(fmt)), None)
        # Delayed scaling: a first step fills the histories, the second is compared.
        for seed in (1, 0) if "delayed" in fmt else (0,):
            x, weight, grad = _full_data(width, seed)
            shard, x_in = (weight.chunk(world_size, 0)[rank], x) if kind == "column" else \
                (weight.chunk(world_size, 1)[rank], x.chunk(world_size, -1)[rank])
            with torch.no_grad():
                layer.weight.copy_(shard)
            x_in = x_in.clone().requires_grad_()
            with _CountAmaxReductions() as reductions:
                y, _ = layer(x_in)
                y.backward(grad)
        results[(kind, fmt)] = (y.detach(), x_in.grad, layer.weight.grad)
        results[("reductions", kind, fmt)] = reductions.count
    results["attention_capture"] = _attention_captured_on_rank0(rank, world_size)
    results["attention_stochastic"] = _attention_stochastic(rank, world_size)
    if world_size > 1:  # in the same processes, to spare a spawn
        results["refusals"] = _build_refusals(world_size)
        results["sequence_parallel"] = _sequence_parallel(rank, world_size)
        results["delayed_dp"] = _delayed_histories_at_dp2(rank)
    cpu.destroy_parallel()
    return results


def _delayed_histories_at_dp2(rank: int) -> dict:
    """The input histories of a te-fp8-delayed layer at TP=1, DP=2 after two steps on rank-dependent
    data, with Megatron-LM's amax group (tensor x data parallel) and with ``tp_only_amax_red``."""
    from megatron.quant import cpu
    from megatron.quant.layers.linear import QuantColumnParallelLinear
    from megatron.quant.layers.linear_function import LinearQuant
    from tests.layers._helpers import transformer_config

    cpu.init_parallel(tensor_model_parallel_size=1, seed=1)
    out = {}
    for tp_only in (False, True):
        layer = QuantColumnParallelLinear(128, 128, config=transformer_config(tp_only_amax_red=tp_only),
                                          init_method=torch.nn.init.normal_, bias=False, gather_output=True)
        layer.configure_quant(LinearQuant.from_formats(_formats("te-fp8-delayed")), None)
        amaxes = []
        for step in range(2):
            x, _, grad = _full_data(128, seed=10 * step + rank)
            x = x * (rank + 1)
            y, _ = layer(x)
            y.backward(grad)
            amaxes.append(x.abs().max().item())
        out[tp_only] = {"histories": {k: h.amax_history.clone() for k, h in layer.amax_histories.items()},
                        "amaxes": amaxes}
    return out


def test_delayed_histories_agree_across_data_parallel_ranks(tp_runs):
    first, second = (r["delayed_dp"][False] for r in tp_runs[1])
    for key, history in first["histories"].items():
        assert torch.equal(history, second["histories"][key]), key
    inputs = first["histories"]["fprop_input"][-2:].tolist()
    assert inputs == [max(a, b) for a, b in zip(first["amaxes"], second["amaxes"])]


def test_tp_only_amax_reduction_leaves_data_parallel_ranks_their_own_histories(tp_runs):
    for rank_results in tp_runs[1]:
        own = rank_results["delayed_dp"][True]
        assert own["histories"]["fprop_input"][-2:].tolist() == own["amaxes"]


def _assemble(per_rank: list[dict], kind: str, fmt: str):
    """Full output, input grad and weight grad from the ranks' shards."""
    ys, dxs, dws = zip(*(r[(kind, fmt)] for r in per_rank))
    dx = dxs[0] if kind == "column" else torch.cat(dxs, dim=-1)
    return ys[0], dx, torch.cat(dws, dim=0 if kind == "column" else 1)


@pytest.fixture(scope="module")
def tp_runs():
    return [_layer_results(0, 1)], run_distributed(_layer_results, 2)  # TP=1 in this process


@pytest.mark.parametrize("kind,fmt", CASES)
def test_tp1_equals_tp2(tp_runs, kind, fmt):
    single, both = tp_runs
    for name, a, b in zip(("output", "grad_input", "grad_weight"), _assemble(single, kind, fmt),
                          _assemble(both, kind, fmt)):
        # Partial sums are added in a different order across ranks; quantization differences
        # would be ~1e-2 relative, far above this tolerance.
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-4, msg=f"{kind} {fmt} {name}")
    if kind == "row":  # both ranks hold the same reduced output
        assert torch.equal(both[0][(kind, fmt)][0], both[1][(kind, fmt)][0])


@pytest.mark.parametrize("kind,fmt", sorted(AMAX_REDUCTIONS))
def test_one_amax_collective_per_sharded_operand(tp_runs, kind, fmt):
    both = tp_runs[1]
    assert [r[("reductions", kind, fmt)] for r in both] == [AMAX_REDUCTIONS[(kind, fmt)]] * 2
    assert tp_runs[0][0][("reductions", kind, fmt)] == 0  # TP=1: nothing to reduce


def _attention_captured_on_rank0(rank: int, world_size: int):
    """Per-tensor-scaled attention with capture active on rank 0 only (as a rank filter does):
    (rank-0 output heads, captured quantized query heads) for rank 0, None elsewhere."""
    from megatron.core.transformer.enums import AttnMaskType

    from megatron.quant import tensor_saver
    from megatron.quant.layers.attention import AttentionQuant, QuantDotProductAttention
    from megatron.quant.tensor_saver import CaptureSite
    from tests.layers._helpers import attention_formats, transformer_config

    heads, groups, head_dim, seq = 4, 2, 32, 32
    config = transformer_config(hidden_size=heads * head_dim, num_attention_heads=heads, num_query_groups=groups,
                                tensor_model_parallel_size=world_size)
    module = QuantDotProductAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal,
                                      attention_type="self")
    module.configure_quant(AttentionQuant.from_formats(attention_formats(TENSOR_FORMAT)),
                           CaptureSite("attention", "FA", 0, "core_attention", "core_attention", "t"))
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(seq, 1, h, head_dim, generator=g) for h in (heads, groups, groups))
    q[:, :, heads // 2:] *= 8  # the second rank's heads hold the amax
    shard = lambda t: t.chunk(world_size, dim=2)[rank].clone().requires_grad_()  # noqa: E731
    q, k, v = shard(q), shard(k), shard(v)
    captured = []
    saved = tensor_saver.is_active, tensor_saver.capture
    tensor_saver.is_active = lambda: rank == 0
    tensor_saver.capture = lambda site, op, phase, tensors: captured.append(dict(tensors))
    try:
        out = module(q, k, v, attention_mask=None)
        out.sum().backward()
    finally:
        tensor_saver.is_active, tensor_saver.capture = saved
    return (out.detach(), captured[0]["query"].quantized.detach()) if rank == 0 else None


def _attention_stochastic(rank: int, world_size: int):
    """This rank's heads of the output and of dQ/dK/dV, every attention operand in mxfp8 with
    stochastic rounding."""
    from megatron.core.transformer.enums import AttnMaskType

    from megatron.quant.layers.attention import AttentionQuant, QuantDotProductAttention
    from tests.layers._helpers import attention_formats, transformer_config

    heads, groups, head_dim, seq = 4, 2, 32, 32
    config = transformer_config(hidden_size=heads * head_dim, num_attention_heads=heads, num_query_groups=groups,
                                tensor_model_parallel_size=world_size)
    module = QuantDotProductAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal,
                                      attention_type="self")
    module.configure_quant(AttentionQuant.from_formats(attention_formats(BLOCK_FORMAT, rounding="stochastic")), None)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(seq, 2, h, head_dim, generator=g) for h in (heads, groups, groups))
    grad = torch.randn(seq, 2, heads, head_dim, generator=g)
    shard = lambda t: t.chunk(world_size, dim=2)[rank].clone()  # noqa: E731
    q, k, v = (shard(t).requires_grad_() for t in (q, k, v))
    out = module(q, k, v, attention_mask=None)
    out.backward(shard(grad).flatten(2))
    return out.detach().unflatten(2, (-1, head_dim)), q.grad, k.grad, v.grad


def test_stochastic_attention_does_not_depend_on_the_tp_size(tp_runs):
    single, both = tp_runs
    full = single[0]["attention_stochastic"]
    for name, index in (("output", 0), ("grad_query", 1), ("grad_key", 2), ("grad_value", 3)):
        assembled = torch.cat([r["attention_stochastic"][index] for r in both], dim=2)
        torch.testing.assert_close(assembled, full[index], rtol=1e-5, atol=1e-5, msg=name)


def _sequence_parallel(rank: int, world_size: int) -> dict[str, bool]:
    """Column-parallel layer with sequence parallelism (tokens sharded, gathered for the GEMMs):
    passthrough equals megatron-core's stock layer bit for bit; mxfp8 equals the same layer
    without sequence parallelism."""
    from megatron.core.tensor_parallel import ColumnParallelLinear

    from megatron.quant.layers.linear import QuantColumnParallelLinear
    from megatron.quant.layers.linear_function import LinearQuant
    from tests.layers._helpers import linear_formats, transformer_config

    x, weight, grad = _full_data(128)
    out_shard = weight.chunk(world_size, 0)[rank]
    grad_shard = grad.chunk(world_size, -1)[rank]
    runs = {}
    for name, cls, fmt, sp in (("stock", ColumnParallelLinear, None, True),
                               ("passthrough", QuantColumnParallelLinear, None, True),
                               ("mxfp8_sp", QuantColumnParallelLinear, BLOCK_FORMAT, True),
                               ("mxfp8", QuantColumnParallelLinear, BLOCK_FORMAT, False)):
        config = transformer_config(tensor_model_parallel_size=world_size, sequence_parallel=sp)
        layer = cls(128, 128, config=config, init_method=torch.nn.init.zeros_, bias=False, gather_output=False)
        if cls is QuantColumnParallelLinear:
            layer.configure_quant(LinearQuant.from_formats(linear_formats(fmt)), None)
        with torch.no_grad():
            layer.weight.copy_(out_shard)
        x_in = (x.chunk(world_size, 0)[rank] if sp else x).clone().requires_grad_()
        y, _ = layer(x_in)
        y.backward(grad_shard)
        dx = x_in.grad if sp else x_in.grad.chunk(world_size, 0)[rank]
        runs[name] = (y.detach(), dx, layer.weight.grad)
    def same(a: str, b: str, exact: bool) -> bool:
        return all(torch.equal(u, v) if exact else torch.allclose(u, v, rtol=1e-5, atol=1e-4)
                   for u, v in zip(runs[a], runs[b]))

    return {"passthrough_is_stock": same("stock", "passthrough", True),
            "mxfp8_sp_equals_mxfp8": same("mxfp8_sp", "mxfp8", False),
            "mxfp8_is_quantized": not torch.allclose(runs["mxfp8"][0], runs["passthrough"][0], rtol=1e-3)}


def _build_refusals(world_size: int) -> dict[str, str]:
    """Messages of the configurations refused at build time at TP>1."""
    from megatron.quant.layers.linear import QuantRowParallelLinear
    from megatron.quant.layers.linear_function import LinearQuant
    from megatron.quant.layers.spec import build_llama_model
    from megatron.quant.recipes.recipe import QuantRecipe
    from megatron.quant.tensor_saver import CaptureSite
    from tests.layers._helpers import linear_formats, transformer_config

    messages = {}
    layer = QuantRowParallelLinear(96, 64, config=transformer_config(tensor_model_parallel_size=world_size),
                                   init_method=torch.nn.init.zeros_, bias=False, input_is_parallel=True,
                                   skip_bias_add=False)
    site = CaptureSite("linear", "linear", 3, "decoder.layers.3.mlp.linear_fc2", "fc2", "mxfp8")
    for name, build in (
            ("block", lambda: layer.configure_quant(LinearQuant.from_formats(linear_formats(BLOCK_FORMAT)), site)),
            ("sequence_parallel", lambda: build_llama_model(
                transformer_config(tensor_model_parallel_size=world_size, sequence_parallel=True),
                QuantRecipe.uniform(BLOCK_FORMAT), vocab_size=128, max_sequence_length=32))):
        try:
            build()
            messages[name] = "accepted"
        except ValueError as exc:
            messages[name] = str(exc)
    return messages


def test_attention_capture_on_one_rank_matches_tp1(tp_runs):
    single, both = tp_runs
    out_1, query_1 = single[0]["attention_capture"]
    out_2, query_2 = both[0]["attention_capture"]
    # Rank 0 holds the first half of the heads; the capture used the TP-reduced amax.
    assert torch.equal(query_2, query_1[:, :, : query_2.shape[2]])
    torch.testing.assert_close(out_2, out_1[..., : out_2.shape[-1]], rtol=1e-5, atol=1e-6)


def test_sequence_parallel_column_layer(tp_runs):
    # megatron-core's models need TE/Apex norms for sequence parallelism; the layer itself runs here.
    for rank_result in tp_runs[1]:
        assert rank_result["sequence_parallel"] == {"passthrough_is_stock": True, "mxfp8_sp_equals_mxfp8": True,
                                                    "mxfp8_is_quantized": True}


@pytest.fixture(scope="module")
def refusals(tp_runs):
    return tp_runs[1][0]["refusals"]


def test_block_not_dividing_the_shard_is_refused(refusals):
    message = refusals["block"]
    assert "decoder.layers.3.mlp.linear_fc2" in message and "48" in message and "32" in message


def test_sequence_parallel_without_te_or_apex_is_refused(refusals):
    message = refusals["sequence_parallel"]
    assert "sequence_parallel" in message and "Transformer Engine" in message
