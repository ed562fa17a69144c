"""Pretraining driver on megatron-core: arguments, presets, data, optimizer, checkpoints, HF import, loop."""
