"""A report page as a reader sees it: rendered by headless Chromium at a given window width, its
horizontal overflow measured in the rendered DOM and a full-page screenshot taken.

The measurement runs on a copy of the page beside it (same relative links) with a small script
appended that writes ``scrollWidth``, ``clientWidth`` and ``scrollHeight`` into the DOM once every
image has loaded (lazy loading off, so that the images below the fold count too); Chromium's
``--dump-dom`` prints that DOM.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from megatron.quant.output_dir import OutputDirError, check_output_dir

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars")
MAX_SCREENSHOT_HEIGHT = 16_000  # pixels: Chromium's screenshots fail well beyond this
_MEASURE = """<script>window.addEventListener('load', () => {
  const d = document.documentElement, p = document.createElement('pre');
  p.id = 'layout-measure';
  p.textContent = `scrollWidth=${d.scrollWidth} clientWidth=${d.clientWidth} scrollHeight=${d.scrollHeight}`;
  document.body.appendChild(p);
});</script>"""
_RESULT = re.compile(r"scrollWidth=(\d+) clientWidth=(\d+) scrollHeight=(\d+)")


class BrowserCheckError(Exception):
    """No browser, or it rendered nothing we could read."""


@dataclass(frozen=True)
class PageLayout:
    scroll_width: int   # the page's full width, pixels
    client_width: int   # the window's width without scroll bars
    scroll_height: int
    screenshot: Optional[Path]

    @property
    def scrolls_sideways(self) -> bool:
        return self.scroll_width > self.client_width


def find_browser() -> str:
    """The first Chromium-like browser on PATH; BrowserCheckError names the package to install."""
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    raise BrowserCheckError(f"no browser found (looked for {', '.join(BROWSERS)}): "
                            "install Debian's 'chromium' package (apt-get install chromium)")


def check_page(page: Path, width: int = 1400, screenshot: Optional[Path] = None,
               browser: Optional[str] = None, timeout: float = 120.0) -> PageLayout:
    """Render ``page`` at ``width`` pixels, measure its layout, and save a full-page screenshot to
    ``screenshot`` when given (a page taller than MAX_SCREENSHOT_HEIGHT is shot at a smaller
    device scale: the same layout, fewer pixels)."""
    text = _page_text(page).replace("loading='lazy'", "").replace('loading="lazy"', "")
    if screenshot is not None:
        try:
            check_output_dir(screenshot.parent, "--screenshot's folder")
        except OutputDirError as error:
            raise BrowserCheckError(str(error)) from None
        if screenshot.is_dir():
            raise BrowserCheckError(f"--screenshot {str(screenshot)!r} is a directory; give a .png file path")
    browser = browser or find_browser()
    measured = page.with_name(f".{page.stem}.measure.html")
    try:
        measured.write_text(text.replace("</body>", _MEASURE + "</body>") if "</body>" in text else text + _MEASURE,
                            encoding="utf-8")
    except OSError as error:
        raise BrowserCheckError(f"cannot write the measuring copy beside {str(page)!r} ({error.strerror}); the "
                                f"check renders it there (same relative links): copy the report to a writable "
                                f"folder") from None
    try:
        dom = _run(browser, ["--dump-dom", "--virtual-time-budget=20000", f"--window-size={width},900",
                             measured.resolve().as_uri()], timeout)
        match = _RESULT.search(dom)
        if match is None:
            raise BrowserCheckError(f"the browser rendered {str(page)!r} but left no measurement "
                                    f"(its DOM starts {dom[:120]!r})")
        scroll_width, client_width, scroll_height = map(int, match.groups())
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            scale = min(1.0, MAX_SCREENSHOT_HEIGHT / max(1, scroll_height))
            _run(browser, [f"--screenshot={screenshot.resolve()}", f"--window-size={width},{scroll_height}",
                           f"--force-device-scale-factor={scale:.4f}", "--virtual-time-budget=20000",
                           measured.resolve().as_uri()], timeout)
            if not screenshot.is_file():
                raise BrowserCheckError(f"the browser wrote no screenshot to {str(screenshot)!r}")
    finally:
        measured.unlink()
    return PageLayout(scroll_width, client_width, scroll_height, screenshot)


MAX_PAGE_BYTES = 50_000_000  # a report page is a few hundred kB


def _page_text(page: Path) -> str:
    """The page's HTML; BrowserCheckError for no regular file, a huge one, or bytes that are no UTF-8 text."""
    if not page.is_file():
        what = "a directory" if page.is_dir() else "no page"
        raise BrowserCheckError(f"{str(page)!r} is {what}; give a report's index.html")
    if page.stat().st_size > MAX_PAGE_BYTES:
        raise BrowserCheckError(f"{str(page)!r} is {page.stat().st_size:,} bytes, more than a report page's "
                                f"{MAX_PAGE_BYTES:,}; give a report's index.html")
    data = page.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BrowserCheckError(f"{str(page)!r} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset "
                                f"{error.start}): not an HTML page; give a report's index.html") from None
    if "\x00" in text:
        raise BrowserCheckError(f"{str(page)!r} holds NUL bytes: not an HTML page; give a report's index.html")
    return text


def _run(browser: str, arguments: list[str], timeout: float) -> str:
    """The browser's stdout, run with a fresh, empty profile (nothing of a user's leaks in)."""
    with tempfile.TemporaryDirectory(prefix="report-browser-") as profile:
        try:
            done = subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", *arguments],
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BrowserCheckError(f"the browser took longer than {timeout:g} s") from None
    if done.returncode != 0:
        raise BrowserCheckError(f"the browser exited with status {done.returncode}: "
                                f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}")
    return done.stdout
