#!/usr/bin/env python3
"""What-if re-quantization of captured tensors with several formats (see megatron.quant.compare)."""
import sys

from megatron.quant.compare.run_whatif import main

if __name__ == "__main__":
    sys.exit(main())
