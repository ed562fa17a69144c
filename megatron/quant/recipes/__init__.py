"""What is quantized, and how: recipes, presets, operand names, layer selectors, delayed scaling.

Imports only ``megatron.quant.formats`` (and megatron-core's parallel state for the amax group):
capture, the layers and training build on it. ``python -m megatron.quant.recipes show`` prints
what a recipe quantizes.
"""
