"""An independent NVFP6 reference: ml_dtypes' ``float6_e2m3fn`` and ``float8_e4m3fn`` grids and the
NVFP scale rule computed by hand, step by step in numpy float32 (nothing of megatron.quant.formats).

NVFP6 is NVFP4 with E2M3 elements: the element max is 7.5, so the tensor target is
448 * 7.5 = 3360 and the block scale is E4M3(amax_block * (global_encode * (1 / 7.5))).
"""
import ml_dtypes
import numpy as np

E2M3_MAX = np.float32(7.5)
E4M3_MAX = np.float32(448.0)
TARGET = np.float32(3360.0)  # 448 * 7.5, exact in float32


def _cast(values: np.ndarray, dtype, top: np.float32) -> np.ndarray:
    """Round to nearest even onto ``dtype``'s grid, saturating at +-top (ml_dtypes' cast)."""
    return np.clip(values, -top, top).astype(dtype).astype(np.float32)


def global_encode(amax) -> np.float32:
    """3360 / amax in float32: FP32 max when that overflows, 1 for an amax of 0, Inf or NaN."""
    amax = np.float32(amax)
    if not np.isfinite(amax) or amax == 0:
        return np.float32(1)
    with np.errstate(over="ignore"):
        return min(TARGET / amax, np.finfo(np.float32).max)


def nvfp6_reference(x: np.ndarray, amax=None) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """(fake-quantized x, the GEMM operand element * block scale, global decode) for finite float32 x
    with blocks of 16 along its last axis (a multiple of 16)."""
    f32 = np.float32
    encode = global_encode(np.abs(x).max() if amax is None else amax)
    decode = f32(1) / encode
    blocks = x.reshape(*x.shape[:-1], -1, 16)
    block_amax = np.abs(blocks).max(-1, keepdims=True)
    block_decode = _cast(block_amax * (encode * f32(1 / 7.5)), ml_dtypes.float8_e4m3fn, E4M3_MAX)
    scale = (block_decode * decode).astype(f32)
    with np.errstate(divide="ignore", invalid="ignore"):
        elements = np.where(scale == 0, f32(0), _cast(blocks * (f32(1) / scale), ml_dtypes.float6_e2m3fn, E2M3_MAX))
    operand = (elements * block_decode).astype(f32)
    return (operand * decode).astype(f32).reshape(x.shape), operand.reshape(x.shape), decode


def nvfp6_test_data(rows: int, seed: int) -> np.ndarray:
    """Blocks of 16 that exercise the rule, under a global amax of 3360 * 2**-4 (global encode 16,
    exact): wide dynamic range, all-zero blocks, exact E2M3 ties under power-of-two block scales,
    block amaxes one ulp around E4M3 values, tiny blocks whose E4M3 scale rounds to zero."""
    rng = np.random.default_rng(seed)
    grid = np.unique(np.abs(np.arange(64, dtype=np.uint8).view(ml_dtypes.float6_e2m3fn).astype(np.float32)))
    ties = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)
    data = np.empty((rows, 16), np.float32)
    for r in range(rows):
        kind = r % 5
        if kind == 0:
            data[r] = rng.standard_normal(16) * np.exp2(rng.uniform(-20, 3, 16))
        elif kind == 1:
            data[r] = 0
        elif kind == 2:  # amax 7.5 * d / 16 with d a power of two: scale d / 16, the elements exact E2M3 ties
            d = np.float32(2.0 ** int(rng.integers(-6, 9)))
            data[r] = rng.choice(np.concatenate([ties, -ties]), 16) * d / 16
            data[r, 0] = E2M3_MAX * d / 16
        elif kind == 3:  # amax * (16 / 7.5) at an E4M3 value, or one ulp either side
            e4m3 = np.float32(rng.choice(np.arange(1, 127, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)))
            edge = np.float32(e4m3 * E2M3_MAX / 16)
            data[r] = rng.uniform(-1, 1, 16).astype(np.float32) * edge
            data[r, 0] = rng.choice([edge, np.nextafter(edge, 0), np.nextafter(edge, np.inf)])
        else:
            data[r] = rng.standard_normal(16) * 1e-9  # block scale below E4M3's smallest subnormal: zeros
    flat = data.reshape(-1)
    flat[0] = TARGET / 16  # the global amax
    return data.reshape(rows // 4, 64)
