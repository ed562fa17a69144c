"""Internals of ``megatron.quant.tensor_saver``: configuration, file naming, capture session, writer.

Callers use the facade ``megatron.quant.tensor_saver``; these modules are its parts.
"""
