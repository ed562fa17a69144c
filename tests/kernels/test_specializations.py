"""Triton compiles a kernel once per specialisation: its constexprs, its arguments' types, and what it
specialises plain arguments on (an integer equal to 1 or divisible by 16, 32- or 64-bit; a pointer's
16-byte alignment). A training run must see every specialisation in its first iteration and no new
one after it, or every later step would pay a compile on a GPU. Here two steps of a tiny model
(the second with other samples, so other stochastic-rounding keys) run the kernels in Triton's
interpreter while each launch's key is computed as Triton's launcher computes it
(``native_specialize_impl``, for an sm_90 target). Capture iterations add the statistics kernels'
specialisations on purpose (capture is off here)."""
import pytest

from megatron.quant.training import loop

triton = pytest.importorskip("triton", reason="Triton does not import here: its kernels are not tested")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.runtime.jit import JITFunction, native_specialize_impl  # noqa: E402

from megatron.quant.kernels.registry import KERNELS  # noqa: E402

ARGV = ["--model", "llama-tiny", "--mock-data", "--num-layers", "1", "--hidden-size", "64", "--ffn-hidden-size",
        "128", "--num-attention-heads", "2", "--num-query-groups", "1", "--seq-length", "32",
        "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "2", "--log-interval", "2",
        "--eval-iters", "0", "--lr", "1e-3", "--seed", "1"]


class Specialising:
    """Stands in for an interpreted kernel: runs it, and records the key each launch compiles under."""

    def __init__(self, kernel, keys: dict, iteration: list, backend):
        self.kernel, self.keys, self.iteration, self.backend = kernel, keys, iteration, backend
        self.jit = JITFunction(kernel.fn, **kernel.kwargs)  # its params: constexpr / do_not_specialize flags

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            values = {**dict(zip(self.jit.arg_names, args)), **kwargs}
            key = [self.kernel.fn.__name__]
            for p in self.jit.params:
                value = values[p.name]
                key.append(("constexpr", repr(value)) if p.is_constexpr else native_specialize_impl(
                    self.backend, value, p.is_const, not p.do_not_specialize, not p.do_not_specialize_on_alignment))
            key.append(tuple(sorted((k, repr(v)) for k, v in values.items() if k not in self.jit.arg_names)))
            self.keys.setdefault(tuple(key), self.iteration[0])
            return self.kernel[grid](*args, **kwargs)
        return launch


@pytest.mark.slow  # a training run
@pytest.mark.parametrize("recipe", ["mxfp4+sr+rht"])  # block, dual-axis, SR and Hadamard kernels
def test_no_kernel_specialisation_is_new_after_the_first_iteration(monkeypatch, kernel_device, recipe):
    from megatron.quant.training.main import main

    keys: dict = {}  # specialisation -> the iteration that first launched it
    iteration = [0]
    backend = CUDABackend(GPUTarget("cuda", 90, 32))
    for kernel in KERNELS:
        module = kernel.module()
        monkeypatch.setattr(module, kernel.name, Specialising(getattr(module, kernel.name), keys, iteration, backend))
    step = loop.train_step

    def train_step(run, i):
        iteration[0] = i
        return step(run, i)

    monkeypatch.setattr(loop, "train_step", train_step)
    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "triton")
    monkeypatch.setenv("CUSTOM_QUANT_TYPE", recipe)
    main(ARGV)
    assert keys and set(keys.values()) >= {0}
    late = [key[0] for key, first in keys.items() if first > 0]
    assert not late, f"{len(late)} specialisations first launched after iteration 0: {late}"
