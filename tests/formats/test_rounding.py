"""The integer rounding rules against numpy (float64) on magnitudes that stress float32:
every tie N + 0.5, its float32 neighbours, and random values across many binades."""
import numpy as np
import torch

from megatron.quant.formats.rounding import round_half_away_, round_half_even_, round_stochastic_


def _magnitudes() -> np.ndarray:
    ties = np.arange(0, 1 << 16, dtype=np.float32) + np.float32(0.5)
    near = np.concatenate([ties, np.nextafter(ties, 0), np.nextafter(ties, np.inf)])
    rng = np.random.default_rng(8)
    spread = (rng.random(1_000_000) * np.exp2(rng.integers(-30, 24, 1_000_000))).astype(np.float32)
    return np.concatenate([near, spread, [0.0, np.inf]]).astype(np.float32)


@np.errstate(invalid="ignore")  # inf - floor(inf)
def test_nearest_rules_match_numpy():
    m = _magnitudes()
    wide = m.astype(np.float64)
    away = np.floor(wide) + (wide - np.floor(wide) >= 0.5)
    assert np.array_equal(round_half_away_(torch.from_numpy(m.copy())).numpy(), away)
    assert np.array_equal(round_half_even_(torch.from_numpy(m.copy())).numpy(), np.round(wide))


def test_stochastic_rule_picks_floor_or_ceil_with_exact_noise_thresholds():
    m = _magnitudes()[:-1]  # finite
    fraction = m.astype(np.float64) - np.floor(m)
    uniform = np.random.default_rng(9).random(m.size).astype(np.float32)
    ours = round_stochastic_(torch.from_numpy(m.copy()), torch.from_numpy(uniform.copy())).numpy()
    assert np.array_equal(ours, np.floor(m) + (uniform < fraction))
