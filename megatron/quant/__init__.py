"""megatron.quant: fake-quantized GEMM operands for megatron-core, tensor capture and analysis.

Sub-packages are imported on demand; ``megatron.quant.formats`` never imports Megatron.
"""

__version__ = "0.1.0"
