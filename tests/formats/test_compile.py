"""The formats compile: torch.compile (inductor, whole graph, no break) gives the same
bits as eager. HiF8 has the most bit tricks; the benchmark compiles every format."""
import torch

from megatron.quant.formats import get_format
from tests.formats._oracle import all_bf16, mismatches, random_fp32


def test_compiled_hifp8_matches_eager_bit_for_bit():
    torch._dynamo.reset()
    fmt = get_format("hifp8")
    compiled = torch.compile(fmt.quantize, fullgraph=True, dynamic=False)
    for data in (all_bf16(), random_fp32(1 << 16, seed=7)):
        x = torch.from_numpy(data)
        assert not mismatches(compiled(x), fmt.quantize(x), x)


def test_compiled_casts_round():
    # inductor folds a dtype round trip (x.to(bf16).to(fp32)) into nothing: the casts must not be one.
    x = torch.from_numpy(random_fp32(1 << 16, seed=5))
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        torch._dynamo.reset()
        compiled = torch.compile(get_format(name).quantize, fullgraph=True, dynamic=False)
        assert not mismatches(compiled(x), x.to(dtype).float(), x), name


def test_compiled_tiles_and_hadamard_match_eager():
    torch._dynamo.reset()
    fmt = get_format("nvfp4", block_shape=(16, 16), hadamard=16)
    compiled = torch.compile(fmt.quantize, fullgraph=True, dynamic=False)
    x = torch.from_numpy(random_fp32(96 * 80, seed=3, lo=-10, hi=10)).reshape(96, 80)
    x = torch.where(torch.isfinite(x), x, 0.0)
    assert not mismatches(compiled(x), fmt.quantize(x), x)


def test_each_compiled_format_has_its_own_recompile_limit(monkeypatch):
    """Formats used to share one code object and so one recompile limit: the third (format, shape)
    ran eager without a word. Now each format counts alone, and passing its limit raises."""
    import pytest

    from megatron.quant.formats.compiled import CompiledFormat

    monkeypatch.setattr(CompiledFormat, "RECOMPILE_LIMIT", 2)
    monkeypatch.setattr(CompiledFormat, "BACKEND", "eager")  # dynamo's bookkeeping without inductor's cost
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    formats = [CompiledFormat(get_format(name)) for name in ("bf16", "fp16", "bf16")]
    for fmt in formats:
        for n in (8, 16):
            x = torch.randn(n)
            assert torch.equal(fmt.quantize(x), fmt.fmt.quantize(x))
    assert torch._dynamo.utils.counters["frames"]["ok"] == 6  # every call compiled, none skipped
    with pytest.raises(RuntimeError, match="bf16: torch.compile reached its limit of 2 compilations"):
        formats[0].quantize(torch.randn(4))
