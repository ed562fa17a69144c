"""The stages of the GPU check, in the order they run, with their estimates (seconds).

Adding a stage is one line here: ``Stage(name, run, summarize, estimate_s, dry_estimate_s)``, with
``run(Context) -> dict`` and ``summarize(dict) -> list[str]`` in a module of this package (the study
runner of issue #33 plugs in this way). The out folder holds a JSON per stage, summary.md and the log:
at most 8 files, so at most 6 stages.

The estimates are estimates, for a cold device machine (one H100, 16 cores, empty Triton and inductor
caches), derived from docs/results.md's H100 figures and the test counts:
- env: a process start with torch and CUDA (~10 s), our dependencies' imports (~5 s), a 1 GiB copy
  and an 8192^3 bf16 GEMM, 11 times each (< 1 s).
- correct: 478 tests marked ``device`` in tests/device and tests/kernels over 16 xdist workers, ~30 each:
  ~15 s of worker start, then compile-bound (cold Triton specializations, inductor for the compiled
  formats), ~4 s a test.
- kernels: 16 formats and variants x fp32/bf16; Triton and eager torch 4 cases each (mostly cached
  Triton compiles after ``correct``, ~0.3 s a row), torch.compile single-axis (a cold compile each,
  ~2 s); rows past the stage's deadline are listed as not reached.
- train: 9 runs (the baseline twice, 7 presets) of Llama 3.2 1B, ~23 s each: ~12 s to start and build
  the model and optimizer, ~5 s of cold kernel compiles, 6 steps of 0.5-0.9 s (bf16 0.514 s on
  2026-11-23), 2 profiled steps.
- capture: bench_saver at 1B widths and 2 layers, 3 rounds of 6 modes (one full iteration is ~5 GB
  at ~1.3 GB/s of disk) after a ~15 s start.
- study: what the stage asks for, not what it needs: the runner fits its runs to the time the stage is
  given (up to 1.5x this estimate). The anchor plan (docs/study/plan.yaml: a corpus of ~90 s, runs of
  132-197 s estimated) gets about one run in it; the first tier (--study-plan docs/study/first-tier.yaml:
  a 150 MB corpus, ~30 s, then the sizing's measuring waves, ~45 s) the rest for its 15 runs.
"""
from __future__ import annotations

from . import capture_stage, correct_stage, env_stage, kernels_stage, study_stage, train_stage
from .stage import Stage

# The dry run's estimates are generous: a shared 2-core machine under load takes several times a quiet one's.
STAGES: dict[str, Stage] = {stage.name: stage for stage in (
    Stage("env", env_stage.run, env_stage.summarize, estimate_s=20, dry_estimate_s=30),
    Stage("correct", correct_stage.run, correct_stage.summarize, estimate_s=150, dry_estimate_s=30),
    Stage("kernels", kernels_stage.run, kernels_stage.summarize, estimate_s=120, dry_estimate_s=30),
    Stage("train", train_stage.run, train_stage.summarize, estimate_s=210, dry_estimate_s=60),
    Stage("capture", capture_stage.run, capture_stage.summarize, estimate_s=60, dry_estimate_s=60),
    Stage("study", study_stage.run, study_stage.summarize, estimate_s=200, dry_estimate_s=90),
)}
DEFAULT_STAGES = ("env", "correct", "kernels", "train")
# what one device call holds: the default stages' estimates (500 s) and room for a stage to overrun
DEFAULT_BUDGET_S = 570
