#!/usr/bin/env python3
"""Capture chosen layers' input/output under every mode on one input (see megatron.quant.compare)."""
import sys

from megatron.quant.compare.run_layer_io import main

if __name__ == "__main__":
    sys.exit(main())
