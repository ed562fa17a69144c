"""Build every kernel specialization the formats launch for a Hopper (sm_90) target, without a GPU:
each kernel's Python is type-checked and lowered as the GPU compiler does, which Triton's
interpreter (the CPU tests) does not do. By default to Triton IR (seconds; test_gpu_build.py runs
it); with ``--cubin`` all the way through Triton's GPU passes, LLVM, PTX and ptxas (the ptxas in
Triton's wheel), reporting each specialization's registers, stack (spilled registers and local
arrays, in bytes per thread) and shared memory as ``cuobjdump -res-usage`` reads them from the
cubin, how many of its global loads and stores are vectorised, and its work model
(``bench.gpu.work_model``: bytes and SASS instructions a processed element, as ``nvdisasm`` reads the
cubin, against the H100's instruction budget) (minutes):

    python -m bench.gpu.kernel_build [--cubin] [--limit N] [--select TEXT ...] [--json PATH]

Runs in a process of its own (TRITON_INTERPRET unset, so the kernels are decorated for
compilation). Prints one line per specialization and exits 1 when one does not build.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton._C.libtriton import ir  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import native_specialize_impl  # noqa: E402

from bench.gpu.work_model import MODELLED, sass_counts, work_row  # noqa: E402
from megatron.quant.formats import get_format  # noqa: E402
from megatron.quant.kernels import accumulate, elementwise, history, launch, registry, triton_format  # noqa: E402
from megatron.quant.kernels import constants as kernel_constants  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
BACKEND = CUDABackend(TARGET)
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
NVDISASM = CUOBJDUMP.with_name("nvdisasm")
LAUNCH_OPTIONS = launch.launch_options(1)  # the keyword arguments of a launch that are compile options
GLOBAL_ACCESS = re.compile(r"\b(?:ld|st)\.global(?:\.[\w:]+)*?(\.v[24])?\.[bfsu]\d+")  # PTX loads and stores
RESOURCE = re.compile(r"\b(REG|STACK|SHARED|LOCAL):(\d+)")
FORMATS = [("bf16", {}), ("fp16", {}), ("fp8_e4m3", {}), ("fp8_e4m3", {"scaling": "none"}),
           ("fp8_e4m3", {"scaling": "delayed"}),
           ("fp8_e5m2", {"rounding": "stochastic"}), ("hifp8", {}),
           *[("mxfp8_e4m3", {"scale_mode": mode}) for mode in ("floor", "ceil", "even", "rceil")],
           ("mxfp4_e2m1", {"rounding": "stochastic"}), ("mxfp6_e3m2", {"nonfinite": "te"}),
           ("mxfp8_e4m3", {"block_shape": (32, 32)}), ("nvfp4", {}), ("nvfp4", {"rounding": "stochastic"}),
           ("nvfp4", {"block_shape": (16, 16)}), ("nvfp4", {"hadamard": 16, "nonfinite": "te"}),
           ("nvfp4", {"four_over_six": "mae", "e4m3_max": 256}),
           ("nvfp4", {"four_over_six": "mse", "block_shape": (16, 16)}),
           ("nvfp4", {"row_scaled": True}),
           ("fp8_e4m3", {"scaling": "block"}), ("fp8_e4m3", {"scaling": "block", "power_of_two_scales": False}),
           ("fp8_e4m3", {"scaling": "block", "block_shape": (128, 128)})]


class Recorder:
    """Stands in for a kernel: records each launch, with the call that made it, instead of running it."""

    def __init__(self, fn, launches: list, caller: list) -> None:
        self.fn, self.launches, self.caller = fn, launches, caller

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.caller[0], self.fn, args, kwargs))


CALLS = {"quantize axis -1": lambda f, x: f.quantize(x, -1), "quantize axis 0": lambda f, x: f.quantize(x, 0),
         "with counts": lambda f, x: f.quantize_with_stats(x, -1),
         "with full statistics": lambda f, x: f.quantize_with_stats(x, 0, full=True),
         "both axes": lambda f, x: f.quantize_for_gemm_both(x),
         "with amax": lambda f, x: f.quantize_for_gemm_with_amax(x, -1, torch.ones(())),
         "for the GEMM": lambda f, x: f.quantize_for_gemm(x, -1)}


def record_launches() -> list:
    """(call, kernel, args, kwargs) of every format's calls on small CPU tensors (which the kernels
    then serve), with the programs a GPU launches, not the interpreter's larger ones."""
    launches: list = []
    caller = [""]
    for kernel in registry.KERNELS:
        module = kernel.module()
        setattr(module, kernel.name, Recorder(getattr(module, kernel.name), launches, caller))
    launch.interpreting = triton_format.interpreting = lambda: True  # serve CPU tensors ...
    for kernel in registry.KERNELS:  # ... with the programs a GPU launches
        kernel.module().program_elements = lambda on_device: on_device
    for name, options in FORMATS:
        fmt = get_format(name, **options)
        twin = triton_format.TritonFormat(fmt, fmt)
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(64, 256).to(dtype)
            for call_name, call in CALLS.items():
                caller[0] = f"{fmt.name} {str(dtype).removeprefix('torch.')} {call_name}"
                try:
                    call(twin, x)
                except (RuntimeError, ValueError):  # the recorder wrote no outputs: later torch steps may fail
                    pass
    for algo in ("max", "most_recent"):  # delayed scaling's history update, given x's amax in x's dtype
        for dtype in (torch.bfloat16, torch.float32):
            caller[0] = f"amax history {algo} {str(dtype).removeprefix('torch.')}"
            history.updated_history(torch.zeros(1024), torch.ones(()), torch.ones((), dtype=dtype), algo)
    for kinds in (("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2")):  # the Hopper accumulation's GEMMs
        for fast in (True, False):
            caller[0] = f"hopper accumulation {'x'.join(kinds)} {'fast' if fast else 'promoted'}"
            accumulate.hopper_accumulate_kernel(torch.zeros(64, 256), torch.zeros(32, 256), kinds, fast)
    return launches


def specialization(fn, args, kwargs) -> tuple[dict, dict, dict]:
    """The signature, constexprs and attributes Triton's launcher compiles this launch under (its
    ``native_specialize_impl``: an integer equal to 1 becomes a constant, one divisible by 16 and a
    16-byte aligned pointer get ``tt.divisibility``, which lets loads and stores vectorise)."""
    values = {**dict(zip(fn.arg_names, args)), **kwargs}
    types, constants, attrs = {}, {}, {}
    for index, param in enumerate(fn.params):
        value = values[param.name]
        if param.is_constexpr:
            types[param.name], constants[param.name] = "constexpr", value
            continue
        kind, key = native_specialize_impl(BACKEND, value, param.is_const, not param.do_not_specialize,
                                           not param.do_not_specialize_on_alignment)
        types[param.name] = kind
        if kind == "constexpr":
            constants[param.name] = value
        elif isinstance(key, str) and key:
            attrs[(index,)] = BACKEND.parse_attr(key)
    return types, constants, attrs


def build_ir(fn, types: dict, constants: dict, attrs: dict, options: dict) -> dict:
    """Lower one specialization to Triton IR (front end only)."""
    parsed = BACKEND.parse_options(options)
    context = ir.context()
    ir.load_dialects(context)
    BACKEND.load_dialects(context)
    ASTSource(fn=fn, signature=types, constexprs=constants, attrs=attrs).make_ir(
        TARGET, parsed, BACKEND.get_codegen_implementation(parsed), BACKEND.get_module_map(), context)
    return {}


def build_cubin(fn, types: dict, constants: dict, attrs: dict, options: dict) -> dict:
    """Compile one specialization to a cubin; its resources per thread as ``cuobjdump`` reads them."""
    kernel = triton.compile(ASTSource(fn=fn, signature=types, constexprs=constants, attrs=attrs), target=TARGET,
                            options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([str(CUOBJDUMP), "-res-usage", cubin.name], capture_output=True, text=True,
                               check=True).stdout
        sass = subprocess.run([str(NVDISASM), "-c", cubin.name], capture_output=True, text=True, check=True).stdout
    found = {key.lower(): int(value) for key, value in RESOURCE.findall(usage)}
    memory = GLOBAL_ACCESS.findall(kernel.asm["ptx"])  # vectorised (.v2/.v4) or not: what bandwidth needs
    return {"registers": found["reg"], "stack_bytes": found["stack"], "local_bytes": found["local"],
            "shared_bytes": found["shared"], "num_warps": kernel.metadata.num_warps,
            "global_accesses": len(memory), "vector_accesses": sum(1 for vector in memory if vector),
            "sass": sass_counts(sass)}


def _label(constants: dict) -> str:
    """The specialization's constexprs that say what it does, shortly (grouped constants by their kind)."""
    grid = lambda g: kernel_constants.GRID_KINDS[g.kind]  # noqa: E731
    words = {"GRID": grid, "ELEMENT": grid,
             "SCALE": lambda s: kernel_constants.SCALE_KINDS[s.kind],
             "LAYOUT": lambda lay: f"{lay.block}x{lay.columns}{' tiled' if lay.tiled else ''}",
             "RHT": lambda r: 1 << r.log2 if r.log2 else None}
    shown = {k: words[k](v) if k in words else v for k, v in constants.items()
             if k in words or k in ("STOCHASTIC", "SCALED", "STATS", "BLOCK_SIZE", "BP", "AMAX_OUT")
             or (k in ("FOLD", "STRIDED") and v)}  # the per-tensor scale's two launches
    return " ".join(f"{k}={v}" for k, v in shown.items() if v is not None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cubin", action="store_true", help="compile to cubins and report their resources")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="build only the first N specializations")
    parser.add_argument("--select", nargs="+", default=None, metavar="TEXT",
                        help="build only specializations launched by a call whose label (format, input dtype, call) "
                             "starts with one of these, e.g. 'nvfp4 bfloat16' or 'fp8_e4m3 bfloat16 both axes'")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write one row per specialization")
    args = parser.parse_args(argv)
    build = build_cubin if args.cubin else build_ir
    launches, built, rows = record_launches(), set(), []
    sizes = {kwargs["BLOCK_SIZE"] for _, fn, _, kwargs in launches if fn.__name__ == "_elementwise_kernel"}
    if not sizes <= {elementwise.BLOCK, elementwise.FOLD_BLOCK}:
        print(f"FAILED: elementwise programs of {sorted(sizes)} elements recorded, not the GPU's {elementwise.BLOCK} "
              f"or {elementwise.FOLD_BLOCK}")
        return 1
    for call, fn, fn_args, kwargs in launches:
        types, constants, attrs = specialization(fn, fn_args, kwargs)
        key = (fn.__name__, tuple(types.items()), tuple((k, repr(v)) for k, v in constants.items()), repr(attrs))
        if key in built or (args.limit is not None and len(built) >= args.limit):
            continue
        if args.select is not None and not any(call.startswith(text) for text in args.select):
            continue
        built.add(key)
        row = {"kernel": fn.__name__, "first_launched_by": call, "constexprs": _label(constants)}
        started = time.monotonic()
        try:
            row.update(build(fn, types, constants, attrs, {k: kwargs[k] for k in LAUNCH_OPTIONS if k in kwargs}))
            resources = ""
            if args.cubin:
                tensors = [value for value in (*fn_args, *kwargs.values()) if isinstance(value, torch.Tensor)]
                sass = row.pop("sass")
                resources = (f" regs {row['registers']} stack {row['stack_bytes']} B shared {row['shared_bytes']} B "
                             f"vector accesses {row['vector_accesses']}/{row['global_accesses']} ")
                if fn.__name__ in MODELLED:
                    row.update(work_row(fn.__name__, constants, tensors, sass, row["num_warps"]))
                    resources += (f"{row['bytes_per_element']} B {row['instructions_per_element']} instructions an "
                                  f"element (budget {row['budget_per_element']})")
                else:  # a GEMM, not bound by the bytes it moves
                    row.update({"class": None, "sass_instructions": sass["instructions"]})
                    resources += f"{sass['instructions']} instructions (no work model: not a quantization)"
            print(f"built  {fn.__name__} ({call}){resources}  {row['constexprs']}", flush=True)
        except Exception:
            row["error"] = traceback.format_exc()[-3000:]
            print(f"FAILED {fn.__name__} ({call}) {constants}\n{row['error']}", flush=True)
        row["seconds"] = round(time.monotonic() - started, 1)
        rows.append(row)
    failed = sum("error" in row for row in rows)
    spilling = [row for row in rows if row.get("stack_bytes")]
    print(f"{len(built)} specializations, {failed} failed" + (
        f"; {len(spilling)} use stack (registers spilled or local arrays)" if args.cubin else ""))
    if args.json is not None:
        args.json.write_text(json.dumps({"triton": triton.__version__, "target": "sm_90", "cubin": args.cubin,
                                         "rows": rows}, indent=1) + "\n")
    return 1 if failed or not built else 0


if __name__ == "__main__":
    sys.exit(main())
