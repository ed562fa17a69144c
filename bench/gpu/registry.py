"""The stages of the GPU check, in the order they run, with their estimates (seconds).

Adding a stage is one line here: ``Stage(name, run, summarize, estimate_s, dry_estimate_s)``, with
``run(Context) -> dict`` and ``summarize(dict) -> list[str]`` in a module of this package (the study
runner of issue #33 plugs in this way). The out folder holds a JSON per stage, summary.md and the log:
at most 8 files, so at most 6 stages.

The estimates are the stage times measured on a cold GPU machine (one H200, 16 cores, empty Triton
and inductor caches; bench/results/gpu_check_nvidia-h200/, 2026-11-27), rounded up:
- env: 22 s (a process start with torch and CUDA, our dependencies' imports, a 1 GiB copy and an
  8192^3 bf16 GEMM, 11 times each).
- correct: stopped at 226 s after about 89 % of the tests marked ``device`` in tests/device and
  tests/kernels over 16 xdist workers: about 260 s, compile-bound (cold Triton specializations in
  every worker, inductor for the compiled formats).
- kernels: 172 s for 32 formats and variants x 9 cases (Triton, eager torch, torch.compile).
- train: 333 s for 9 runs of Llama 3.2 1B (the baseline twice, 7 presets; 22-36 s each: start-up, model
  and optimizer, cold compiles, 6 steps) and the mixture of experts' 2 runs (46-50 s each); every run
  profiles 2 more steps since (about 2 s a run more).
- capture (not measured yet): bench_saver at 1B widths and 2 layers, 3 rounds of 6 modes after a ~15 s start.
- study: the runner fits its runs to the time the stage is given, so the stage runs whenever 150 s
  are left (a corpus and one wave of the first tier, warm) and takes the budget's rest; 400 s is what
  the first tier took with its sizing on a cold H200. The anchor tier (docs/study/anchor-3m.yaml, the
  default: a corpus of up to ~120 s, waves of 5 runs of 144-290 s) gets one wave in it; the first tier
  (--study-plan docs/study/first-tier.yaml)
  needs about 400 s: a corpus (~20 s), the sizing's three measuring waves (~45 s each on a cold
  machine, mostly start-up) and its 15 runs in 3 waves (~200 s at the smallest size).

env, correct, kernels and train take about 12 minutes, more than one 10-minute run: the default is
env, kernels and train (how fast), and ``--stage correct`` is a second call (docs/gpu.md).
"""
from __future__ import annotations

from . import capture_stage, correct_stage, env_stage, kernels_stage, study_stage, train_stage
from .stage import Stage

# The dry run's estimates are generous: a shared 2-core machine under load takes several times a quiet one's.
STAGES: dict[str, Stage] = {stage.name: stage for stage in (
    Stage("env", env_stage.run, env_stage.summarize, estimate_s=25, dry_estimate_s=30),
    Stage("correct", correct_stage.run, correct_stage.summarize, estimate_s=260, dry_estimate_s=30),
    Stage("kernels", kernels_stage.run, kernels_stage.summarize, estimate_s=180, dry_estimate_s=30),
    Stage("train", train_stage.run, train_stage.summarize, estimate_s=360, dry_estimate_s=90),
    Stage("capture", capture_stage.run, capture_stage.summarize, estimate_s=60, dry_estimate_s=60),
    Stage("study", study_stage.run, study_stage.summarize, estimate_s=400, dry_estimate_s=90, fits_itself_from_s=150),
)}
# One run of the check: how fast (kernels first, on a machine nothing else has used yet, then the presets'
# training steps); the correct stage (about 260 s) is the second call.
DEFAULT_STAGES = ("env", "kernels", "train")
# what one 10-minute run holds: the default stages' estimates (565 s)
DEFAULT_BUDGET_S = 570
