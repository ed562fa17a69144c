"""Capture through a fake layer stack that calls the saver as the quantized layers do."""
import json
from datetime import datetime
from pathlib import Path

import pytest
import torch

from megatron.quant import position, tensor_saver
from megatron.quant.capture.naming import FILE_NAME_RE, parse_file_name
from megatron.quant.tensor_saver import CaptureSite
from tests.capture._fake_model import CAPTURES_PER_LAYER, FakeModel, run_iteration

METADATA_KEYS = {
    "layer_type", "layer_idx", "module", "role", "operation", "phase", "component", "quant_type", "format",
    "axis", "tensor_name", "iteration", "microbatch", "sample", "first_sample", "rank", "tp_rank", "pp_rank",
    "dp_rank", "shape", "dtype", "saved_at", "stats", "quantized", "run_id",
}


@pytest.fixture
def run(capture_session):
    def train(save_dir, steps, n_layers=2, run_iterations=None, n_microbatches=2, **config):
        """Train ``steps`` (iteration numbers) of the fake model with capture configured by ``config``."""
        capture_session(save_dir, run_iterations=run_iterations, **config)
        model = FakeModel(n_layers=n_layers)
        for iteration in steps:
            run_iteration(model, iteration, n_microbatches=n_microbatches)
        tensor_saver.flush()

    return train


def manifest(tmp_path, quant_type="bf16", rank=0):
    path = Path(tmp_path, quant_type, f"manifest-rank{rank:02d}.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def captured(tmp_path, key):
    return sorted({entry["metadata"][key] for entry in manifest(tmp_path)})


def test_names_files_and_manifest_agree(tmp_path, capture_session):
    capture_session(iterations="1")
    model = FakeModel(n_layers=2)
    run_iteration(model, 0)
    inputs = run_iteration(model, 1)
    tensor_saver.flush()

    entries = manifest(tmp_path)
    assert len(entries) == 2 * 2 * CAPTURES_PER_LAYER  # microbatches x layers
    files = sorted(p.name for p in Path(tmp_path, "bf16").glob("*.pt"))
    assert sorted(e["file"] for e in entries) == files
    assert not [p for p in Path(tmp_path, "bf16").iterdir() if p.name.endswith(".tmp")]
    for entry in entries:
        loaded = torch.load(Path(tmp_path, "bf16", entry["file"]), weights_only=True)
        meta = loaded["metadata"]
        assert set(loaded) == {"tensor", "metadata"} and set(meta) == METADATA_KEYS
        assert json.loads(json.dumps(meta)) == entry["metadata"]
        fields = parse_file_name(entry["file"])
        assert all(meta[key] == value for key, value in fields.items() if key not in ("timestamp", "counter"))
        assert fields["timestamp"] == datetime.fromisoformat(meta["saved_at"]).strftime("%Y%m%d_%H%M%S")
        assert meta["iteration"] == 1 and meta["sample"] == meta["microbatch"]
        assert meta["first_sample"] == (2 + meta["microbatch"]) * 2
        assert list(loaded["tensor"].shape) == meta["shape"] == meta["stats"]["shape"]
        assert (meta["rank"], meta["tp_rank"], meta["pp_rank"], meta["dp_rank"]) == (0, 0, 0, 0)
    # The saved input of layer 0's qkv GEMM is what the model was fed in that micro-batch.
    for mb, x in enumerate(inputs):
        [entry] = [e for e in entries if e["metadata"]["module"].endswith("0.self_attention.linear_qkv")
                   and e["metadata"]["tensor_name"] == "input" and e["metadata"]["microbatch"] == mb]
        assert torch.equal(torch.load(Path(tmp_path, "bf16", entry["file"]), weights_only=True)["tensor"], x)
    # A complete iteration: every micro-batch, forward and backward, pre and post, every layer.
    seen = {(m["microbatch"], m["layer_idx"], m["operation"], m["phase"]) for m in (e["metadata"] for e in entries)}
    assert seen == {(mb, layer, op, ph) for mb in (0, 1) for layer in (0, 1)
                    for op in ("forward", "backward") for ph in ("pre", "post")}


def test_counters_are_unique_and_ordered(tmp_path, run):
    run(tmp_path, [0])
    counters = [int(FILE_NAME_RE.match(e["file"])["counter"]) for e in manifest(tmp_path)]
    assert counters == sorted(counters) and len(set(counters)) == len(counters)


def test_restart_never_overwrites(tmp_path, monkeypatch, run):
    import megatron.quant.capture.session as session

    class FrozenClock(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2025, 9, 8, 9, 52, 20)

    monkeypatch.setattr(session, "datetime", FrozenClock)  # both runs share one timestamp
    run(tmp_path, [0])
    first = {p.name: p.stat().st_mtime_ns for p in Path(tmp_path, "bf16").glob("*.pt")}
    tensor_saver.close()
    run(tmp_path, [0])
    files = {p.name: p.stat().st_mtime_ns for p in Path(tmp_path, "bf16").glob("*.pt")}
    assert len(files) == 2 * len(first) and all(files[name] == mtime for name, mtime in first.items())
    assert len(manifest(tmp_path)) == len(files)


@pytest.mark.parametrize("config, key, expected", [
    ({"layers": "1"}, "layer_idx", [1]),
    ({"roles": "qkv,core_attention"}, "role", ["core_attention", "qkv"]),
    ({"tensors": "grad_weight"}, "tensor_name", ["grad_weight"]),
    ({"microbatches": "1"}, "microbatch", [1]),
    ({"ranks": "0"}, "rank", [0]),
])
def test_filters_select(tmp_path, config, key, expected, run):
    run(tmp_path, [0], n_layers=2, **config)
    assert captured(tmp_path, key) == expected


def test_rank_filter_excluding_this_rank_captures_nothing(tmp_path, run):
    run(tmp_path, [0], ranks="1")
    assert not tensor_saver.is_active() and not any(Path(tmp_path).iterdir())


@pytest.mark.parametrize("window, expected", [
    ("2", [2]), ("1,4", [1, 4]), ("1-3", [1, 2, 3]), ("every:2", [0, 2, 4]),
])
def test_iteration_windows(tmp_path, window, expected, run):
    run(tmp_path, range(6), n_layers=1, iterations=window, mode="stats")
    assert captured(tmp_path, "iteration") == expected


def test_unset_window_captures_the_first_iteration_run(tmp_path, run):
    run(tmp_path, range(5, 8), n_layers=1, mode="stats")  # e.g. a run resumed at iteration 5
    assert captured(tmp_path, "iteration") == [5]


def test_window_before_a_resumed_run_falls_back_to_its_first_iteration(tmp_path, run):
    with pytest.warns(RuntimeWarning, match=r"'0-2' has no iteration in this run.*capturing iteration 5"):
        run(tmp_path, range(5, 8), n_layers=1, iterations="0-2", mode="stats")
    assert captured(tmp_path, "iteration") == [5]


def test_window_after_the_run_end_falls_back_when_the_run_is_known(tmp_path, run):
    with pytest.warns(RuntimeWarning, match=r"'100' has no iteration in this run \(iterations 0\.\.3\)"):
        run(tmp_path, range(4), n_layers=1, iterations="100", run_iterations=range(0, 4))
    assert captured(tmp_path, "iteration") == [0]
    assert len(manifest(tmp_path)) == 2 * CAPTURES_PER_LAYER  # the whole iteration, both micro-batches


def test_window_after_the_run_end_warns_at_close_when_the_run_is_unknown(tmp_path, run):
    run(tmp_path, range(4), n_layers=1, iterations="100")
    with pytest.warns(RuntimeWarning, match="'100' was never reached.*nothing was captured"):
        tensor_saver.close()
    assert not any(Path(tmp_path).iterdir())


def test_disabled_captures_nothing(tmp_path, capture_session):
    capture_session(enabled=False)
    run_iteration(FakeModel(n_layers=1), 0)
    assert not tensor_saver.is_active() and not any(Path(tmp_path).iterdir())


def test_unconfigured_saver_is_inactive():
    assert not tensor_saver.is_active() and tensor_saver.iteration_summary() == {}
    assert not tensor_saver.capture_complete()


def test_stats_mode_writes_manifest_lines_only(tmp_path, run):
    run(tmp_path, [0], n_layers=1, mode="stats")
    entries = manifest(tmp_path)
    assert len(entries) == 2 * CAPTURES_PER_LAYER and all(e["file"] is None for e in entries)
    assert not list(Path(tmp_path, "bf16").glob("*.pt"))
    assert all(e["metadata"]["stats"]["numel"] > 0 for e in entries)


def test_iteration_summary_counts_this_iterations_records(tmp_path, capture_session):
    capture_session(iterations="0", mode="stats")
    model = FakeModel(n_layers=1)
    run_iteration(model, 0)
    assert tensor_saver.iteration_summary()["capture/records"] == 2 * CAPTURES_PER_LAYER
    run_iteration(model, 1)
    assert tensor_saver.iteration_summary() == {}


def test_exit_after_capture(tmp_path, capture_session):
    capture_session(iterations="1-2", exit_after_capture=True, mode="stats")
    model = FakeModel(n_layers=1)
    done = []
    for iteration in range(5):
        run_iteration(model, iteration)
        done.append(tensor_saver.capture_complete())
    assert done == [False, False, True, True, True]


@pytest.mark.parametrize("config", [{"iterations": "0", "exit_after_capture": False},
                                    {"iterations": "every:2", "exit_after_capture": True}])
def test_capture_never_complete_without_exit_option_or_with_endless_window(tmp_path, config, run):
    run(tmp_path, range(3), n_layers=1, mode="stats", **config)
    assert not tensor_saver.capture_complete()


def test_quota_stops_capture_with_one_warning(tmp_path, run):
    quota_gb = 60_000 / 2**30
    with pytest.warns(RuntimeWarning, match="size quota") as warned:
        run(tmp_path, [0], n_layers=2, max_gb=quota_gb)
    assert len([w for w in warned if "capture stopped" in str(w.message)]) == 1
    on_disk = sum(p.stat().st_size for p in Path(tmp_path).rglob("*") if p.is_file())
    assert 0 < len(manifest(tmp_path)) < 2 * 2 * CAPTURES_PER_LAYER and on_disk <= 60_000


def test_full_queue_makes_training_wait_without_dropping(tmp_path, monkeypatch, capture_session):
    import threading

    import megatron.quant.capture.writer as writer

    release = threading.Event()
    real_save = torch.save

    def gated_save(obj, path):
        release.wait(timeout=30)  # the writer is held until the training thread has had to wait
        real_save(obj, path)

    monkeypatch.setattr(writer.torch, "save", gated_save)
    capture_session(iterations="0", queue_mb=1)
    site = CaptureSite("linear", "linear", 0, "m", "fc1", "bf16")
    position.set_iteration(0)
    big = torch.zeros(2**20 // 4 + 1)  # just over the 1 MiB bound: each must wait for the previous
    threading.Timer(0.2, release.set).start()
    for name in ("input", "weight", "output"):
        tensor_saver.capture(site, "forward", "pre", {name: big})
    tensor_saver.flush()
    assert tensor_saver.writer_stats()["waits"] >= 1
    assert len(manifest(tmp_path)) == 3 and len(list(Path(tmp_path, "bf16").glob("*.pt"))) == 3


def test_capture_rejects_bad_arguments(tmp_path, capture_session):
    capture_session()
    position.set_iteration(0)
    site = CaptureSite("linear", "linear", 0, "m", "fc1", "bf16")
    with pytest.raises(ValueError, match="operation='fwd'.*allowed"):
        tensor_saver.capture(site, "fwd", "pre", {"input": torch.ones(2)})
    with pytest.raises(ValueError, match="quant_type='a/b'.*allowed"):
        tensor_saver.capture(CaptureSite("linear", "linear", 0, "m", "fc1", "a/b"), "forward", "pre",
                             {"input": torch.ones(2)})


def test_configure_from_env(tmp_path, monkeypatch, capture_session):  # the fixture closes the session
    monkeypatch.setenv("TENSOR_SAVE_ENABLED", "1")
    monkeypatch.setenv("TENSOR_SAVE_DIR", str(tmp_path))
    monkeypatch.setenv("TENSOR_SAVE_MODE", "stats")
    tensor_saver.configure()
    run_iteration(FakeModel(n_layers=1), 0)
    tensor_saver.flush()
    assert len(manifest(tmp_path)) == 2 * CAPTURES_PER_LAYER
    monkeypatch.setenv("TENSOR_SAVE_MODE", "everything")
    with pytest.raises(ValueError, match="TENSOR_SAVE_MODE='everything'"):
        tensor_saver.configure()


def test_quantized_copies_and_format_metadata(tmp_path, capture_session):
    from megatron.quant import formats

    fmt = formats.get_format("mxfp8")
    capture_session(iterations="0", save_quantized=True)
    model = FakeModel(n_layers=1, hidden=32, fmt=fmt)
    run_iteration(model, 0, n_microbatches=1)
    summary = tensor_saver.iteration_summary()
    tensor_saver.flush()
    entries = {(e["metadata"]["module"].rsplit(".", 1)[-1], e["metadata"]["operation"], e["metadata"]["tensor_name"]): e
               for e in manifest(tmp_path)}
    original = entries[("linear_qkv", "backward", "weight")]
    copy = entries[("linear_qkv", "backward", "weight_quantized")]
    assert copy["metadata"]["quantized"] is True and original["metadata"]["quantized"] is False
    expected_format = {"name": fmt.name, "options": json.loads(json.dumps(fmt.options))}
    assert copy["metadata"]["format"] == original["metadata"]["format"] == expected_format
    assert original["metadata"]["axis"] == 0 and FILE_NAME_RE.match(copy["file"])["tensor_name"] == "weight_quantized"
    load = lambda e: torch.load(Path(tmp_path, "bf16", e["file"]), weights_only=True)["tensor"]  # noqa: E731
    assert torch.equal(load(copy), fmt.quantize(load(original), axis=0))
    assert {"overflow", "underflow_ratio", "sqnr_db", "cosine"} <= set(original["metadata"]["stats"])
    assert "overflow" not in copy["metadata"]["stats"]  # unquantized operands carry tensor stats only
    # Copies exist exactly for the operands that carry a format.
    assert {key for key in entries if key[2].endswith("_quantized")} == {
        (module, op, f"{name}_quantized") for module in ("linear_qkv", "linear_proj")
        for op, names in (("forward", ("input", "weight")), ("backward", ("grad_output", "weight"))) for name in names}
    assert summary["quant/qkv/weight/sqnr_db"] == pytest.approx(
        (original["metadata"]["stats"]["sqnr_db"] + entries[("linear_qkv", "forward", "weight")]["metadata"]["stats"]
         ["sqnr_db"]) / 2)


def test_parameter_statistics_are_reused_only_while_unchanged(tmp_path, monkeypatch, capture_session):
    import megatron.quant.capture.snapshot as snapshot

    computed = []
    monkeypatch.setattr(snapshot, "capture_stats", lambda x, *args: computed.append(1) or {"mean": x.mean().item()})
    capture_session(iterations="0-1", mode="stats")
    site = CaptureSite("linear", "linear", 0, "m", "fc1", "bf16")
    weight = torch.nn.Parameter(torch.ones(4, 4))
    position.set_iteration(0)
    for mb in range(2):
        position.set_microbatch(mb, mb)
        tensor_saver.capture(site, "forward", "pre", {"weight": weight, "input": torch.ones(4)})
    assert len(computed) == 3  # the weight once, the input twice
    with torch.no_grad():
        weight.add_(1.0)  # an in-place update bumps the version: computed afresh
    tensor_saver.capture(site, "backward", "pre", {"weight": weight})
    position.set_iteration(1)
    tensor_saver.capture(site, "forward", "pre", {"weight": weight})
    tensor_saver.flush()
    means = [e["metadata"]["stats"]["mean"] for e in manifest(tmp_path) if e["metadata"]["tensor_name"] == "weight"]
    assert means == [1.0, 1.0, 2.0, 2.0] and len(computed) == 5


def test_paused_block_records_nothing_and_capture_resumes_after(tmp_path, capture_session):
    capture_session(mode="stats")
    model = FakeModel(n_layers=1)
    run_iteration(model, 0, n_microbatches=1)
    tensor_saver.flush()
    before = len(manifest(tmp_path))
    with tensor_saver.paused():
        assert not tensor_saver.is_active()
        model(torch.randn(2, 4, model.hidden)).sum().backward()  # e.g. a validation pass
    tensor_saver.flush()
    assert before > 0 and len(manifest(tmp_path)) == before
    assert tensor_saver.is_active()
