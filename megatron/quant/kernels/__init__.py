"""Triton quantization kernels under the format interface (``formats.interface.QuantFormat``), chosen per tensor.

    fmt = kernels.wrap(get_format("fp8_e4m3"), compile=False)   # what the recipes hand the layers
    y = fmt.quantize(x)       # Triton on CUDA tensors (CUSTOM_QUANT_KERNELS), the torch path on CPU

``select`` decides (``CUSTOM_QUANT_KERNELS=auto|torch|compile|triton``), ``dispatch.wrap`` builds the
format it chose, ``launch`` holds every kernel's launch rules; the Triton modules are imported only
when a kernel is used, so this package imports without Triton. The formats in
``megatron.quant.formats`` are the reference: every kernel gives their bits.
"""
from .dispatch import wrap
from .launch import interpreting
from .select import BACKENDS, ENV, backend, describe, plan, supported, triton_available, triton_failure

__all__ = ["BACKENDS", "ENV", "backend", "describe", "interpreting", "plan", "supported", "triton_available",
           "triton_failure", "wrap"]
