"""Build every kernel specialization the formats launch into Triton IR for a Hopper (sm_90) target,
without a GPU: each kernel's Python is type-checked and lowered as the GPU compiler does, which
Triton's interpreter (the CPU tests) does not do. Run by test_gpu_build.py in a process of its own
(TRITON_INTERPRET unset, so the kernels are decorated for compilation):

    python -m bench.gpu.kernel_build

Prints one line per specialization and exits 1 when one does not build.
"""
import os
import sys
import traceback

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
from triton._C.libtriton import ir  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from megatron.quant.formats import get_format  # noqa: E402
from megatron.quant.kernels import amax, blocks, elementwise, launch, triton_format  # noqa: E402

KERNELS = ((amax, "_amax_kernel"), (blocks, "_block_kernel"), (blocks, "_dual_kernel"),
           (elementwise, "_elementwise_kernel"))
FORMATS = [("bf16", {}), ("fp16", {}), ("fp8_e4m3", {}), ("fp8_e4m3", {"scaling": "none"}),
           ("fp8_e4m3", {"scaling": "delayed"}),
           ("fp8_e5m2", {"rounding": "stochastic"}), ("hifp8", {}),
           *[("mxfp8_e4m3", {"scale_mode": mode}) for mode in ("floor", "ceil", "even", "rceil")],
           ("mxfp4_e2m1", {"rounding": "stochastic"}), ("mxfp6_e3m2", {"nonfinite": "te"}),
           ("mxfp8_e4m3", {"block_shape": (32, 32)}), ("nvfp4", {}), ("nvfp4", {"rounding": "stochastic"}),
           ("nvfp4", {"block_shape": (16, 16)}), ("nvfp4", {"hadamard": 16, "nonfinite": "te"}),
           ("fp8_e4m3", {"scaling": "block"}), ("fp8_e4m3", {"scaling": "block", "power_of_two_scales": False}),
           ("fp8_e4m3", {"scaling": "block", "block_shape": (128, 128)})]
POINTERS = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float64: "*fp64"}


class Recorder:
    """Stands in for a kernel: records each launch instead of running it."""

    def __init__(self, fn, launches: list) -> None:
        self.fn, self.launches = fn, launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.fn, args, kwargs))


def record_launches() -> list:
    """The launches of every format's calls on small CPU tensors (which the kernels then serve)."""
    launches: list = []
    for module, name in KERNELS:
        setattr(module, name, Recorder(getattr(module, name), launches))
    launch.interpreting = triton_format.interpreting = lambda: True  # serve CPU tensors
    for module in (amax, blocks, elementwise):  # ... with the programs a GPU launches, not the interpreter's
        module.program_elements = lambda on_device: on_device
    for name, options in FORMATS:
        fmt = get_format(name, **options)
        twin = triton_format.TritonFormat(fmt, fmt)
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(64, 256).to(dtype)
            for call in (lambda: twin.quantize(x, -1), lambda: twin.quantize(x, 0),
                         lambda: twin.quantize_with_stats(x, -1), lambda: twin.quantize_with_stats(x, 0, full=True),
                         lambda: twin.quantize_for_gemm_both(x),
                         lambda: twin.quantize_for_gemm_with_amax(x, -1, torch.ones(())),
                         lambda: twin.quantize_for_gemm(x, -1)):
                try:
                    call()
                except (RuntimeError, ValueError):  # the recorder wrote no outputs: later torch steps may fail
                    pass
    return launches


def signature(fn, args, kwargs) -> tuple[dict, dict]:
    values = {**dict(zip(fn.arg_names, args)), **kwargs}
    types, constants = {}, {}
    for param in fn.params:
        value = values[param.name]
        if param.is_constexpr:
            types[param.name], constants[param.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            types[param.name] = POINTERS[value.dtype]
        elif isinstance(value, bool):
            types[param.name] = "i1"
        elif isinstance(value, int):
            types[param.name] = "i64" if abs(value) >= 2**31 else "i32"
        else:
            types[param.name] = "fp32"
    return types, constants


def main() -> int:
    target = GPUTarget("cuda", 90, 32)
    backend = CUDABackend(target)
    launches, built, failed = record_launches(), set(), 0
    for fn, args, kwargs in launches:
        types, constants = signature(fn, args, kwargs)
        key = (fn.__name__, tuple(types.items()), tuple((k, repr(v)) for k, v in constants.items()))
        if key in built:
            continue
        built.add(key)
        options = backend.parse_options({key: kwargs[key] for key in launch.EXACT_ARITHMETIC})
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        try:
            ASTSource(fn=fn, signature=types, constexprs=constants).make_ir(
                target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context)
            print(f"built  {fn.__name__} {constants}")
        except Exception:
            failed += 1
            print(f"FAILED {fn.__name__} {constants}\n{traceback.format_exc()}")
    print(f"{len(built)} specializations, {failed} failed")
    return 1 if failed or not built else 0


if __name__ == "__main__":
    sys.exit(main())
