"""Format comparison on the same inputs.

- layer I/O across modes (``run_layer_io``): one fixed input through the model under fp32
  (the reference), bf16 and fake-quantized formats, capturing chosen layers' input/output;
- what-if re-quantization (``run_whatif``): captured high-precision tensors re-quantized
  with several formats along their GEMM's block axis, or with recipe presets, each GEMM
  operand a tensor feeds with the preset's format for it.
"""
