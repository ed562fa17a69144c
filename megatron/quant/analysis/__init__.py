"""Reading tensor captures (docs/interfaces.md section 2), figures and the HTML report.

Entry points: ``python -m megatron.quant.analysis`` (every analysis), the scripts in
``script/`` (thin wrappers over :func:`megatron.quant.analysis.cli.main`), and
:func:`megatron.quant.analysis.captures.pipeline.run_report` from Python.
"""
