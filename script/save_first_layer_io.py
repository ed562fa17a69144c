#!/usr/bin/env python3
"""Capture chosen layers' input/output under every mode on one input (see megatron.quant.compare)."""
import sys

from megatron.quant import notices

notices.hide_known()  # before megatron-core is imported: its known start-up notices stay quiet
from megatron.quant.compare.run_layer_io import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
