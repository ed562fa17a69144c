"""A start-up error leaves nothing behind that exit would wait on: no thread, no child process,
no process group (the 'TENSOR_SAVE_LAYERS=-1 does not exit' report: its error path holds none;
the time went to importing torch and megatron-core on a machine at load 50)."""
import multiprocessing
import threading

import pytest
import torch.distributed as dist


@pytest.mark.parametrize("env", [{"TENSOR_SAVE_LAYERS": "-1"}, {"TENSOR_SAVE_LAYERS": "99"},
                                 {"CUSTOM_QUANT_KERNELS": "x" * 100_000}], ids=["-1", "99", "long kernels"])
def test_start_error_leaves_no_thread_process_or_group(tmp_path, monkeypatch, capsys, env):
    from megatron.quant.training.main import main

    monkeypatch.setenv("TENSOR_SAVE_ENABLED", "1")
    monkeypatch.setenv("TENSOR_SAVE_DIR", str(tmp_path / "captures"))
    monkeypatch.setenv("CUSTOM_QUANT_TYPE", "mxfp8")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # earlier tests' threads and children in this worker
    threads, children = set(threading.enumerate()), set(multiprocessing.active_children())
    with pytest.raises(SystemExit) as exc:
        main(["--model", "llama-tiny", "--num-layers", "2", "--mock-data", "--train-iters", "1"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and len(err) < 400, err
    assert set(threading.enumerate()) <= threads and set(multiprocessing.active_children()) <= children
    assert not dist.is_initialized()
