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
    if not page.is_file():
        raise BrowserCheckError(f"no page at {str(page)!r}")
    browser = browser or find_browser()
    measured = page.with_name(f".{page.stem}.measure.html")
    text = page.read_text(encoding="utf-8").replace("loading='lazy'", "").replace('loading="lazy"', "")
    measured.write_text(text.replace("</body>", _MEASURE + "</body>") if "</body>" in text else text + _MEASURE,
                        encoding="utf-8")
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
