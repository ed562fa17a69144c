"""Figures of captured tensors: distributions/, heatmaps/, comparisons/, statistics/ and
attention_analysis/ (the original visualize_tensors.py folders), plus index.html.

    python script/visualize_tensors.py --tensor_dir ./tensor_logs --output_dir ./draw [filters]
"""
import sys

from megatron.quant.analysis.cli import main

if __name__ == "__main__":
    sys.exit(main(default_analyses=["basic"], description=__doc__.splitlines()[0]))
