"""Bad capture settings stop the run at start: an unusable directory, filters that can never match."""
import builtins
import errno

import pytest

from megatron.quant.tensor_saver import SaverConfig

TINY = ["--model", "llama-tiny", "--mock-data", "--train-iters", "2"]  # 2 layers, one process


def _read_only(root: str):
    """``open`` refusing files under ``root``, as a read-only directory would (tests run as root)."""
    real_open = builtins.open

    def refusing_open(file, *args, **kwargs):
        if str(file).startswith(root):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)
    return refusing_open


@pytest.mark.parametrize("where,reason", [("file", "it is a file"), ("under_file", "it lies under a file"),
                                          ("read_only", r"cannot write in it \(Permission denied\)")])
def test_unusable_directory_is_refused_when_capture_is_configured(tmp_path, monkeypatch, capture_session, where,
                                                                   reason):
    from megatron.quant.capture.directory import check_writable

    (tmp_path / "file").write_text("")
    path = {"file": tmp_path / "file", "under_file": tmp_path / "file" / "captures",
            "read_only": tmp_path / "captures"}[where]
    if where == "read_only":
        monkeypatch.setattr(builtins, "open", _read_only(str(path)))
    message = rf"^TENSOR_SAVE_DIR='{path}' is unusable: {reason}; allowed: a writable directory$"
    with pytest.raises(ValueError, match=message):
        check_writable(str(path))
    with pytest.raises(ValueError, match=message):
        capture_session(path)
    capture_session(path, enabled=False)  # capture off: not checked


def test_usable_directory_is_created_and_left_clean(tmp_path, capture_session):
    capture_session(tmp_path / "a" / "b")
    assert list((tmp_path / "a" / "b").iterdir()) == []


@pytest.mark.parametrize("field,value,message", [
    ("layers", "7", r"^TENSOR_SAVE_LAYERS=7 can never match: the run has 2 transformer layers \(0-1\)$"),
    ("ranks", "5-6", r"^TENSOR_SAVE_RANKS=5-6 can never match: the run has 1 ranks \(0-0\)$"),
    ("microbatches", "4", r"^TENSOR_SAVE_MICROBATCHES=4 can never match: the run has 2 micro-batches"),
])
def test_a_filter_that_can_never_match_is_an_error(field, value, message):
    config = SaverConfig(enabled=True, **{field: value})
    with pytest.raises(ValueError, match=message):
        config.check_selectors(num_layers=2, world_size=1, num_microbatches=2)
    SaverConfig(**{field: value}).check_selectors(num_layers=2, world_size=1)  # capture off: nothing to check


def test_a_filter_partly_out_of_range_warns_once(recwarn):
    SaverConfig(enabled=True, layers="1,5-9", ranks="0").check_selectors(num_layers=2, world_size=1)
    assert [str(w.message) for w in recwarn] == [
        "TENSOR_SAVE_LAYERS: 5-9 ignored, the run has 2 transformer layers (0-1)"]


@pytest.mark.parametrize("env,expected", [
    ({"TENSOR_SAVE_LAYERS": "7"}, "TENSOR_SAVE_LAYERS=7 can never match"),
    ({"TENSOR_SAVE_RANKS": "5"}, "TENSOR_SAVE_RANKS=5 can never match"),
    ({"TENSOR_SAVE_DIR": "{file}"}, "is unusable: it is a file"),
])
def test_training_stops_at_start_with_one_line(tmp_path, monkeypatch, capsys, env, expected):
    from megatron.quant.training.main import main

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TENSOR_SAVE_ENABLED", "1")
    monkeypatch.setenv("TENSOR_SAVE_DIR", str(tmp_path / "captures"))
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(file=tmp_path / "file"))
    with pytest.raises(SystemExit) as exc:
        main(TINY)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.startswith("megatron-quant-train: error: ")
    assert expected in err and len(err.splitlines()) == 1


def test_directory_without_hard_links_is_refused(tmp_path, monkeypatch, capture_session):
    from megatron.quant.capture import directory

    def no_links(source, target):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(directory.os, "link", no_links)
    with pytest.raises(ValueError, match=r"is unusable: cannot hard-link files in it \(Operation not permitted\)"):
        capture_session()
    assert list(tmp_path.iterdir()) == []
