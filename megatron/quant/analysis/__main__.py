"""``python -m megatron.quant.analysis --tensor_dir DIR --output_dir DIR [filters]``: every analysis."""
import sys

from megatron.quant.analysis.cli import main

sys.exit(main(prog="python -m megatron.quant.analysis"))
