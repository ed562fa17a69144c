"""nvdlfw-inspect configs fed by a careless or hostile user: what TE's own tools would do, or one line naming the
key; no regular expression can backtrack without end, a long start_end_list costs one search per step, and
DumpTensors into a full directory lets the run go on and says so once."""
import builtins
import errno
import re
import warnings

import pytest
import torch
import yaml

from megatron.quant import formats, position, tensor_saver
from megatron.quant.capture.inspect_config import InspectConfigError, inspect_config_from_dict
from megatron.quant.capture.inspect_plan import resolve_inspect
from megatron.quant.recipes.precision import PrecisionConfig
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.tensor_saver import CaptureSite, Operand, SaverConfig
from megatron.quant.yaml_safe import YamlError, load_yaml
from tests.reliability._capture_faults import FullDisk
from tests.reliability._faults import deadline

FC1 = "decoder.layers.0.mlp.linear_fc1"
SECTION = """
s:
  enabled: True
  layers: {layer_types: [fc1]}
  transformer_engine:
    LogTensorStats: {enabled: True, tensors: [activation], stats: [max]%s}
"""


def _refused(text, *expected):
    with deadline(10), pytest.raises(InspectConfigError) as error:
        inspect_config_from_dict(yaml.safe_load(text), "cfg.yaml")
    message = str(error.value)
    assert "\n" not in message, message
    for part in expected:
        assert part in message, (part, message)


@pytest.mark.parametrize("pattern", ["(a+)+$", "(.*)*x", "(fc1|fc)*z", ".*.*.*.*x", "x" * 1001])
def test_a_regex_that_could_backtrack_without_end_is_refused(pattern):
    # ``(.*)*x`` searched in "decoder.layers.0.mlp.linear_fc1" (no x) backtracks through 2**31 splits
    _refused(f"s: {{enabled: True, layers: {{layer_name_regex_pattern: '{pattern}'}}, transformer_engine: "
             f"{{LogTensorStats: {{enabled: True, tensors: [activation], stats: [max]}}}}}}",
             "s.layers.layer_name_regex_pattern", "refused" if len(pattern) < 1000 else "at most 1000 characters")


@pytest.mark.parametrize("options, expected", [
    (", freq: 0", "freq 0 is invalid; allowed: a positive integer"),
    (", freq: -3", "freq -3 is invalid"),
    (", start_step: 10, end_step: 5", "end_step 5 is invalid; allowed: a step >= start_step"),
    (", start_end_list: [[5, 1]]", "start_end_list [[5, 1]] is malformed"),
])
def test_steps_that_select_nothing_are_refused_naming_the_key(options, expected):
    _refused(SECTION % options, "section s.transformer_engine.LogTensorStats", expected)


@pytest.mark.parametrize("numbers", ["['1-999999']", "[0]", "[10001]", "[1.5]", "['3-1']"])
def test_layer_numbers_out_of_range_are_refused_naming_the_key(numbers):
    _refused(SECTION.replace("layer_types: [fc1]", f"layer_numbers: {numbers}") % "",
             "s.layers.layer_numbers", "allowed: layer numbers from 1 (the first layer) to 10000")


def test_unknown_features_are_refused_naming_them():
    _refused(SECTION.replace("LogTensorStats", "LogEverything") % "", "unknown feature 'LogEverything'")
    _refused(SECTION.replace("transformer_engine", "my_vendor") % "", "unknown feature or namespace 'my_vendor'")


def test_a_section_without_tensors_is_refused():
    _refused("s: {enabled: True, layers: {layer_types: [fc1]}}", "section s: names no enabled feature")
    _refused(SECTION.replace("tensors: [activation], ", "") % "", "give one of tensors and tensors_struct")


def test_a_start_end_list_is_sorted_and_merged_as_te_reads_it():
    config = inspect_config_from_dict(yaml.safe_load(SECTION % ", start_end_list: [[50, 60], [0, 5], [3, 9]]"), "c")
    (entry,) = config.sections[0].entries
    assert entry.schedule.intervals == ((0, 9), (50, 60))
    assert [s for s in range(70) if entry.schedule.runs_at(s)] == list(range(10)) + list(range(50, 61))


def test_a_single_tensor_name_is_a_list_of_one_as_nvdlfw_inspect_reads_it():
    config = inspect_config_from_dict(yaml.safe_load(SECTION.replace("[activation]", "activation") % ""), "cfg")
    assert [e.tensor for e in config.sections[0].entries] == ["activation"]


def test_a_start_end_list_of_40000_pairs_runs_and_costs_one_search_per_step():
    # 120,000 values written out: an alias bound on all values would refuse it as an alias expansion; the file's size
    # (at most 1 MiB, ~700 kB here) is the bound (yaml_safe), and a step's search is a bisection
    data = yaml.safe_load(SECTION % ", start_end_list: []")
    data["s"]["transformer_engine"]["LogTensorStats"]["start_end_list"] = [[10 * i, 10 * i + 2] for i in range(40_000)]
    (entry,) = inspect_config_from_dict(data, "cfg").sections[0].entries
    with deadline(10):
        assert [s for s in range(399_980, 400_000) if entry.schedule.runs_at(s)] == [399_980, 399_981, 399_982,
                                                                                     399_990, 399_991, 399_992]


def test_the_alias_bound_counts_what_aliases_add_not_what_a_file_writes_out():
    written = "[" + ", ".join(f"[{i}, {i + 1}]" for i in range(0, 100, 2)) + "]"  # 151 values, no alias
    assert len(load_yaml(written, "list", limit=100)) == 50
    aliased = "a: &x [" + ", ".join(["1"] * 60) + "]\nb: [*x, *x]\n"  # the aliases add 122 values
    with pytest.raises(YamlError, match="expands to more than 100 values through YAML aliases"):
        load_yaml(aliased, "aliased", limit=100)


class _ReadOnly(FullDisk):
    """A directory that turns read-only once the run has started: every file opened under it fails."""

    def open(self, file, *args, **kwargs):
        if str(file).startswith(self.root) and any(m in (args[0] if args else kwargs.get("mode", "r")) for m in "wax"):
            raise OSError(errno.EROFS, "Read-only file system", str(file))
        return super().open(file, *args, **kwargs)


DUMP = SECTION.replace("LogTensorStats: {enabled: True, tensors: [activation], stats: [max]%s}",
                       "DumpTensors: {enabled: True, tensors: [activation], high_precision_tensor: True}\n"
                       "    LogTensorStats: {enabled: True, tensors: [activation], stats: [max]}")


@pytest.mark.parametrize("disk, stopped", [(FullDisk, r"disk full at .*: capture stopped"),
                                           (_ReadOnly, r"tensor capture stopped: .*Read-only file system")])
def test_dump_tensors_into_a_full_or_read_only_directory_goes_on_and_each_output_says_so_once(
        tmp_path, monkeypatch, disk, stopped):
    config = SaverConfig(save_dir=str(tmp_path), inspect=inspect_config_from_dict(yaml.safe_load(DUMP), "cfg"))
    _, plan = resolve_inspect(config.inspect, PrecisionConfig.uniform(QuantRecipe.from_dict({"format": "bf16"})), 1)
    tensor_saver.configure(config, plan=plan)  # the directory is writable at start (checked then)
    site = CaptureSite("linear", "linear", 0, FC1, "fc1", "bf16")
    try:
        with warnings.catch_warnings(record=True) as caught, monkeypatch.context() as patch:
            warnings.simplefilter("always")
            patch.setattr(builtins, "open", disk(str(tmp_path), fail_at=1).open)
            for iteration in (1, 2, 3):
                position.set_iteration(iteration)
                position.set_microbatch(0, first_sample=iteration)
                if tensor_saver.is_active():
                    tensor_saver.capture(site, "forward", "pre", {"input": Operand(torch.ones(4, 8),
                                                                                   formats.get_format("bf16"))})
                tensor_saver.iteration_summary()  # the training loop goes on
            tensor_saver.close()
    finally:
        tensor_saver.close()
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    # each output says so once: the capture (DumpTensors' files) and the TE statistics log
    assert len([m for m in messages if re.search(stopped, m)]) == 1, messages
    assert [m for m in messages if not re.search(stopped, m)] == [m for m in messages if m.startswith(
        f"TE statistics log in {tmp_path / 'nvdlfw_inspect_statistics_logs'}: ")][:1], messages
