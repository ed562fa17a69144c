"""nvdlfw-inspect configs (TE's precision debug tools, ``--tensor-inspect-config`` / ``TENSOR_INSPECT_CONFIG``)
read into ``InspectConfig``: sections, their layer selectors, and each feature as flat entries (one
tensor or GEMM each, with its statistics and step selector).

The grammar is nvdlfw-inspect's (``docs/config_file.md``) with TE's features (``transformer_engine/debug/
features``): ``tensors``/``tensors_struct`` and ``gemms``/``gemms_struct`` with feature-level options as
defaults for the struct items; ``freq``, ``start_step``, ``end_step``, ``start_end_list`` as TE's
``next_enabled_iter``. Layer selectors are ``inspect_layers``'; ``FakeQuant``, ``PerTensorScaling`` and
features of your own become recipe rules (``inspect_features``). Anything the lab cannot honour (a
feature, an option, a layer selector) is refused in one line that names it; nothing is ignored.
Matching the layers and tensors against the run is ``inspect_plan``'s.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import yaml

from megatron.quant.capture.inspect_features import (
    TE_FEATURES,
    InspectFeature,
    Translation,
    check_translation,
    namespace_features,
)
from megatron.quant.capture.inspect_grammar import (
    ALL_TENSORS,
    GEMMS,
    QUANTIZED_TENSORS,
    InspectConfigError,
    bool_value,
    is_int,
    struct_items,
)
from megatron.quant.capture.inspect_layers import LayerMatch, parse_layers
from megatron.quant.formats.show import show_value
from megatron.quant.stats import TE_RECIPES, blockwise_name, logged_name, parse_quantized_stat
from megatron.quant.yaml_safe import YamlError, load_yaml, read_text_file

NAMESPACE = "transformer_engine"
LOG_STATS = ("min", "max", "mean", "std", "l1_norm", "l2_norm", "cur_amax", "dynamic_range")
BASE_LOG_STATS = ("min", "max", "mean", "std", "l1_norm", "l2_norm")  # nvdlfw-inspect's own LogTensorStats
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
    "FakeQuantFp8": "TE's older FakeQuant, which TE no longer registers; write FakeQuant with quant_format",
    "AutoswitchGemm": "it switches GEMMs on statistics TE gathers at run time, which the lab's fixed per-module "
                      "formats cannot follow",
}


@dataclass(frozen=True)
class Schedule:
    """TE's step selector: every ``freq``-th step within [start, end] (end -1 or None: no end), or
    within the ``intervals`` of ``start_end_list`` (which then replace start and end; sorted and disjoint)."""

    freq: int = 1
    start: Optional[int] = None
    end: Optional[int] = None
    intervals: Optional[tuple[tuple[int, int], ...]] = None

    def runs_at(self, step: int) -> bool:
        if step % self.freq:
            return False
        if self.intervals is not None:  # sorted and disjoint (``_schedule``): one search per step
            i = bisect.bisect_right(self.intervals, step, key=lambda interval: interval[0]) - 1
            return i >= 0 and step <= self.intervals[i][1]
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
class Section:
    name: str
    layers: LayerMatch
    entries: tuple[FeatureEntry, ...]
    translations: tuple[Translation, ...] = ()  # features that change GEMM precision (inspect_features)


@dataclass(frozen=True)
class InspectConfig:
    source: str
    sections: tuple[Section, ...]


def load_inspect_config(path: str, source: str = "TENSOR_INSPECT_CONFIG") -> InspectConfig:
    """The enabled sections of the nvdlfw-inspect YAML at ``path``; InspectConfigError for anything bad."""
    where = f"{source}={path}"
    try:
        data = load_yaml(read_text_file(path, where), where)
    except YamlError as exc:
        raise InspectConfigError(f"{exc} (an inspect config)") from None
    except yaml.YAMLError as exc:
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
    if not bool_value(body["enabled"], f"{where}.enabled"):
        return None
    if "layers" not in body:
        raise InspectConfigError(f"{where}: no 'layers' (give layer_name_regex_pattern, layer_types or "
                                 f"layer_numbers)")
    layers = parse_layers(body["layers"], where)
    entries: list[FeatureEntry] = []
    translations: list[Translation] = []
    for key, value in body.items():
        if key in ("enabled", "layers"):
            continue
        if key == "LogTensorStats":  # nvdlfw-inspect's own feature (the default namespace)
            entries += _feature("LogTensorStats", value, f"{where}.{key}", base=True)
            continue
        if not isinstance(value, Mapping):
            raise InspectConfigError(f"{where}.{key}: expected a mapping of features, got {show_value(value)}")
        own = TE_FEATURES if key == NAMESPACE else namespace_features(str(key), f"{where}.{key}")
        for feature, config in value.items():
            at = f"{where}.{key}.{feature}"
            if feature in own:
                translations += _translation(own[feature], config, at)
            elif key == NAMESPACE:
                entries += _feature(str(feature), config, at)
            else:
                raise InspectConfigError(f"{at}: unknown feature {feature!r}; {key}'s: {', '.join(map(str, own))}")
    if not entries and not translations:
        raise InspectConfigError(f"{where}: names no enabled feature with tensors or GEMMs; give {NAMESPACE}: "
                                 f"{{a feature: {{enabled: True, tensors: [...]}}}} or disable the section")
    return Section(name, layers, tuple(entries), tuple(translations))


def _translation(feature: InspectFeature, config: Any, where: str) -> list[Translation]:
    if not isinstance(config, Mapping):
        raise InspectConfigError(f"{where}: expected a mapping of options, got {show_value(config)}")
    if not bool_value(config.get("enabled", True), f"{where}.enabled"):
        return []
    translated = feature.translate({k: v for k, v in config.items() if k != "enabled"}, where)
    check_translation(translated, f"{where}: {type(feature).__name__}.translate")
    return [translated]


def _feature(feature: str, config: Any, where: str, base: bool = False) -> list[FeatureEntry]:
    if feature in REFUSED:
        raise InspectConfigError(f"{where} is refused: {REFUSED[feature]}")
    if feature not in FEATURES:
        raise InspectConfigError(f"{where}: unknown feature {feature!r}; the lab runs "
                                 f"{', '.join([*FEATURES, *TE_FEATURES])}, and features of your own in a namespace "
                                 f"of their own (docs/capture.md#features-of-your-own)")
    if not isinstance(config, Mapping):
        raise InspectConfigError(f"{where}: expected a mapping of options, got {show_value(config)}")
    if not bool_value(config.get("enabled", True), f"{where}.enabled"):
        return []
    options = {k: v for k, v in config.items() if k != "enabled"}
    spec = FEATURES[feature]
    if spec is None:
        return _gemm_feature(feature, options, where)
    tensors, allowed = spec
    if "gemms" in options or "gemms_struct" in options:
        raise InspectConfigError(f"{where}: {feature} takes tensors/tensors_struct, not gemms")
    items = struct_items(options, "tensor", tensors, allowed, where)
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
    items = struct_items(options, "gemm", GEMMS, (), where)
    return [FeatureEntry(feature, None, gemm) for gemm, _ in items]


def _entry(feature: str, tensor: str, options: dict, where: str, base: bool) -> FeatureEntry:
    schedule = _schedule(options, f"{where} ({tensor})")
    if feature == "DumpTensors":
        high = bool_value(options.get("high_precision_tensor", False), f"{where}.high_precision_tensor")
        quantized = bool_value(options.get("quantized_tensor", False), f"{where}.quantized_tensor")
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
    if not is_int(block_size) or block_size < 1 or dims not in (1, 2) or isinstance(dims, bool):
        raise InspectConfigError(f"{where}: max_blockwise_dynamic_range: block_size a positive integer and dims "
                                 f"1 or 2, got {show_value(dict(options))}")
    both = tensor in ("activation", "weight")  # TE: the tensors used in both orientations
    return StatRequest(blockwise_name(block_size, dims, both), "max_blockwise_dynamic_range",
                       blockwise=(block_size, dims, both))


def _schedule(options: dict, where: str) -> Schedule:
    freq = options.get("freq", 1)
    if not is_int(freq) or freq < 1:
        raise InspectConfigError(f"{where}: freq {show_value(freq)} is invalid; allowed: a positive integer")
    start, end = options.get("start_step"), options.get("end_step")
    if start is not None and (not is_int(start) or start < 0):
        raise InspectConfigError(f"{where}: start_step {show_value(start)} is invalid; allowed: a step >= 0")
    if end is not None and (not is_int(end) or end < -1 or (end >= 0 and end < (start or 0))):
        raise InspectConfigError(f"{where}: end_step {show_value(end)} is invalid; allowed: a step >= start_step, "
                                 f"or -1 (no end)")
    listed = options.get("start_end_list")
    if listed is None:
        return Schedule(freq, start, end)
    if not isinstance(listed, list) or not listed or not all(
            isinstance(p, list) and len(p) == 2 and all(is_int(v) and v >= 0 for v in p) and p[0] <= p[1]
            for p in listed):
        raise InspectConfigError(f"{where}: start_end_list {show_value(listed)} is malformed; allowed: [start, end] "
                                 f"pairs of steps with start <= end, e.g. [[0, 20], [80, 100]]")
    return Schedule(freq, intervals=_merged(listed))


def _merged(pairs: list) -> tuple[tuple[int, int], ...]:
    """TE's ``next_enabled_iter`` sorts the pairs and fires inside any of them: sorted, overlaps merged."""
    merged: list[list[int]] = []
    for start, end in sorted(pairs):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return tuple((start, end) for start, end in merged)
