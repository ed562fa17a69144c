"""Builds the flash attention kernels' specializations for a Hopper GPU (Triton IR, sm_90) as
``bench.gpu.kernel_build`` builds the formats' kernels: the interpreter runs a kernel's Python without
the GPU compiler's type checks. Run by test_flash_attention.py in a process of its own:

    python -m tests.kernels._flash_build

Prints one line per specialization and exits 1 when one does not build."""
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)  # before any kernel module: decorated for compilation

import torch  # noqa: E402

from bench.gpu.kernel_build import LAUNCH_OPTIONS, build_ir, specialization  # noqa: E402
from megatron.quant.formats import get_format  # noqa: E402
from megatron.quant.kernels import flash_attention, flash_attention_backward  # noqa: E402
from megatron.quant.kernels.flash_attention_formats import tile_formats  # noqa: E402

KERNELS = ((flash_attention, "_flash_forward_kernel"), (flash_attention_backward, "_flash_dq_kernel"),
           (flash_attention_backward, "_flash_dkdv_kernel"))
# (P's and dS's format, input dtype, causal): an elementwise grid with float32 dots, MX blocks with bf16 dots and
# with float32 dots (dK/dV's 32 x 32 tiles: one block along the queries)
CASES = (("hifp8", torch.float32, True), ("mxfp4_e2m1", torch.bfloat16, False), ("mxfp4_e2m1", torch.float32, True))


def record_launches() -> list:
    """(kernel, args, kwargs) of the kernels' launches for ``CASES``, as a GPU launches them."""
    launches: list = []
    for module, name in KERNELS:
        fn = getattr(module, name)
        setattr(module, name, type("Recorder", (), {"__getitem__": lambda self, grid, fn=fn: (
            lambda *args, **kwargs: launches.append((fn, args, kwargs)))})())
    flash_attention.interpreting = lambda: False  # CPU tensors, the GPU's choice of dots
    for fmt_name, dtype, causal in CASES:
        fmt = get_format(fmt_name)
        formats = tile_formats(fmt, fmt, fmt, fmt)
        q, k = torch.zeros(128, 2, 4, 64, dtype=dtype), torch.zeros(128, 2, 2, 64, dtype=dtype)
        _, m, total = flash_attention.flash_forward(q, k, k, 0.125, causal, formats.probs)
        operands = dict(query=q, key=k, value=k, grad_output=q, key_by_keys=k, query_by_queries=q,
                        grad_output_by_queries=q)
        flash_attention_backward.flash_backward(operands, m, total, 0.125, causal, formats)
    return launches


def main() -> int:
    failed = 0
    for fn, args, kwargs in record_launches():
        types, constants, attrs = specialization(fn, args, kwargs)
        try:
            build_ir(fn, types, constants, attrs, {k: kwargs[k] for k in LAUNCH_OPTIONS if k in kwargs})
            print(f"built  {fn.__name__} BF16={constants['BF16']} CAUSAL={constants['CAUSAL']}", flush=True)
        except Exception as error:  # noqa: BLE001  (every failure is reported, then counted)
            failed += 1
            print(f"FAILED {fn.__name__} {constants}: {error}", flush=True)
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
