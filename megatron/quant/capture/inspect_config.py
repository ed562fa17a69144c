"""nvdlfw-inspect configs (TE's precision debug tools, ``--tensor-inspect-config`` / ``TENSOR_INSPECT_CONFIG``)
read into ``InspectConfig``: sections, their layer selectors, and each feature as flat entries (one
tensor or GEMM each, with its statistics and step selector).

The grammar is nvdlfw-inspect's (``docs/config_file.md``) with TE's features (``transformer_engine/debug/
features``): ``tensors``/``tensors_struct`` and ``gemms``/``gemms_struct`` with feature-level options as
defaults for the struct items; ``freq``, ``start_step``, ``end_step``, ``start_end_list`` as TE's
``next_enabled_iter``. Anything the lab cannot honour (a feature, an option, a layer selector) is refused
in one line that names it; nothing is ignored. Matching the layers and tensors against the run is
``inspect_plan``'s.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from megatron.quant.formats.show import show_value
from megatron.quant.stats import TE_RECIPES, blockwise_name, logged_name, parse_quantized_stat
from megatron.quant.yaml_safe import load_yaml

NAMESPACE = "transformer_engine"
LOG_STATS = ("min", "max", "mean", "std", "l1_norm", "l2_norm", "cur_amax", "dynamic_range")
BASE_LOG_STATS = ("min", "max", "mean", "std", "l1_norm", "l2_norm")  # nvdlfw-inspect's own LogTensorStats
ALL_TENSORS = ("activation", "gradient", "weight", "output", "wgrad", "dgrad")
QUANTIZED_TENSORS = ("activation", "gradient", "weight")
GEMMS = ("fprop", "dgrad", "wgrad")
_SCHEDULE = ("freq", "start_step", "end_step", "start_end_list")
# feature -> (tensors it takes, options besides the tensor/GEMM selectors); None: takes GEMMs only.
FEATURES: dict[str, Optional[tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "LogTensorStats": (ALL_TENSORS, ("stats",) + _SCHEDULE),
    "LogFp8TensorStats": (QUANTIZED_TENSORS, ("stats",) + _SCHEDULE),
    "LogNvfp4TensorStats": (QUANTIZED_TENSORS, ("stats",) + _SCHEDULE),
    "DumpTensors": (ALL_TENSORS, ("high_precision_tensor", "quantized_tensor") + _SCHEDULE),
    "DisableQuantizationGEMM": None, "DisableFP8GEMM": None,
    "DisableQuantizationLayer": None, "DisableFP8Layer": None,
}
REFUSED = {
    "PerTensorScaling": "it changes how TE scales a tensor; give the lab a recipe with that scaling instead",
    "FakeQuant": "it fake-quantizes inside TE's GEMMs; give the lab a recipe with that format instead",
    "FakeQuantFp8": "it fake-quantizes inside TE's GEMMs; give the lab a recipe with that format instead",
    "AutoswitchGemm": "TE-internal GEMM switching is not emulated",
}
LAYER_KEYS = ("layer_name_regex_pattern", "layer_types")
REFUSED_LAYER_KEYS = ("layer_numbers", "exact_layer_names")


class InspectConfigError(ValueError):
    """A config the lab cannot run: one line naming the file, the place and the value."""


@dataclass(frozen=True)
class Schedule:
    """TE's step selector: every ``freq``-th step within [start, end] (end -1 or None: no end), or
    within the ``intervals`` of ``start_end_list`` (which then replace start and end)."""

    freq: int = 1
    start: Optional[int] = None
    end: Optional[int] = None
    intervals: Optional[tuple[tuple[int, int], ...]] = None

    def runs_at(self, step: int) -> bool:
        if step % self.freq:
            return False
        if self.intervals is not None:
            return any(s <= step <= e for s, e in self.intervals)
        return (self.start or 0) <= step and (self.end is None or self.end < 0 or step <= self.end)


@dataclass(frozen=True)
class StatRequest:
    """One statistic a feature logs: the name TE logs, the ``te_names.TE_STATS`` entry it reads, and
    where from: ``source`` None the run's own quantization (rowwise), else a key of the capture's
    ``whatif`` statistics (a preset, ``/columnwise`` for the other orientation); ``blockwise``:
    (block_size, dims, both orientations) of ``max_blockwise_dynamic_range``."""

    logged: str
    stat: str
    source: Optional[str] = None
    blockwise: Optional[tuple[int, int, bool]] = None


@dataclass(frozen=True)
class FeatureEntry:
    feature: str
    tensor: Optional[str]  # TE's tensor name; None for the GEMM features
    gemm: Optional[str]
    stats: tuple[StatRequest, ...] = ()
    schedule: Schedule = Schedule()
    high_precision: bool = False  # DumpTensors
    quantized: bool = False


@dataclass(frozen=True)
class LayerMatch:
    """nvdlfw-inspect's selector: a regex searched in the layer name, or names any of which is part of it."""

    regex: Optional[str] = None
    types: Optional[tuple[str, ...]] = None

    def matches(self, layer: str) -> bool:
        if self.regex is not None:
            return re.search(self.regex, layer) is not None
        return any(t in layer or t == "all" for t in self.types)

    def describe(self) -> str:
        if self.regex is not None:
            return f"layer_name_regex_pattern {self.regex!r}"
        return f"layer_types {list(self.types)}"


@dataclass(frozen=True)
class Section:
    name: str
    layers: LayerMatch
    entries: tuple[FeatureEntry, ...]


@dataclass(frozen=True)
class InspectConfig:
    source: str
    sections: tuple[Section, ...]


def load_inspect_config(path: str, source: str = "TENSOR_INSPECT_CONFIG") -> InspectConfig:
    """The enabled sections of the nvdlfw-inspect YAML at ``path``; InspectConfigError for anything bad."""
    where = f"{source}={path}"
    try:
        data = load_yaml(Path(path).read_text(encoding="utf-8"), where)
    except OSError as exc:
        raise InspectConfigError(f"{where}: cannot read the inspect config: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise InspectConfigError(f"{where}: not a valid YAML file: {' '.join(str(exc).split())[:300]}") from None
    return inspect_config_from_dict(data, where)


def inspect_config_from_dict(data: Any, source: str) -> InspectConfig:
    if not isinstance(data, Mapping) or not data:
        raise InspectConfigError(f"{source}: an inspect config is a mapping of sections, got {show_value(data)}")
    sections = tuple(s for name, body in data.items() if (s := _section(str(name), body, source)) is not None)
    if not sections:
        raise InspectConfigError(f"{source}: no section is enabled")
    return InspectConfig(source, sections)


def _section(name: str, body: Any, source: str) -> Optional[Section]:
    where = f"{source}: section {name}"
    if not isinstance(body, Mapping) or "enabled" not in body:
        raise InspectConfigError(f"{where}: a section is a mapping with 'enabled' and 'layers'")
    if not _bool(body["enabled"], f"{where}.enabled"):
        return None
    if "layers" not in body:
        raise InspectConfigError(f"{where}: no 'layers' (give layer_name_regex_pattern or layer_types)")
    entries: list[FeatureEntry] = []
    for key, value in body.items():
        if key in ("enabled", "layers"):
            continue
        if key == NAMESPACE:
            if not isinstance(value, Mapping):
                raise InspectConfigError(f"{where}.{NAMESPACE}: expected a mapping of features, "
                                         f"got {show_value(value)}")
            for feature, config in value.items():
                entries += _feature(str(feature), config, f"{where}.{NAMESPACE}.{feature}")
        elif key == "LogTensorStats":  # nvdlfw-inspect's own feature (the default namespace)
            entries += _feature("LogTensorStats", value, f"{where}.{key}", base=True)
        else:
            raise InspectConfigError(f"{where}: unknown feature or namespace {key!r}; the lab runs "
                                     f"{NAMESPACE}: {', '.join(FEATURES)} and nvdlfw-inspect's LogTensorStats")
    return Section(name, _layers(body["layers"], where), tuple(entries))


def _layers(value: Any, where: str) -> LayerMatch:
    if not isinstance(value, Mapping):
        raise InspectConfigError(f"{where}.layers: expected a mapping, got {show_value(value)}")
    for key in value:
        if key in REFUSED_LAYER_KEYS:
            raise InspectConfigError(f"{where}.layers.{key} is refused: select layers by "
                                     f"{' or '.join(LAYER_KEYS)} (names as in megatron-core's modules)")
        if key not in LAYER_KEYS:
            raise InspectConfigError(f"{where}.layers: unknown key {key!r}; allowed: {', '.join(LAYER_KEYS)}")
    if len(value) != 1:
        raise InspectConfigError(f"{where}.layers: give one of {', '.join(LAYER_KEYS)}")
    if "layer_name_regex_pattern" in value:
        pattern = value["layer_name_regex_pattern"]
        try:
            re.compile(pattern)
        except (re.error, TypeError) as exc:
            raise InspectConfigError(f"{where}.layers.layer_name_regex_pattern {show_value(pattern)} is not a "
                                     f"regular expression: {exc}") from None
        return LayerMatch(regex=pattern)
    types = value["layer_types"]
    if not isinstance(types, list) or not types or not all(isinstance(t, str) and t for t in types):
        raise InspectConfigError(f"{where}.layers.layer_types: expected a list of names, got {show_value(types)}")
    return LayerMatch(types=tuple(types))


def _feature(feature: str, config: Any, where: str, base: bool = False) -> list[FeatureEntry]:
    if feature in REFUSED:
        raise InspectConfigError(f"{where} is refused: {REFUSED[feature]}")
    if feature not in FEATURES:
        raise InspectConfigError(f"{where}: unknown feature {feature!r}; the lab runs {', '.join(FEATURES)}")
    if not isinstance(config, Mapping):
        raise InspectConfigError(f"{where}: expected a mapping of options, got {show_value(config)}")
    if not _bool(config.get("enabled", True), f"{where}.enabled"):
        return []
    options = {k: v for k, v in config.items() if k != "enabled"}
    spec = FEATURES[feature]
    if spec is None:
        return _gemm_feature(feature, options, where)
    tensors, allowed = spec
    if "gemms" in options or "gemms_struct" in options:
        raise InspectConfigError(f"{where}: {feature} takes tensors/tensors_struct, not gemms")
    items = _struct_items(options, "tensor", tensors, allowed, where)
    return [_entry(feature, tensor, item, where, base) for tensor, item in items]


def _gemm_feature(feature: str, options: dict, where: str) -> list[FeatureEntry]:
    if feature in ("DisableQuantizationLayer", "DisableFP8Layer"):
        if options:
            raise InspectConfigError(f"{where}: unknown option {next(iter(options))!r}; {feature} takes none")
        return [FeatureEntry(feature, None, gemm) for gemm in GEMMS]
    extra = sorted(set(options) - {"gemms", "gemms_struct"})
    if extra:
        raise InspectConfigError(f"{where}: unknown option {extra[0]!r}; {feature} takes gemms (it applies to every "
                                 f"step: the lab fixes a module's formats when the model is built)")
    items = _struct_items(options, "gemm", GEMMS, (), where)
    return [FeatureEntry(feature, None, gemm) for gemm, _ in items]


def _struct_items(options: dict, kind: str, names: tuple[str, ...], allowed: tuple[str, ...],
                  where: str) -> list[tuple[str, dict]]:
    """(name, options) per listed tensor or GEMM: ``<kind>s`` with the feature's options, or
    ``<kind>s_struct`` items whose own options win over the feature's."""
    plain, struct = f"{kind}s", f"{kind}s_struct"
    defaults = {k: v for k, v in options.items() if k not in (plain, struct)}
    for key in defaults:
        if key not in allowed:
            raise InspectConfigError(f"{where}: unknown option {key!r}; allowed: "
                                     f"{', '.join((plain, struct) + allowed)}")
    if (plain in options) == (struct in options):
        raise InspectConfigError(f"{where}: give one of {plain} and {struct}")
    if plain in options:
        listed = options[plain]
        if not isinstance(listed, list) or not listed:
            raise InspectConfigError(f"{where}.{plain}: expected a list, got {show_value(listed)}")
        items = [(name, dict(defaults)) for name in listed]
    else:
        listed = options[struct]
        if not isinstance(listed, list) or not all(isinstance(i, Mapping) and kind in i for i in listed):
            raise InspectConfigError(f"{where}.{struct}: expected a list of mappings, each with {kind!r}")
        items = []
        for item in listed:
            own = {k: v for k, v in item.items() if k != kind}
            for key in own:
                if key not in allowed:
                    raise InspectConfigError(f"{where}.{struct}: unknown option {key!r}; allowed: {kind}, "
                                             f"{', '.join(allowed) or 'nothing else'}")
            items.append((item[kind], {**defaults, **own}))
    for name, _ in items:
        if name not in names:
            raise InspectConfigError(f"{where}: {kind} {show_value(name)} is unknown; allowed: {', '.join(names)}")
    return items


def _entry(feature: str, tensor: str, options: dict, where: str, base: bool) -> FeatureEntry:
    schedule = _schedule(options, f"{where} ({tensor})")
    if feature == "DumpTensors":
        high = _bool(options.get("high_precision_tensor", False), f"{where}.high_precision_tensor")
        quantized = _bool(options.get("quantized_tensor", False), f"{where}.quantized_tensor")
        if not (high or quantized):
            raise InspectConfigError(f"{where} ({tensor}): dumps nothing; set high_precision_tensor or "
                                     f"quantized_tensor to True")
        return FeatureEntry(feature, tensor, None, schedule=schedule, high_precision=high, quantized=quantized)
    stats = options.get("stats")
    if not isinstance(stats, list) or not stats:
        raise InspectConfigError(f"{where} ({tensor}): stats: expected a list of statistics, got {show_value(stats)}")
    requests = tuple(_stat(feature, stat, tensor, f"{where} ({tensor})", base) for stat in stats)
    return FeatureEntry(feature, tensor, None, stats=requests, schedule=schedule)


def _stat(feature: str, stat: Any, tensor: str, where: str, base: bool) -> StatRequest:
    if feature == "LogTensorStats":
        if isinstance(stat, Mapping) and not base and list(stat) == ["max_blockwise_dynamic_range"]:
            return _blockwise(stat["max_blockwise_dynamic_range"], tensor, where)
        known = BASE_LOG_STATS if base else LOG_STATS
        if not isinstance(stat, str) or stat.lower() not in known:
            raise InspectConfigError(f"{where}: stat {show_value(stat)} is unknown; {feature} logs "
                                     f"{', '.join(known)}" + ("" if base else " ({max_blockwise_dynamic_range: "
                                                                              "{block_size, dims}})"))
        return StatRequest(stat.lower(), stat.lower())
    if not isinstance(stat, str):
        raise InspectConfigError(f"{where}: stat {show_value(stat)} is not a name")
    try:
        parsed = parse_quantized_stat(stat, feature)
    except ValueError as exc:
        raise InspectConfigError(f"{where}: {exc}") from None
    if parsed.recipe == "fp8_delayed_scaling":
        raise InspectConfigError(f"{where}: stat {stat!r}: delayed scaling needs the run's amax history; when the run "
                                 f"uses it, give the stat without the recipe prefix")
    source = None if feature == "LogFp8TensorStats" and parsed.recipe is None else TE_RECIPES[parsed.recipe]
    if parsed.columnwise:
        source = f"{source or 'run'}/columnwise"
    return StatRequest(logged_name(feature, stat), parsed.stat, source)


def _blockwise(options: Any, tensor: str, where: str) -> StatRequest:
    if not isinstance(options, Mapping) or set(options) - {"block_size", "dims"}:
        raise InspectConfigError(f"{where}: max_blockwise_dynamic_range takes block_size and dims, got "
                                 f"{show_value(options)}")
    block_size, dims = options.get("block_size", 32), options.get("dims", 1)
    if not _is_int(block_size) or block_size < 1 or dims not in (1, 2) or isinstance(dims, bool):
        raise InspectConfigError(f"{where}: max_blockwise_dynamic_range: block_size a positive integer and dims "
                                 f"1 or 2, got {show_value(dict(options))}")
    both = tensor in ("activation", "weight")  # TE: the tensors used in both orientations
    return StatRequest(blockwise_name(block_size, dims, both), "max_blockwise_dynamic_range",
                       blockwise=(block_size, dims, both))


def _schedule(options: dict, where: str) -> Schedule:
    freq = options.get("freq", 1)
    if not _is_int(freq) or freq < 1:
        raise InspectConfigError(f"{where}: freq {show_value(freq)} is invalid; allowed: a positive integer")
    start, end = options.get("start_step"), options.get("end_step")
    if start is not None and (not _is_int(start) or start < 0):
        raise InspectConfigError(f"{where}: start_step {show_value(start)} is invalid; allowed: a step >= 0")
    if end is not None and (not _is_int(end) or end < -1 or (end >= 0 and end < (start or 0))):
        raise InspectConfigError(f"{where}: end_step {show_value(end)} is invalid; allowed: a step >= start_step, "
                                 f"or -1 (no end)")
    listed = options.get("start_end_list")
    if listed is None:
        return Schedule(freq, start, end)
    bad = InspectConfigError(f"{where}: start_end_list {show_value(listed)} is malformed; allowed: non-overlapping "
                             f"[start, end] pairs of steps in increasing order, e.g. [[0, 20], [80, 100]]")
    if not isinstance(listed, list) or not listed or not all(
            isinstance(p, list) and len(p) == 2 and all(_is_int(v) and v >= 0 for v in p) and p[0] <= p[1]
            for p in listed):
        raise bad
    if any(listed[i][1] >= listed[i + 1][0] for i in range(len(listed) - 1)):
        raise bad
    return Schedule(freq, intervals=tuple((s, e) for s, e in listed))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InspectConfigError(f"{where}: expected True or False, got {show_value(value)}")
    return value
