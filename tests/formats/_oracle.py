"""Independent references for the format tests: numpy, ml_dtypes and en_dtypes only.

Nothing here imports megatron.quant.formats; expected values come from these libraries'
casts and from numpy re-statements of the formulas in the issue.
"""
import en_dtypes
import ml_dtypes
import numpy as np
import torch

ELEMENT_DTYPES = {
    "fp8_e4m3": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
    "fp6_e3m2": ml_dtypes.float6_e3m2fn,
    "fp6_e2m3": ml_dtypes.float6_e2m3fn,
    "fp4_e2m1": ml_dtypes.float4_e2m1fn,
    "hifp8": en_dtypes.hifloat8,
}
ELEMENT_BITS = {"fp8_e4m3": 8, "fp8_e5m2": 8, "fp6_e3m2": 6, "fp6_e2m3": 6, "fp4_e2m1": 4, "hifp8": 8}
MX_ELEMENTS = {
    "mxfp8_e4m3": "fp8_e4m3",
    "mxfp8_e5m2": "fp8_e5m2",
    "mxfp6_e3m2": "fp6_e3m2",
    "mxfp6_e2m3": "fp6_e2m3",
    "mxfp4_e2m1": "fp4_e2m1",
}


def all_bf16() -> np.ndarray:
    """Every bfloat16 bit pattern, as float32."""
    return (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)


def all_fp16() -> np.ndarray:
    """Every float16 bit pattern, as float16."""
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16)


def random_fp32(n: int, seed: int, lo: int = -40, hi: int = 20) -> np.ndarray:
    """Signed values with a uniformly random binade in [lo, hi) and random full mantissas,
    plus a share of uniformly random bit patterns (Inf, NaN, subnormals, huge values)."""
    rng = np.random.default_rng(seed)
    mantissa = rng.integers(0, 1 << 23, n, dtype=np.uint32)
    exponent = rng.integers(lo + 127, hi + 127, n, dtype=np.uint32)
    sign = rng.integers(0, 2, n, dtype=np.uint32) << 31
    values = (sign | exponent << 23 | mantissa).view(np.float32)
    raw = rng.integers(0, 1 << 32, n // 16, dtype=np.uint32).view(np.float32)
    values[: raw.size] = raw
    return values


def element_values(name: str) -> np.ndarray:
    """Every finite value of an 8-bit-or-smaller element dtype, sorted."""
    codes = np.arange(1 << ELEMENT_BITS[name], dtype=np.uint8)
    values = codes.view(ELEMENT_DTYPES[name]).astype(np.float32)
    return np.unique(values[np.isfinite(values)])


def cast(x: np.ndarray, name: str) -> np.ndarray:
    """The library's own (non-saturating for FP8/HiF8) round-to-nearest cast, as float32."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(x, np.float32).astype(ELEMENT_DTYPES[name]).astype(np.float32)


def saturating_cast(x: np.ndarray, name: str) -> np.ndarray:
    """Round to nearest, then clip to +-max (NaN stays NaN): OCP's saturating conversion."""
    top = element_values(name)[-1]
    x = np.asarray(x, np.float32)
    out = cast(np.clip(x, -top, top), name)
    return np.where(np.isnan(x), np.nan, out).astype(np.float32)


def encode_scale(amax, target: float, power_of_two: bool = False,
                 value_for_inf: float = np.finfo(np.float32).max) -> np.float32:
    """Transformer Engine's compute_scale_from_amax, written from its documented arithmetic:
    float32 target / amax; 1 for an amax of 0, Inf or NaN; ``value_for_inf`` (float32 max per
    tensor; the input dtype's max in the block kernels, TE d0067d0 ``recipe_common.cuh`` lines
    35-38 and 67) when the quotient overflows; with ``power_of_two`` the largest power of two
    not above it."""
    amax = np.float32(amax)
    if not np.isfinite(amax) or amax == 0:
        return np.float32(1)
    with np.errstate(over="ignore"):
        encode = np.float32(target) / amax
    encode = np.float32(value_for_inf) if np.isinf(encode) else encode
    return np.float32(2.0 ** np.floor(np.log2(np.float64(encode)))) if power_of_two else np.float32(encode)


def tensor_scaled_reference(x: np.ndarray, name: str, amax, target: float, power_of_two: bool = False
                            ) -> tuple[np.ndarray, np.float32]:
    """(fake-quantized x, decode scale) for per-tensor scaling as TE's cast kernels do it: the
    saturating cast of x * encode, decoded with 1 / encode (all float32)."""
    encode = encode_scale(amax, target, power_of_two)
    decode = np.float32(1) / encode
    with np.errstate(over="ignore", invalid="ignore"):
        elements = saturating_cast(np.asarray(x, np.float32) * encode, name)
    return (elements * decode).astype(np.float32), decode


def mismatches(ours, expected, inputs=None, where=None) -> str:
    """'' when equal bit for bit (any NaN equals any NaN), else a short report."""
    ours = _np(ours).astype(np.float32)
    expected = _np(expected).astype(np.float32)
    both_nan = np.isnan(ours) & np.isnan(expected)
    bad = (ours.view(np.uint32) != expected.view(np.uint32)) & ~both_nan
    if where is not None:
        bad &= where
    if not bad.any():
        return ""
    index = np.flatnonzero(bad)[:5]
    shown = _np(inputs).astype(np.float32).ravel()[index] if inputs is not None else index
    return (f"{bad.sum()} of {bad.size} differ; inputs {shown.tolist()}: ours "
            f"{ours.ravel()[index].tolist()} expected {expected.ravel()[index].tolist()}")


def _np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().numpy()
    return np.asarray(x)
