"""The quantized layers: autograd GEMM functions (``ops``), megatron-core's tensor-parallel linear
layers and core attention with fake-quantized operands (``linear``, ``attention``), and the Llama
layer spec that puts them in a GPTModel (``spec``), and megatron-core's activation recompute
wrapped so that a recompute changes no bit (``recompute``).

Imports formats, recipes, ``position`` and ``tensor_saver``; nothing below it imports this package.
"""
from megatron.quant.kernels import triton_failure

triton_failure()  # before megatron-core imports Triton itself: a broken install is hidden from it, not raised
