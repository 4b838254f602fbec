"""Execute notebooks, render them to HTML with their widget state, and screenshot them.

For each notebook: execute it with nbclient (widget state stored in the notebook), export
it to HTML with nbconvert's ``lab`` template, pointing the widget renderer and require.js at
local copies (so it renders offline), and screenshot the page with headless Chromium. The
executed notebook, the HTML and the PNG go to ``--out`` (``benchmarks/out/notebooks`` by
default). Committed notebooks stay output-free; this is where outputs are looked at.

Needs: ``nbclient``, ``nbconvert`` (``pip install nbconvert``), Chromium (Debian:
``apt-get install chromium``) and the JavaScript of ``@jupyter-widgets/html-manager`` and
``requirejs``: pass ``--js-dir`` with ``html-manager/dist/embed-amd.js`` and
``requirejs/require.js`` in it, or let the script fetch them once with ``npm pack``.

The screenshot is taken at a device scale factor of 2 (``--scale``), as on a high-DPI laptop
screen, so what is blurry or small there is blurry or small here too. The script also prints
the smallest text size the page uses, in CSS pixels: the smallest font size set in the
notebook's HTML outputs and widget state, and the smallest text of the inline SVG plots as
rendered at their displayed width.

Usage::

    python benchmarks/screenshot_notebooks.py [notebooks/02_live_bottleneck_dashboard.ipynb ...]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
HTML_MANAGER = "@jupyter-widgets/html-manager@1"
REQUIREJS = "requirejs@2"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--hide-scrollbars"]


def fetch_js(js_dir: pathlib.Path) -> pathlib.Path:
    """Make sure ``js_dir`` holds html-manager's dist/ and require.js (npm pack once)."""
    embed = js_dir / "html-manager" / "dist" / "embed-amd.js"
    require = js_dir / "requirejs" / "require.js"
    if embed.exists() and require.exists():
        return js_dir
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit(f"need {embed} and {require}: install npm, or pass --js-dir with them")
    js_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for spec, name in ((HTML_MANAGER, "html-manager"), (REQUIREJS, "requirejs")):
            out = subprocess.run([npm, "pack", spec, "--silent"], cwd=tmp, check=True, capture_output=True,
                                 text=True).stdout.split()[-1]
            with tarfile.open(os.path.join(tmp, out)) as tar:
                tar.extractall(tmp, filter="data")
            dest = js_dir / name
            if dest.exists():
                shutil.rmtree(dest)
            shutil.move(os.path.join(tmp, "package"), dest)
    return js_dir


def execute(path: pathlib.Path, timeout: int) -> object:
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return nb


def to_html(nb: object, out_dir: pathlib.Path, js_dir: pathlib.Path) -> str:
    from nbconvert import HTMLExporter

    # Relative URLs: the page works wherever out_dir is copied, with no network.
    rel = os.path.relpath(js_dir, out_dir)
    exporter = HTMLExporter(template_name="lab")
    exporter.require_js_url = f"{rel}/requirejs/require.js"
    exporter.widget_renderer_url = f"{rel}/html-manager/dist/embed-amd.js"
    body, _ = exporter.from_notebook_node(nb)
    return body


def smallest_text_px(nb: object, display_width: float = 980.0) -> tuple[float | None, float | None]:
    """Smallest CSS font size in the HTML outputs and widget state, and smallest SVG text as shown.

    An inline SVG plot is shown ``display_width`` CSS pixels wide (the dashboard's max-width) or
    at its own width; its text sizes scale by display width / the SVG's own width.
    """
    import json
    import re

    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            texts += [v if isinstance(v, str) else "".join(v) for k, v in data.items()
                      if k in ("text/html", "image/svg+xml")]
    texts.append(json.dumps(nb.metadata.get("widgets", {})))
    blob = "\n".join(texts).replace('\\"', '"')
    html_only = re.sub(r"<svg.*?</svg>", "", blob, flags=re.DOTALL)
    css = [float(x) for x in re.findall(r"font-size:\s*([0-9.]+)px", html_only)]
    svg_px = []
    for svg in re.findall(r"<svg.*?</svg>", blob, flags=re.DOTALL):
        box = re.search(r'viewBox="[0-9.\-]+ [0-9.\-]+ ([0-9.]+) [0-9.]+"', svg)
        if box is None:
            continue
        own = float(box.group(1))
        shown = display_width if 'width="100%"' in svg else own
        sizes = [float(x) for x in re.findall(r"font(?:-size)?:\s*(?:[a-z]+ )*([0-9.]+)px", svg)]
        if sizes:
            svg_px.append(min(sizes) * shown / own)
    return (min(css) if css else None), (min(svg_px) if svg_px else None)


def screenshot(chromium: str, html: pathlib.Path, png: pathlib.Path, width: int, height: int,
               scale: float = 2.0) -> None:
    cmd = [chromium, *CHROMIUM_FLAGS, f"--window-size={width},{height}", "--virtual-time-budget=15000",
           f"--force-device-scale-factor={scale:g}", f"--screenshot={png}", html.as_uri()]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    if res.returncode != 0 or not png.exists():
        raise RuntimeError(f"chromium failed ({res.returncode}): {res.stderr[-2000:]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("notebooks", nargs="*", type=pathlib.Path,
                   help="notebooks to render (default: every notebook in notebooks/)")
    p.add_argument("--out", type=pathlib.Path, default=HERE / "out" / "notebooks")
    p.add_argument("--js-dir", type=pathlib.Path, default=HERE / "out" / "js")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=3600)
    p.add_argument("--scale", type=float, default=2.0, help="device scale factor of the screenshot")
    p.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    args = p.parse_args()

    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        print("error: no Chromium found (Debian: apt-get install chromium)", file=sys.stderr)
        return 1
    notebooks = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    js_dir = fetch_js(args.js_dir.resolve())
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    import nbformat

    for path in notebooks:
        path = path.resolve()
        print(f"{path.name}: executing ...", flush=True)
        nb = execute(path, args.timeout)
        nbformat.write(nb, out / path.name)
        html = out / (path.stem + ".html")
        html.write_text(to_html(nb, out, js_dir))
        png = out / (path.stem + ".png")
        screenshot(chromium, html, png, args.width, args.height, args.scale)
        widgets = "widgets" in nb.metadata
        css_px, svg_px = smallest_text_px(nb)
        print(f"  {html.relative_to(ROOT) if html.is_relative_to(ROOT) else html}"
              f" ({'with' if widgets else 'no'} widget state), screenshot {png.name} "
              f"({png.stat().st_size / 1024:.0f} KiB, {args.width}x{args.height} CSS px at scale {args.scale:g})")
        print("  smallest text: " + (f"{css_px:g} px in HTML" if css_px else "no explicit HTML font size")
              + (f", {svg_px:.1f} px in the SVG plots as displayed" if svg_px else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
