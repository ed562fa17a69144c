"""Stochastic rounding in a whole (tiny) Llama: noise keyed by (seed, module, operand,
iteration, micro-batch, element), so capture never changes training, the same position gives
the same bits, and different positions and seeds give different noise."""
import pytest
import torch

from megatron.quant import position, tensor_saver

VOCAB, SEQ = 128, 32


@pytest.fixture(scope="module")
def build():
    from megatron.quant import cpu
    from megatron.quant.layers.spec import build_llama_model
    from megatron.quant.recipes.recipe import QuantRecipe
    from tests.layers._helpers import transformer_config

    cpu.init_parallel(seed=5)
    config = transformer_config()

    def make(fmt: str = "mxfp8", seed: int = 0, **options):
        torch.manual_seed(0)
        recipe = QuantRecipe.uniform(fmt, rounding="stochastic", **options)
        recipe = QuantRecipe(**{**recipe.__dict__, "seed": seed})
        return build_llama_model(config, recipe, vocab_size=VOCAB, max_sequence_length=SEQ)

    yield make
    cpu.destroy_parallel()


def _step(model, iteration: int = 0, sample: int = 0) -> dict[str, torch.Tensor]:
    """Loss and every parameter gradient of one forward/backward at a run position."""
    model.zero_grad(set_to_none=True)
    position.set_iteration(iteration)
    position.set_microbatch(0, sample)
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    loss = model(tokens, torch.arange(SEQ).expand(2, SEQ), None, labels=tokens).float().mean()
    loss.backward()
    return {"loss": loss.detach(), **{n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# hadamard: the GEMM multiplies the operands in the transformed domain, the capture records them in x's.
@pytest.mark.parametrize("fmt, options", [("mxfp8", {}), ("nvfp4", {}), ("hifp8", {}), ("mxfp8", {"hadamard": 32})])
def test_capture_on_or_off_changes_no_bit(build, tmp_path, fmt, options, capture_session):
    model = build(fmt, **options)
    off = _step(model)
    for mode, extra in (("stats", {}), ("full", {"save_quantized": True})):
        capture_session(tmp_path / mode, iterations="0", mode=mode, **extra)
        on = _step(model)
        tensor_saver.close()
        assert _same(off, on), mode
    assert list((tmp_path / "full").rglob("*_quantized.pt"))  # the quantized copies were written


def test_position_and_seed_key_the_noise(build):
    model = build()
    first = _step(model, iteration=3, sample=8)
    assert _same(first, _step(model, iteration=3, sample=8))  # reproducible: no generator state
    assert _same(first, _step(build(), iteration=3, sample=8))  # a fresh model (e.g. after resume)
    assert not torch.equal(first["loss"], _step(model, iteration=4, sample=8)["loss"])
    assert not torch.equal(first["loss"], _step(model, iteration=3, sample=10)["loss"])
    assert not torch.equal(first["loss"], _step(build(seed=1), iteration=3, sample=8)["loss"])


def test_a_formats_own_seed_changes_its_operands_noise():
    from megatron.quant.formats import get_format
    from megatron.quant.formats.random_bits import RandomBits
    from megatron.quant.layers.operand import NoiseScope
    from megatron.quant.recipes.operands import OperandSpec

    scope = NoiseScope(RandomBits.derive("module"), iteration=0, sample=0, rank=0, world=1)
    keys = [scope.bits(OperandSpec(get_format("mxfp8", rounding="stochastic", seed=s), name="fprop.input")).key
            for s in (0, 1)]
    assert keys[0] != keys[1]
