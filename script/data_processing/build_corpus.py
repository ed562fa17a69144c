#!/usr/bin/env python
"""A train/validation text corpus from a directory of text files (default: the Python standard
library) -> JSONL and indexed dataset; see ``megatron.quant.lab.corpus``."""
import sys

from megatron.quant.lab.corpus import main

if __name__ == "__main__":
    sys.exit(main())
