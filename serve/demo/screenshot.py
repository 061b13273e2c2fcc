"""Drive the running demo in Debian's chromium (Playwright, no browser download, every request to a host other
than 127.0.0.1 aborted): classify and segment a shipped example, and save screenshots.

    python -m attnzoo.serve.demo.screenshot --out docs/demo.png          # the zoo's models (ONNX Runtime)
    python -m attnzoo.serve.demo.screenshot --models DIR --out shot.png  # a folder of exported models

The browser test (``tests/serve/test_demo.py``) uses :func:`capture` and checks what it reports.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

from attnzoo.cli import add_debug_flag, entry_point
from attnzoo.serve import examples
from attnzoo.serve.demo.app import build_demo, launch
from attnzoo.serve.loading import load_models
from attnzoo.serve.network import free_port
from attnzoo.zoo import DEFAULT_DATA

__all__ = ["CHROMIUM", "capture", "main"]

CHROMIUM = Path("/usr/bin/chromium")
_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
_BARS = "#cls-label [data-testid$='-confidence-set']"


def capture(url: str, out_dir: Path, *, classify: bool = True, segment: bool = True, timeout_ms: int = 30_000) -> dict:
    """Open ``url``, run the Classify and/or Segment tab on the first shipped example, screenshot each.

    Returns:
        ``labels`` (the classes of the five bars shown), ``overlay_size`` ((w, h) of the overlay image),
        ``legend`` (the legend's text), ``files`` (screenshots: ``demo-classify.png``, ``demo.png``) and
        ``blocked`` (URLs of other hosts the page tried to reach; all were aborted).
    """
    from playwright.sync_api import sync_playwright  # optional: playwright (the [dev] extra)

    if not CHROMIUM.exists():
        raise FileNotFoundError(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict = {"labels": [], "overlay_size": None, "legend": "", "files": [], "blocked": []}

    def guard(route):
        if urlsplit(route.request.url).hostname in (None, "127.0.0.1"):  # None: data: and blob: URLs
            route.continue_()
        else:
            report["blocked"].append(route.request.url)
            route.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.route("**/*", guard)
            page.goto(url, wait_until="load")
            page.wait_for_selector("#cls-button", timeout=timeout_ms)
            if classify:
                page.locator("#cls-image input[type=file]").set_input_files(examples.example_paths("cls")[0])
                page.locator("#cls-button").click()
                page.wait_for_function(f'() => document.querySelectorAll("{_BARS}").length === 5', timeout=timeout_ms)
                bars = page.locator(_BARS)
                report["labels"] = [
                    cast(str, bars.nth(i).get_attribute("data-testid")).removesuffix("-confidence-set")  # _BARS has it
                    for i in range(bars.count())
                ]
                report["files"].append(_shot(page, out_dir / "demo-classify.png"))
            if segment:
                page.get_by_role("tab", name="Segment").click()
                page.locator("#seg-image input[type=file]").set_input_files(examples.example_paths("seg")[0])
                page.locator("#seg-button").click()
                page.wait_for_selector("#seg-overlay img[src]", timeout=timeout_ms)
                page.wait_for_function(
                    "() => document.querySelectorAll('#seg-legend tbody tr').length > 0", timeout=timeout_ms
                )
                report["overlay_size"] = tuple(
                    page.eval_on_selector("#seg-overlay img", "img => [img.naturalWidth, img.naturalHeight]")
                )
                report["legend"] = page.locator("#seg-legend").inner_text()
                report["files"].append(_shot(page, out_dir / "demo.png"))
        finally:
            browser.close()
    return report


def _shot(page, path: Path) -> Path:
    page.screenshot(path=str(path), full_page=True)
    return path


@entry_point
def main(argv: list[str] | None = None) -> int:
    """``python -m attnzoo.serve.demo.screenshot [--models DIR] [--out PNG]``: screenshot the Segment tab; errors
    (no models, no chromium) exit 1 with one ``error: ...`` line (attnzoo.cli)."""
    parser = add_debug_flag(
        argparse.ArgumentParser(
            prog="python -m attnzoo.serve.demo.screenshot",
            description="Screenshot the demo (Segment tab) with Debian's chromium.",
        )
    )
    parser.add_argument("--models", type=Path, default=None, help="folder of exported models (default: the zoo)")
    parser.add_argument("--out", type=Path, default=Path("docs/demo.png"))
    args = parser.parse_args(argv)

    models = load_models(args.models)  # ValueError: no servable models there
    demo = build_demo(models, source=f"`{args.models}`" if args.models else f"the zoo ({DEFAULT_DATA})")
    port = free_port()
    launch(demo, "127.0.0.1", port, block=False)
    try:  # FileNotFoundError: no chromium
        tmp = args.out.parent / ".screenshots"
        report = capture(
            f"http://127.0.0.1:{port}/",
            tmp,
            classify=any(m.task == "cls" for m in models),
            segment=any(m.task == "seg" for m in models),
        )
    finally:
        demo.close()
    shot = report["files"][-1]
    shot.replace(args.out)
    for extra in tmp.glob("*.png"):
        extra.unlink()
    tmp.rmdir()
    print(f"wrote {args.out} ({shot.name.removesuffix('.png')} view); other hosts requested: {len(report['blocked'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
