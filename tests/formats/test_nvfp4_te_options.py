"""NVFP4's 2026 Transformer Engine options (4over6 with the 448 or 256 bound, MAE or MSE, 1x16 and
16x16; row-scaled activations) against TE's reference quantizer restated in ``_te_nvfp4_oracle``
(``reference_nvfp4.py``, the lines named there), bit for bit on normal, heavy-tailed, all-zero and
tiny-amax inputs. Zeros are compared without their sign: TE's code table sends -0 to +0."""
import pytest
import torch

from megatron.quant.formats import get_format
from tests.formats._oracle import mismatches
from tests.formats._te_nvfp4_oracle import te_nvfp4

OPTIONS = {
    "4over6-mae-256": dict(four_over_six="mae", e4m3_max=256),
    "4over6-mse-256": dict(four_over_six="mse", e4m3_max=256),
    "4over6-mae-448": dict(four_over_six="mae"),
    "4over6-mse-448-2d": dict(four_over_six="mse", block_shape=(16, 16)),
    "4over6-mae-256-2d": dict(four_over_six="mae", e4m3_max=256, block_shape=(16, 16)),
    "row-scaled": dict(row_scaled=True),
    "row-scaled-4over6-mse-256": dict(row_scaled=True, four_over_six="mse", e4m3_max=256),
}


def inputs(kind: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 64, generator=g)
    if kind == "heavy":  # heavy tails: a few values thousands of times the rest, per row and block
        x = x * torch.exp(2.5 * torch.randn(32, 64, generator=g))
    elif kind == "zero":
        x = torch.zeros(32, 64)
    elif kind == "tiny":  # amax near float32's smallest normal: the global encode overflows to FP32 max
        x = x * 1e-38
    elif kind == "mixed":  # rows and blocks whose amax spans 2**-30..2**10, some of them zero
        x = x * torch.exp2(torch.randint(-30, 10, (32, 4), generator=g).float()).repeat_interleave(16, 1)
        x[5] = 0
        x[:, 16:32] *= 1e-12
    return x


def _same(ours: torch.Tensor, expected: torch.Tensor) -> str:
    return mismatches(ours.float() + 0.0, expected.float() + 0.0)


@pytest.mark.parametrize("kind", ["normal", "heavy", "zero", "tiny", "mixed"])
@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_te_reference_quantizer(name, kind, dtype):
    options = OPTIONS[name]
    x = inputs(kind).to(dtype)
    elements, block_decode, global_decode = te_nvfp4(
        x.float(), tile=options.get("block_shape", (1, 16)), row_scaled=options.get("row_scaled", False),
        four_over_six=options.get("four_over_six"), e4m3_max=options.get("e4m3_max", 448))
    operand = elements * block_decode.repeat_interleave(16, dim=1)  # what TE's GEMM decodes per block
    fmt = get_format("nvfp4", **options)
    values, tensor_scale = fmt.quantize_for_gemm(x)
    if fmt.amax_per_row:  # the rows' FP32 factors stay in the values
        assert tensor_scale is None
        assert not _same(values, (operand * global_decode).to(dtype))
    else:
        assert not _same(values, operand.to(dtype))
        if kind != "zero":  # TE's guard gives an all-zero tensor FP32 max; its elements are zero either way
            assert not _same(tensor_scale, global_decode[0])
    assert not _same(fmt.quantize(x), (operand * global_decode).to(dtype))


@pytest.mark.parametrize("mode", ["mae", "mse"])
def test_4over6_picks_map_to_four_where_it_errs_less(mode):
    """A block of E2M1 values scaled to amax 4 is exact under map-to-4 and not under map-to-6."""
    block = torch.tensor([4.0, 3.0, 2.0, 1.5, 1.0, 0.5, 0.0, -3.0] * 2)[None] * 0.25
    x = torch.cat([block, torch.linspace(-1.5, 1.5, 16)[None]], dim=1)
    fmt = get_format("nvfp4", four_over_six=mode, e4m3_max=256)
    q = fmt.quantize(x)
    assert torch.equal(q[:, :16], x[:, :16])
    assert not torch.equal(get_format("nvfp4").quantize(x)[:, :16], x[:, :16])


def near_tie() -> torch.Tensor:
    """A 16 x 16 tile (and one holding the tensor amax 2688) whose 4over6 MAE errors (bound 448) tie
    so closely that the sums' order decides: W's rows choose map-to-6, W^T's rows map-to-4."""
    x = torch.zeros(16, 32)
    for row, col, value in [(0, 0, 192.0), (0, 16, 2688.0), (2, 5, 166.2557830810547), (4, 9, 58.00110626220703),
                            (6, 14, -137.85809326171875), (10, 2, -47.688377380371094), (12, 12, 167.469482421875),
                            (15, 11, -10.131718635559082)]:
        x[row, col] = value
    return x


def test_4over6_tiles_of_the_transposed_copy_choose_from_their_own_sums():
    """The data-gradient GEMM's copy of W (axis -2) is W^T quantized by TE: W^T's tiles sum their
    errors along W^T's rows, and on a near-tie choose otherwise than W's."""
    x = near_tie()
    fmt = get_format("nvfp4", four_over_six="mae", block_shape=(16, 16))
    for w, axis in ((x, -1), (x.t().contiguous(), -1), (x.t().contiguous().t(), 0)):
        elements, decode, _ = te_nvfp4(w.t().contiguous() if axis == 0 else w, tile=(16, 16), four_over_six="mae")
        expected = elements * decode.repeat_interleave(16, dim=1)
        values, _ = fmt.quantize_for_gemm(w, axis)
        assert not _same(values.t() if axis == 0 else values, expected), f"axis {axis}"
    assert not torch.equal(fmt.quantize(x, -1), fmt.quantize(x, 0))  # the near-tie: the two copies differ
    assert not fmt.axis_free and get_format("nvfp4", block_shape=(16, 16)).axis_free


def test_row_scaled_rows_are_independent():
    """Each row has its own FP32 scale: scaling one row leaves the others' values unchanged."""
    x = inputs("heavy")
    y = x.clone()
    y[3] *= 1e6
    fmt = get_format("nvfp4", row_scaled=True)
    qx, qy = fmt.quantize(x), fmt.quantize(y)
    rows = torch.arange(32) != 3
    assert torch.equal(qx[rows], qy[rows])
    assert fmt.amax_of(x, -1).shape == (32, 1) and fmt.amax_of(x, 0).shape == (1, 64)
    assert torch.equal(fmt.quantize(x, amax=fmt.amax_of(x, 0), axis=0), fmt.quantize(x, axis=0))


@pytest.mark.parametrize("options, message", [
    (dict(e4m3_max=256), "e4m3_max=256 needs four_over_six"),
    (dict(four_over_six="mae", rounding="stochastic"), "four_over_six takes neither"),
    (dict(four_over_six="mae", rounding="stochastic8"), r"four_over_six takes neither.*'stochastic8'"),
    (dict(four_over_six="mse", e4m3_max=256, block_shape=(16, 16), rounding="stochastic8"),
     "four_over_six takes neither"),
    (dict(four_over_six="mse", hadamard=16), "four_over_six takes neither"),
    (dict(four_over_six="mae", block_shape=(1, 32)), r"four_over_six needs block_shape \(1, 16\) or \(16, 16\)"),
    (dict(row_scaled=True, block_shape=(16, 16)), "row_scaled needs blocks along an axis"),
    (dict(four_over_six="MAX"), r"four_over_six='MAX' is not one of \['off', 'mae', 'mse'\]"),
    (dict(e4m3_max=300), r"e4m3_max=300 is not one of \[448, 256\]"),
])
def test_refuses_combinations_te_does_not_define(options, message):
    with pytest.raises(ValueError, match=message):
        get_format("nvfp4", **options)


def test_nvfp6_has_no_te_nvfp4_options():
    with pytest.raises(ValueError, match="unknown option"):
        get_format("nvfp6", four_over_six="mae")
