"""Summaries of one array, and its error against a reference array (in float64)."""
from __future__ import annotations

import math

import numpy as np

FIRST_N = 10


def describe(x: np.ndarray) -> dict:
    """The original tool's per-tensor fields (shape, first 10 values, mean, std, min, max over the
    finite elements) plus NaN and Inf counts. In float64: modes are compared through these numbers,
    so they must not carry float32 accumulation error (megatron.quant.stats sums in float32)."""
    values = np.asarray(x, dtype=np.float64)
    finite = values[np.isfinite(values)]
    moments = ((finite.mean(), finite.std(), finite.min(), finite.max()) if finite.size else (None,) * 4)
    return {
        "shape": list(values.shape),
        "first_10": values.reshape(-1)[:FIRST_N].tolist(),
        **{key: None if value is None else float(value) for key, value in zip(("mean", "std", "min", "max"), moments)},
        "nans": int(np.isnan(values).sum()),
        "infs": int(np.isinf(values).sum()),
    }


def error_vs_reference(x: np.ndarray, reference: np.ndarray) -> dict:
    """MSE, MAE, max abs error, relative L2 error, SQNR (dB) and cosine of ``x`` against ``reference``.

    ``relative_error`` = ||x - ref|| / ||ref||. Values that would be infinite are None (JSON
    has no infinity): ``sqnr_db`` when ``x`` equals the reference exactly, ``relative_error``
    and ``sqnr_db`` when the reference is all zeros and ``x`` is not.
    """
    if np.shape(x) != np.shape(reference):
        raise ValueError(f"shape {list(np.shape(x))} differs from the reference's {list(np.shape(reference))}")
    ref = np.asarray(reference, dtype=np.float64).reshape(-1)
    val = np.asarray(x, dtype=np.float64).reshape(-1)
    diff = val - ref
    error_energy = float(np.dot(diff, diff))
    signal_energy = float(np.dot(ref, ref))
    norms = math.sqrt(signal_energy) * math.sqrt(float(np.dot(val, val)))
    return {
        "mse": error_energy / diff.size,
        "mae": float(np.abs(diff).mean()),
        "max_abs_error": float(np.abs(diff).max()),
        "relative_error": _relative_error(signal_energy, error_energy),
        "sqnr_db": _sqnr_db(signal_energy, error_energy),
        "cosine": float(np.dot(val, ref)) / norms if norms else 0.0,
    }


def _relative_error(signal_energy: float, error_energy: float) -> float | None:
    if error_energy == 0.0:
        return 0.0
    return math.sqrt(error_energy / signal_energy) if signal_energy else None


def _sqnr_db(signal_energy: float, error_energy: float) -> float | None:
    if error_energy == 0.0 or signal_energy == 0.0:
        return None
    return 10.0 * math.log10(signal_energy / error_energy)
