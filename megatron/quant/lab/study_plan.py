"""A study plan (``docs/study/plan.yaml``): the model, data, recipes, seeds, the order their runs go in, and how
long each run takes, read and checked before anything runs. A run is (recipe, seed), named as the sweep names it:
the first seed's run after the recipe (``te-nvfp4``), the others ``<recipe>-seed<N>``. ``order`` is a list of
stages ``{recipes: [...] | all, seeds: [...]}``, each run seed by seed, naming every run exactly once. A run's time
is estimated from the FLOPs of an iteration, an assumed throughput and a per-recipe overhead, or taken from
``step_time.measured.step_s`` once a GPU has measured the recipe. ``runs_at_once`` runs share the GPU, in waves of
the order, each ``step_time.measured.shared_slowdown[K]`` times as long as alone (K until measured). A plan still
to be sized must hold the lines the sizing writes into (checked at load). Bad plans raise ``StudyPlanError``, one
line naming the key and the value."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from megatron.quant.lab.plan_checks import flags_problem, recipe_problem, sized_lines_problem
from megatron.quant.lab.plan_reader import PlanReader, StudyPlanError
from megatron.quant.lab.sweep_plan import SEED_SUFFIX
from megatron.quant.training import metrics
from megatron.quant.training.env import environment_problem
from megatron.quant.training.presets import get_preset
from megatron.quant.yaml_safe import YamlError, load_yaml, read_text_file

VERSION = 1
ALL = "all"
_KEYS = ("version", "name", "model", "micro_batch_size", "global_batch_size", "train_iters", "log_interval",
         "eval_interval", "eval_iters", "training_flags", "environment", "data", "recipes", "seeds", "order",
         "step_time", "runs_at_once", "sizing", "target_interval", "power_from")
SHAPE_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups")
VALIDATION_COST = 1 / 3  # of a training iteration: forward only
MAX_RUNS_AT_ONCE = 8  # processes sharing one GPU; beyond that the study model's memory and the CPU cores run out
_DATA_KEYS = ("site_packages", "max_bytes", "valid_fraction", "seed", "tokenizer_vocab", "tokenizer_train_bytes")
# Flags the plan sets from its own keys (or the runner per run): refused in training_flags.
_SHAPE_FLAGS = {key: f"--{key.replace('_', '-')}" for key in SHAPE_KEYS}
_OWN_FLAGS = (*_SHAPE_FLAGS.values(), "--model", "--seq-length", "--max-position-embeddings", "--micro-batch-size",
              "--global-batch-size", "--train-iters", "--log-interval", "--eval-interval", "--eval-iters", "--seed",
              "--data-path", "--split", "--tokenizer-type", "--tokenizer-model", "--save-interval")


@dataclass(frozen=True)
class PlannedRun:
    recipe: str
    seed: int
    name: str


@dataclass(frozen=True)
class DataSpec:
    site_packages: bool
    max_bytes: int | None
    valid_fraction: float
    seed: int
    tokenizer_vocab: int
    tokenizer_train_bytes: int | None


@dataclass(frozen=True)
class Sizing:
    """A tier sized on the device (lab/study_sizing.py): ``candidates`` smallest first, two of them
    ``measured``, ``alone`` the recipe also measured without company; ``fixed_on`` once a device sized it."""
    candidates: tuple[str, ...]
    measured: tuple[str, str]
    alone: str
    tokens_per_parameter: float
    measure_iters: int
    fixed_on: str | None


@dataclass(frozen=True)
class StepEstimate:
    tflops: float
    startup_s: float
    default_overhead: float
    overhead: Mapping[str, float]
    measured_device: str | None
    measured_step_s: Mapping[str, float]
    shared_slowdown: Mapping[int, float]  # K runs at once -> how many times as long each takes as alone


@dataclass(frozen=True)
class StudyPlan:
    path: Path
    name: str
    preset: str
    seq_length: int
    micro_batch_size: int
    global_batch_size: int
    train_iters: int
    log_interval: int
    eval_interval: int
    eval_iters: int
    training_flags: tuple[str, ...]
    environment: Mapping[str, str]
    data: DataSpec
    recipes: tuple[str, ...]
    seeds: tuple[int, ...]
    order: tuple[PlannedRun, ...]
    step_time: StepEstimate
    runs_at_once: int = 1
    sizing: Sizing | None = None
    shape_override: Mapping[str, int] = field(default_factory=dict)  # model.shape: the preset's shape changed
    target_interval: float | None = None  # the paired 95 % half-width asked for (relative); None: the seeds given
    power_from: str | None = None  # the study whose paired spread sizes the seeds (None: this one)

    @property
    def shape(self) -> dict:
        return {**get_preset(self.preset), **self.shape_override}

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch_size * self.seq_length

    @property
    def tokens_per_run(self) -> int:
        return self.train_iters * self.tokens_per_iteration

    @property
    def non_embedding_parameters(self) -> int:
        return non_embedding_parameters(self.shape)

    @property
    def tokens_per_parameter(self) -> float:
        return self.tokens_per_run / self.non_embedding_parameters

    @property
    def flops_per_iteration(self) -> float:
        return metrics.flops_per_iteration(self.shape, global_batch_size=self.global_batch_size,
                                           seq_length=self.seq_length, vocab_size=self.shape["vocab_size"])

    def step_seconds(self, recipe: str) -> float:
        """Seconds per iteration of ``recipe``: measured on a GPU when the plan has it, else estimated."""
        measured = self.step_time.measured_step_s.get(recipe)
        if measured is not None:
            return measured
        overhead = self.step_time.overhead.get(recipe, self.step_time.default_overhead)
        return self.flops_per_iteration / (self.step_time.tflops * 1e12) * overhead

    def iteration_equivalents(self, iterations: int) -> float:
        """``iterations`` training iterations and their validations, in training iterations (a
        validation iteration costs ``VALIDATION_COST`` of one)."""
        return iterations + iterations // self.eval_interval * self.eval_iters * VALIDATION_COST

    def run_seconds(self, recipe: str) -> float:
        """A whole run of ``recipe``: start-up, training and validation."""
        return self.step_time.startup_s + self.iteration_equivalents(self.train_iters) * self.step_seconds(recipe)

    def slowdown(self, at_once: int) -> float:
        """How many times as long a run takes when ``at_once`` runs share the GPU: measured at that
        many or more, else the largest measured throughput's, else ``at_once`` (no gain assumed)."""
        measured, above = self.step_time.shared_slowdown, [k for k in self.step_time.shared_slowdown if k >= at_once]
        if at_once == 1 or not measured:
            return float(at_once)
        # fewer runs share the GPU no worse than more did; more gain nothing beyond the largest K's throughput
        return measured[min(above)] if above else measured[max(measured)] * at_once / max(measured)

    def wave_seconds(self, recipes: Sequence[str]) -> float:
        """A wave of runs that share the GPU: its slowest run, slowed by the sharing."""
        return max(self.run_seconds(recipe) for recipe in recipes) * self.slowdown(len(recipes))

    def model_flags(self) -> list[str]:
        return ["--model", self.preset, "--seq-length", str(self.seq_length), "--max-position-embeddings",
                str(self.seq_length), "--micro-batch-size", str(self.micro_batch_size), "--global-batch-size",
                str(self.global_batch_size), "--train-iters", str(self.train_iters), "--log-interval",
                str(self.log_interval), "--eval-interval", str(self.eval_interval), "--eval-iters",
                str(self.eval_iters), "--save-interval", str(self.train_iters),
                *(arg for key, value in self.shape_override.items() for arg in (_SHAPE_FLAGS[key], str(value)))]


def non_embedding_parameters(shape: Mapping) -> int:
    """Parameters outside the embeddings (and untied output layer): what tokens per parameter count."""
    embeddings = shape["vocab_size"] * shape["hidden_size"] * (2 if shape["untie_embeddings_and_output_weights"] else 1)
    return metrics.num_parameters(shape) - embeddings


def waves(runs: Sequence[PlannedRun], at_once: int) -> list[list[PlannedRun]]:
    """``runs`` in order, ``at_once`` to a wave (the last may be smaller)."""
    return [list(runs[i:i + at_once]) for i in range(0, len(runs), at_once)]


def run_name(recipe: str, seed: int, seeds: Sequence[int]) -> str:
    return recipe if seed == seeds[0] else f"{recipe}{SEED_SUFFIX}{seed}"


def _seeds(read: PlanReader, value: Any, key: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise read.fail(key, f"expected a non-empty list of integer seeds, got {value!r}")
    seeds = [read.integer(seed, key, minimum=0) for seed in value]
    duplicates = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if duplicates:
        raise read.fail(key, f"seed(s) {', '.join(map(str, duplicates))} given twice")
    return seeds


def _order(read: PlanReader, value: Any, recipes: list[str], seeds: list[int]) -> list[PlannedRun]:
    if not isinstance(value, list) or not value:
        raise read.fail("order", f"expected a non-empty list of stages {{recipes, seeds}}, got {value!r}")
    runs: list[PlannedRun] = []
    for i, stage in enumerate(value):
        key = f"order[{i}]"
        stage = read.mapping(stage, key, ("recipes", "seeds"))
        names = recipes if stage.get("recipes") == ALL else read.names(stage.get("recipes"), f"{key}.recipes")
        unknown = [name for name in names if name not in recipes]
        if unknown:
            raise read.fail(f"{key}.recipes", f"{', '.join(unknown)} not among the plan's recipes "
                                              f"({', '.join(recipes)})")
        stage_seeds = _seeds(read, stage.get("seeds"), f"{key}.seeds")
        strange = [seed for seed in stage_seeds if seed not in seeds]
        if strange:
            raise read.fail(f"{key}.seeds", f"seed(s) {', '.join(map(str, strange))} not among the plan's seeds "
                                            f"({', '.join(map(str, seeds))})")
        for seed in stage_seeds:
            for recipe in names:
                run = PlannedRun(recipe, seed, run_name(recipe, seed, seeds))
                if run in runs:
                    raise read.fail(key, f"run {run.name} (recipe {recipe}, seed {seed}) is already in an "
                                         f"earlier stage")
                runs.append(run)
    ordered = {run.name for run in runs}
    missing = [run_name(r, s, seeds) for s in seeds for r in recipes if run_name(r, s, seeds) not in ordered]
    if missing:
        raise read.fail("order", f"leaves out run(s) {', '.join(missing)}; every recipe x seed must be ordered")
    return runs


def _flags(read: PlanReader, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(flag, str) for flag in value):
        raise read.fail("training_flags", f"expected a list of strings, got {value!r}")
    if problem := flags_problem(value, _OWN_FLAGS):
        raise read.fail("training_flags", problem)
    return tuple(value)


def _step_time(read: PlanReader, value: Any) -> StepEstimate:
    value = read.mapping(value, "step_time", ("estimate", "measured"))
    estimate = read.mapping(value.get("estimate"), "step_time.estimate",
                            ("tflops", "startup_s", "default_overhead", "overhead"))
    measured = read.mapping(value.get("measured") or {}, "step_time.measured", ("device", "step_s", "shared_slowdown"))
    overhead = read.mapping(estimate.get("overhead") or {}, "step_time.estimate.overhead")
    step_s = read.mapping(measured.get("step_s") or {}, "step_time.measured.step_s")
    device = measured.get("device")
    if device is not None and not isinstance(device, str):
        raise read.fail("step_time.measured.device", f"expected a device name or null, got {device!r}")
    shared = read.mapping(measured.get("shared_slowdown") or {}, "step_time.measured.shared_slowdown")
    if (step_s or shared) and device is None:
        raise read.fail("step_time.measured.device", "measured step times need the device they were measured on")
    for at_once in shared:
        read.integer(at_once, "step_time.measured.shared_slowdown", minimum=2)
    return StepEstimate(
        tflops=read.number(estimate.get("tflops"), "step_time.estimate.tflops"),
        startup_s=read.number(estimate.get("startup_s"), "step_time.estimate.startup_s"),
        default_overhead=read.number(estimate.get("default_overhead"), "step_time.estimate.default_overhead"),
        overhead={str(k): read.number(v, f"step_time.estimate.overhead.{k}") for k, v in overhead.items()},
        measured_device=device,
        measured_step_s={str(k): read.number(v, f"step_time.measured.step_s.{k}") for k, v in step_s.items()},
        shared_slowdown={k: read.number(v, f"step_time.measured.shared_slowdown.{k}") for k, v in shared.items()})


def _data(read: PlanReader, value: Any) -> DataSpec:
    data = read.mapping(value, "data", _DATA_KEYS)
    optional = {key: read.integer(data[key], f"data.{key}") if data.get(key) is not None else None
                for key in ("max_bytes", "tokenizer_train_bytes")}
    if not isinstance(data.get("site_packages", False), bool):
        raise read.fail("data.site_packages", f"expected true or false, got {data['site_packages']!r}")
    return DataSpec(site_packages=data.get("site_packages", False),
                    valid_fraction=read.number(data.get("valid_fraction"), "data.valid_fraction", high=1.0),
                    seed=read.integer(data.get("seed"), "data.seed", minimum=0),
                    tokenizer_vocab=read.integer(data.get("tokenizer_vocab"), "data.tokenizer_vocab", minimum=257),
                    **optional)


def _sizing(read: PlanReader, value: Any, preset: str, seq_length: int, recipes: list[str], vocab: int) -> Sizing:
    value = read.mapping(value, "sizing", ("candidates", "measured", "alone", "tokens_per_parameter", "measure_iters",
                                           "fixed_on"))
    candidates = read.names(value.get("candidates"), "sizing.candidates")
    try:
        shapes = {name: get_preset(name) for name in candidates}
    except ValueError as error:
        raise read.fail("sizing.candidates", str(error)) from error
    for name in candidates:
        if shapes[name]["vocab_size"] != vocab or shapes[name]["max_position_embeddings"] < seq_length:
            raise read.fail("sizing.candidates", f"{name} needs vocab {vocab} (data.tokenizer_vocab) and at least "
                                                 f"{seq_length} positions")
    sizes = [non_embedding_parameters(shapes[name]) for name in candidates]
    if sizes != sorted(set(sizes)) or preset not in candidates:
        raise read.fail("sizing.candidates", f"expected presets of growing size ({sizes}) holding model.preset "
                                             f"{preset}, got {candidates}")
    measured = read.names(value.get("measured"), "sizing.measured")
    if len(measured) != 2 or not set(measured) <= set(candidates) or candidates.index(measured[0]) > candidates.index(
            measured[1]):
        raise read.fail("sizing.measured", f"expected two of the candidates, smaller first; got {measured}")
    alone = value.get("alone")
    if alone not in recipes:
        raise read.fail("sizing.alone", f"expected one of the plan's recipes ({', '.join(recipes)}), got {alone!r}")
    if not isinstance(fixed_on := value.get("fixed_on"), (str, type(None))):
        raise read.fail("sizing.fixed_on", f"expected the device and date it was sized on, or null; got {fixed_on!r}")
    return Sizing(candidates=tuple(candidates), measured=(measured[0], measured[1]), alone=alone, fixed_on=fixed_on,
                  tokens_per_parameter=read.number(value.get("tokens_per_parameter"), "sizing.tokens_per_parameter"),
                  measure_iters=read.integer(value.get("measure_iters"), "sizing.measure_iters", minimum=10))


def parse_plan(raw: Any, path: Path) -> StudyPlan:
    """The checked plan from its parsed YAML."""
    read = PlanReader(path)
    raw = read.mapping(raw, "plan", _KEYS)
    if raw.get("version") != VERSION:
        raise read.fail("version", f"this code reads plan version {VERSION}, got {raw.get('version')!r}")
    name = raw.get("name")
    if not isinstance(name, str) or not name or "/" in name:
        raise read.fail("name", f"expected a name (no '/'), got {name!r}")
    model = read.mapping(raw.get("model"), "model", ("preset", "seq_length", "shape"))
    try:
        shape = get_preset(str(model.get("preset")))
    except ValueError as error:
        raise read.fail("model.preset", str(error)) from error
    override = {str(k): read.integer(v, f"model.shape.{k}")
                for k, v in read.mapping(model.get("shape") or {}, "model.shape", SHAPE_KEYS).items()}
    if override and raw.get("sizing") is not None:
        raise read.fail("model.shape", "a plan sized on the device takes its shapes from sizing.candidates; drop one")
    shape = {**shape, **override}
    if shape["hidden_size"] % shape["num_attention_heads"] or shape["num_attention_heads"] % shape["num_query_groups"]:
        raise read.fail("model.shape", f"hidden_size {shape['hidden_size']}, num_attention_heads "
                                       f"{shape['num_attention_heads']}, num_query_groups {shape['num_query_groups']}: "
                                       "heads must divide the hidden size and query groups the heads")
    seq_length = read.integer(model.get("seq_length"), "model.seq_length")
    if seq_length > shape["max_position_embeddings"]:
        raise read.fail("model.seq_length", f"{seq_length} exceeds the preset's {shape['max_position_embeddings']} "
                                            f"positions")
    micro = read.integer(raw.get("micro_batch_size"), "micro_batch_size")
    batch = read.integer(raw.get("global_batch_size"), "global_batch_size")
    if batch % micro:
        raise read.fail("global_batch_size", f"{batch} is not a multiple of micro_batch_size {micro}")
    train_iters = read.integer(raw.get("train_iters"), "train_iters")
    eval_interval = read.integer(raw.get("eval_interval"), "eval_interval")
    if eval_interval > train_iters:
        raise read.fail("eval_interval", f"{eval_interval} exceeds train_iters {train_iters}: no validation would run")
    recipes = read.names(raw.get("recipes"), "recipes")
    for recipe in recipes:
        if problem := recipe_problem(recipe):
            raise read.fail("recipes", problem)
    seeds = _seeds(read, raw.get("seeds"), "seeds")
    environment = read.mapping(raw.get("environment") or {}, "environment")
    if problem := environment_problem(environment):
        raise read.fail("environment", problem)
    at_once = read.integer(raw.get("runs_at_once", 1), "runs_at_once")
    if at_once > MAX_RUNS_AT_ONCE:
        raise read.fail("runs_at_once", f"expected at most {MAX_RUNS_AT_ONCE} runs sharing the GPU, got {at_once}")
    return StudyPlan(
        path=path, name=name, preset=str(model["preset"]), seq_length=seq_length, micro_batch_size=micro,
        global_batch_size=batch, train_iters=train_iters,
        log_interval=read.integer(raw.get("log_interval"), "log_interval"), eval_interval=eval_interval,
        eval_iters=read.integer(raw.get("eval_iters"), "eval_iters"),
        training_flags=_flags(read, raw.get("training_flags") or []),
        environment={k: str(v) for k, v in environment.items()}, data=_data(read, raw.get("data")),
        recipes=tuple(recipes), seeds=tuple(seeds), order=tuple(_order(read, raw.get("order"), recipes, seeds)),
        step_time=_step_time(read, raw.get("step_time")), runs_at_once=at_once, shape_override=override,
        target_interval=None if raw.get("target_interval") is None else read.number(
            raw["target_interval"], "target_interval", high=0.5),
        power_from=None if raw.get("power_from") is None else read.names([raw["power_from"]], "power_from")[0],
        sizing=None if raw.get("sizing") is None else _sizing(read, raw["sizing"], str(model["preset"]), seq_length,
                                                               recipes, _data(read, raw.get("data")).tokenizer_vocab))


def load_plan(path: Path) -> StudyPlan:
    """Read and check the plan at ``path``."""
    path = Path(path)
    try:
        text = read_text_file(path, str(path))  # a FIFO, a device or a huge file: refused, not read
    except YamlError as error:
        raise StudyPlanError(str(error)) from error
    try:
        raw = load_yaml(text, str(path))
    except YamlError as error:
        raise StudyPlanError(f"{error} (a plan needs a few hundred)") from error
    except yaml.YAMLError as error:
        raise StudyPlanError(f"{path}: not YAML ({str(error).splitlines()[0]})") from error
    plan = parse_plan(raw, path)
    if plan.sizing is not None and plan.sizing.fixed_on is None and (problem := sized_lines_problem(text)):
        raise StudyPlanError(f"{path}: sizing: {problem}")  # found now, not after minutes of measuring
    return plan
