"""Which code quantizes a tensor: Triton kernels, ``torch.compile`` or eager torch.

``CUSTOM_QUANT_KERNELS`` chooses (default ``auto``):

- ``auto``: Triton kernels for CUDA tensors when Triton imports and the format has a kernel;
  otherwise the recipe's choice (``compile: true``: torch.compile, else eager torch);
- ``torch``: eager torch everywhere (the reference);
- ``compile``: torch.compile for round-to-nearest formats (stochastic rounding runs eager);
- ``triton``: Triton kernels wherever a format has one; CPU tensors use them only under
  ``TRITON_INTERPRET=1`` (Triton's interpreter, for tests), else the eager torch path.

The formats (``megatron.quant.formats``) stay the reference and the CPU path: a kernel must
give their bits exactly.

``select`` only decides; ``dispatch.wrap`` builds what was decided (``TritonFormat`` above it).
"""
from __future__ import annotations

import functools
import importlib.util
import sys
from typing import Literal, Mapping, Optional, get_args

from megatron.quant.formats.base import NumericFormat
from megatron.quant.formats.rounding import is_stochastic
from megatron.quant.formats.show import show_value
from megatron.quant.settings.environment import settings_of
from megatron.quant.settings.variables import KERNELS_ENV

from .launch import interpreting

ENV = KERNELS_ENV
Backend = Literal["auto", "torch", "compile", "triton"]
"""``CUSTOM_QUANT_KERNELS``'s values, described at the top of this module."""
BACKENDS: tuple[Backend, ...] = get_args(Backend)
KernelPath = Literal["triton", "compiled", "eager"]
"""What quantizes a format's tensors on a device (``plan``)."""


def backend(environ: Optional[Mapping[str, str]] = None) -> Backend:
    """The backend ``CUSTOM_QUANT_KERNELS`` names (``auto`` when unset); ValueError shows a bounded
    excerpt of a bad value and lists the allowed ones, or says why ``triton`` cannot be used here."""
    env = settings_of(environ)
    value = env.get(ENV, "").strip().lower() or "auto"
    if value not in BACKENDS:
        raise ValueError(f"{ENV}={show_value(env[ENV])} is not a kernel backend; allowed: {', '.join(BACKENDS)}")
    if value == "triton" and not triton_available():
        problem = triton_failure() or "Triton is not installed"
        raise ValueError(f"{ENV}=triton cannot be used: {problem}; install a working Triton (pip install triton) "
                         f"or use {ENV}=auto or torch")
    return value


@functools.cache
def triton_failure() -> Optional[str]:
    """Why an installed Triton cannot be used (None when it imports, or when it is not installed).

    A broken install raises anything on import (``RuntimeError: libtriton.so: undefined symbol``),
    or is an empty package without ``triton.language``: it is then hidden (``sys.modules["triton"]
    = None``), so torch and megatron-core, which import Triton themselves and handle only an
    ImportError, see it as not installed instead of failing at their own import. Called before
    megatron-core is imported (``layers`` and ``training`` do)."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        import triton.language  # noqa: F401
    except Exception as error:  # noqa: BLE001 -- whatever a broken install raises
        for name in [name for name in sys.modules if name == "triton" or name.startswith("triton.")]:
            del sys.modules[name]
        sys.modules["triton"] = None  # "import triton" now raises ImportError everywhere
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"Triton is installed but fails to import ({type(error).__name__}: {show_value(message)})"
    return None


@functools.cache
def triton_available() -> bool:
    """True when Triton imports here (a broken install counts as absent: ``triton_failure``)."""
    if triton_failure() is not None:
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def supported(fmt: NumericFormat) -> bool:
    """True when a Triton kernel quantizes ``fmt`` (every option of it): the format declares a ``kernel_contract``."""
    return fmt.kernel_contract is not None


def plan(fmt: NumericFormat, compile: bool, chosen: Backend, cuda: bool) -> KernelPath:
    """What quantizes ``fmt``'s tensors on this machine's device: "triton", "compiled" or "eager".
    ``compile``: the recipe's choice; ``chosen``: the backend; ``cuda``: whether tensors live there."""
    triton_wanted = chosen == "triton" or (chosen == "auto" and cuda and triton_available())
    if triton_wanted and supported(fmt) and (cuda or interpreting()):
        return "triton"
    if (chosen == "compile" or (chosen == "auto" and compile)) and not is_stochastic(fmt.rounding):
        return "compiled"
    return "eager"


def describe(formats: list[NumericFormat], compile: bool, chosen: Backend, cuda: bool) -> str:
    """The start line's words: the backend and each format's path, saying where a GPU runs eager."""
    paths: dict[str, list[str]] = {}
    for fmt in formats:
        label = fmt.name + (f" ({fmt.rounding})" if is_stochastic(fmt.rounding) else "")
        paths.setdefault(plan(fmt, compile, chosen, cuda), []).append(label)
    words = "; ".join(f"{p} {', '.join(sorted(set(names)))}" for p, names in sorted(paths.items())) or "none"
    warning = " (WARNING: eager quantization on the GPU)" if cuda and "eager" in paths else ""
    broken = f" ({triton_failure()}: the torch path runs)" if triton_failure() and chosen == "auto" else ""
    return f"kernels {chosen}: {words}{warning}{broken}"
