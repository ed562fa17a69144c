"""Pretraining driver on megatron-core: arguments, presets, data, optimizer, checkpoints, HF import, loop."""
from megatron.quant.kernels import triton_failure

triton_failure()  # before megatron-core imports Triton itself: a broken install is hidden from it, not raised
