"""Enhanced analysis of captured tensors: quantization_analysis/, layer_analysis/,
overflow_analysis/, fp8_analysis/, bf16_analysis/, backward_analysis/, rank_analysis/,
exponent_analysis/ and training_trends/, plus index.html.

    python script/visualization/enhanced_tensor_visualizer.py --tensor_dir ./tensor_logs \\
        --output_dir ./draw [filters]
"""
import sys

from megatron.quant.analysis.cli import main

if __name__ == "__main__":
    sys.exit(main(default_analyses=["enhanced"], description=__doc__.splitlines()[0]))
