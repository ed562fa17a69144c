#!/usr/bin/env python
"""Render a report page in headless Chromium at a reader's window width: fails (status 1) when the
page scrolls sideways, and saves a full-page screenshot to look at. See docs/report.md.

    python script/check_report_in_browser.py quickstart_out/draw/index.html --screenshot shot.png
"""
import argparse
import sys
from pathlib import Path

from megatron.quant.analysis.browser_check import BrowserCheckError, check_page


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page", type=Path, help="the report's index.html")
    parser.add_argument("--width", type=int, default=1400, help="window width in pixels (default: %(default)s)")
    parser.add_argument("--screenshot", type=Path, default=None,
                        help="where the full-page PNG goes (default: PAGE's folder/browser_screenshot.png)")
    args = parser.parse_args()
    if args.width < 320:
        parser.error(f"--width must be at least 320 pixels, got {args.width}")
    screenshot = args.screenshot or args.page.parent / "browser_screenshot.png"
    try:
        layout = check_page(args.page, args.width, screenshot)
    except BrowserCheckError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    size = f"{layout.scroll_width} px wide in a {layout.client_width} px window"
    verdict = f"scrolls sideways: {size}" if layout.scrolls_sideways else f"fits: {size}"
    print(f"{args.page} at {args.width} px: {verdict}, {layout.scroll_height} px tall; screenshot {screenshot}")
    return 1 if layout.scrolls_sideways else 0


if __name__ == "__main__":
    sys.exit(main())
