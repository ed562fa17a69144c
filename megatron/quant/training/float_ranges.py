"""The float training flags and the values each allows: (low, high, low included, high included),
high None for unbounded; every allowed value is finite."""
from __future__ import annotations

import math

FLOAT_RANGES = {
    "lr": (0, None, True, False), "min_lr": (0, None, True, False), "weight_decay": (0, None, True, False),
    "clip_grad": (0, None, True, False), "adam_eps": (0, None, True, False),
    "adam_beta1": (0, 1, True, False), "adam_beta2": (0, 1, True, False),
    "attention_dropout": (0, 1, True, True), "hidden_dropout": (0, 1, True, True),
    "init_method_std": (0, None, False, False), "norm_epsilon": (0, None, False, False),
    "rotary_base": (0, None, False, False), "rope_scaling_factor": (0, None, False, False),
    "peak_tflops": (0, None, False, False), "divergence_threshold": (0, None, False, False),
    "moe_aux_loss_coeff": (0, None, True, False),
}


def allowed(key: str) -> str:
    """What flag ``key`` (an argparse destination) allows, in words."""
    low, high, closed_low, closed_high = FLOAT_RANGES[key]
    if high is None:
        return "a finite number " + (">= 0" if closed_low else "> 0")
    return f"a number in {'[' if closed_low else '('}{low}, {high}{']' if closed_high else ')'}"


def within_range(key: str, value: float) -> bool:
    """``value`` is finite and inside flag ``key``'s range."""
    low, high, closed_low, closed_high = FLOAT_RANGES[key]
    return (math.isfinite(value) and (value >= low if closed_low else value > low)
            and (high is None or (value <= high if closed_high else value < high)))
