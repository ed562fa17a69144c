"""The GPU check: what one GPU machine runs in a given time, as stages under one wall budget.

``bench/gpu_check.py`` is its command line; ``registry.STAGES`` lists the stages and their
estimates; ``runner.run_stages`` runs them, skipping what would not fit and killing what overruns;
each stage writes ``<stage>.json`` and the run one ``summary.md`` (docs/gpu.md).
"""
