"""Regenerate README's picture: report.html of examples/llama.py at tp 2 x pp 2, in headless Chromium.

    python docs/pictures.py                  # writes docs/images/report.png
    python docs/pictures.py --out /tmp/x.png

The page is graphsplit's own report.html, opened from disk exactly as a user opens it, on its
graph tab (repeated blocks collapsed, as the page opens). Chromium is the system's (Debian's `chromium`, or the
binary named by $GRAPHSPLIT_CHROMIUM), driven through playwright, as the suite's browser tests do.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PICTURE = ROOT / "docs" / "images" / "report.png"
VIEWPORT = {"width": 1960, "height": 720}


def chromium() -> str | None:
    """The Chromium binary to drive: $GRAPHSPLIT_CHROMIUM, else the first on PATH."""
    for candidate in (os.environ.get("GRAPHSPLIT_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        found = candidate and shutil.which(candidate)
        if found:
            return found
    return None


def write_report(out: Path) -> Path:
    """transform examples/llama.py --tp 2 --pp 2 --checkpoint blocks --autocast bf16 --out OUT."""
    from graphsplit import Plan, transform

    transform(str(ROOT / "examples" / "llama.py"), Plan(tp=2, pp=2, checkpoint="blocks", autocast="bf16"), out)
    return out / "report.html"


def screenshot(browser, report: Path, png: Path) -> Path:
    """The graph tab of REPORT as a PNG (playwright's BROWSER)."""
    page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
    try:
        page.goto(report.resolve().as_uri())
        page.wait_for_function("window.graphsplitReady !== undefined")
        page.click('#tabs button[data-tab="graph"]')
        png.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(png))
    finally:
        page.close()
    return png


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=PICTURE, help=f"the PNG to write (default {PICTURE.relative_to(ROOT)})")
    args = parser.parse_args()
    binary = chromium()
    if binary is None:
        raise SystemExit("error: no Chromium binary: apt-get install chromium, or set GRAPHSPLIT_CHROMIUM")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        report = write_report(Path(tmp) / "llama")
        browser = p.chromium.launch(executable_path=binary)
        try:
            screenshot(browser, report, args.out)
        finally:
            browser.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
