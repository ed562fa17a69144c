"""The GPU check, the wheel download and the report's browser check under careless input: a budget
that is no number of seconds, an --out that is a file or lies under one, unknown options, an offline
pip, binary or missing pages and screenshot paths in the way are one line, before any work."""
import sys

import pytest

from bench.gpu import cli, wheels
from megatron.quant.analysis.browser_check import BrowserCheckError, check_page


@pytest.mark.parametrize("budget", ["nan", "inf"])
def test_a_budget_that_is_no_number_of_seconds_is_refused(capsys, budget):
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["--dry-run", "--budget-s", budget])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--budget-s must be positive, not {budget}" in err, err


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_an_out_in_the_way_is_one_line_before_any_stage(tmp_path, capsys, monkeypatch, where):
    monkeypatch.setattr(cli, "run_stages", lambda *args, **kwargs: pytest.fail("a stage ran"))
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" if where == "file" else tmp_path / "file" / "check"
    assert cli.main(["--dry-run", "--stage", "env", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu_check: error: --out ") and "is an existing file" in err and len(err.splitlines()) == 1


def test_the_wheel_download_parses_its_options_before_running_pip(monkeypatch, capsys):
    monkeypatch.setattr(wheels.subprocess, "run", lambda *args, **kwargs: pytest.fail("pip ran"))
    with pytest.raises(SystemExit) as exit_:
        wheels.main(["--bogus"])
    assert exit_.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        wheels.main(["--help"])
    assert exit_.value.code == 0 and "usage:" in capsys.readouterr().out


def test_a_failed_pip_download_is_one_line(tmp_path, monkeypatch, capsys):
    offline = [sys.executable, "-c", "print('Looking in indexes'); print('ERROR: Could not find a version'); exit(1)"]
    monkeypatch.setattr(wheels, "download_argv", lambda: offline)
    assert wheels.main([], repo=tmp_path) == 2
    err = capsys.readouterr().err
    assert err == "gpu_wheels: error: pip download failed (status 1): ERROR: Could not find a version\n", err


@pytest.mark.parametrize("page", ["png", "binary_html", "directory", "missing"])
def test_a_page_that_is_no_html_is_one_line(tmp_path, page):
    path = {"png": tmp_path / "shot.png", "binary_html": tmp_path / "index.html", "directory": tmp_path,
            "missing": tmp_path / "none.html"}[page]
    if page == "png":
        path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    elif page == "binary_html":
        path.write_bytes(bytes(range(128, 256)) * 4)
    with pytest.raises(BrowserCheckError) as error:
        check_page(path, browser="/bin/false")  # refused before any browser runs
    assert str(path) in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("screenshot", ["under_a_file", "a_directory"])
def test_a_screenshot_path_in_the_way_is_one_line(tmp_path, screenshot):
    page = tmp_path / "index.html"
    page.write_text("<html><body>report</body></html>")
    (tmp_path / "file").write_text("x")
    target = tmp_path / "file" / "shot.png" if screenshot == "under_a_file" else tmp_path
    with pytest.raises(BrowserCheckError, match="is an existing file|is a directory"):
        check_page(page, screenshot=target, browser="/bin/false")
    assert not (tmp_path / ".index.measure.html").exists()
