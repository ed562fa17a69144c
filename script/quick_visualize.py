"""Quick look at captured tensors: quick_analysis.png, tensor_stats.txt and index.html.

    python script/quick_visualize.py --tensor_dir ./tensor_logs --output_dir ./draw [filters]
"""
import sys

from megatron.quant.analysis.cli import main

if __name__ == "__main__":
    sys.exit(main(default_analyses=["quick"], description=__doc__.splitlines()[0]))
