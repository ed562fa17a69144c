#!/usr/bin/env python
"""JSONL -> megatron-core indexed dataset; see ``megatron.quant.training.preprocess``."""
from megatron.quant.training.preprocess import main

if __name__ == "__main__":
    main()
