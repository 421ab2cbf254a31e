"""Render every HTML report the commands write in a real headless browser and save PNG screenshots.

    python scripts/screenshots.py [--out shots/] [--time-limit 20] [--only solve,audit,...] [--browser PATH]

Runs, on the shipped data, the commands that draw pictures -- ``audit --report``, ``sweep --report``,
``solve --window --report`` (solve's report: the windows' devices needed), ``sweep --windows``, ``replay
--report`` and ``calibrate --report`` -- into ``OUT/runs/NAME``, then opens each ``report.html`` (or, where a
command writes only pictures, a page made here that shows them) in headless Chromium and saves
``OUT/NAME.png`` (the whole page, one tall screenshot). Look at the PNGs: a picture that reads wrong in a
browser is wrong. Not a test (Chromium is not in CI): Debian's ``apt-get install chromium`` provides it.
"""

from __future__ import annotations

import argparse
import base64
import html
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "data" / "traces"
CONV = str(TRACES / "AzureLLMInferenceTrace_conv.csv")
CODE = str(TRACES / "AzureLLMInferenceTrace_code.csv")
PROFILE = str(ROOT / "data" / "profiles" / "opt13b-a100-tp1.toml")
SERVING = ROOT / "data" / "examples" / "serving"
BROWSER_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--hide-scrollbars")


def runs(out: Path, limit: str) -> dict[str, tuple[list[str], Path]]:
    """name -> (command arguments after ``python -m``, the folder whose report.html or PNGs are shot)."""
    r = out / "runs"
    return {
        "audit": (["model.audit", CONV, "--columns", "azure", "--cost-model", "strict", "--shapes-from",
                   str(ROOT / "data" / "examples" / "audit" / "neuron.json"), "--shapes-format", "nxdi",
                   "--time-limit", limit, "--report", str(r / "audit")], r / "audit"),
        "sweep": (["model.sweep", CODE, CONV, "--columns", "azure", "--device-profile", PROFILE,
                   "--k", "1,2,4,6,8,12,16", "--time-limit", limit, "--out", str(r / "sweep" / "sweep.csv"),
                   "--report", str(r / "sweep")],
                  r / "sweep"),
        "windows": (["model.solve", CONV, "--columns", "azure", "--device-profile", PROFILE, "--limit-shapes", "8",
                     "--window", "60", "--time-limit", limit, "--out", str(r / "windows" / "plans"), "--report",
                     str(r / "windows" / "report")], r / "windows" / "report"),
        "window-sweep": (["model.sweep", CONV, "--columns", "azure", "--device-profile", PROFILE, "--k", "8",
                          "--windows", "10,60,300", "--time-limit", limit, "--out", str(r / "window-sweep" / "s.csv"),
                          "--report", str(r / "window-sweep")], r / "window-sweep"),
        "replay": (["model.replay", str(SERVING / "trace.csv"), "--device-profile", str(SERVING / "profile.toml"),
                    "--graphs", str(SERVING / "gaudi-buckets.txt"), "--shapes-format", "gaudi-file", "--replicas", "4",
                    "--slo-ttft-ms", "2000", "--slo-tpot-ms", "100", "--report", str(r / "replay")], r / "replay"),
        "calibrate": (["model.calibrate", str(ROOT / "data" / "examples" / "calibrate" / "measurements.csv"),
                       "--out", str(r / "calibrate" / "profile.toml"), "--report", str(r / "calibrate")],
                      r / "calibrate"),
    }


def picture_page(folder: Path) -> Path:
    """A page showing every PNG of a folder (for the commands that write pictures only), beside them."""
    parts = [f"<h1>{html.escape(folder.name)}</h1>"]
    for png in sorted(folder.glob("*.png")):
        data = base64.b64encode(png.read_bytes()).decode()
        parts.append(f"<h2>{html.escape(png.name)}</h2><img src='data:image/png;base64,{data}' style='max-width:100%'>")
    page = folder.parent / f"{folder.name}-pictures.html"
    page.write_text("<!doctype html><meta charset='utf-8'><body style='font-family:sans-serif'>" + "".join(parts))
    return page


def shoot(browser: str, page: Path, png: Path, width: int, height: int) -> None:
    """One screenshot of ``page`` at ``width`` x ``height`` CSS pixels (tall enough to hold the page)."""
    profile = png.parent / ".browser-profile"
    cmd = [browser, *BROWSER_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
           f"--screenshot={png}", page.resolve().as_uri()]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    shutil.rmtree(profile, ignore_errors=True)


TALL = 16000  # CSS pixels: the window a page is shot in (a screenshot cannot scroll); the blank foot is cut


def crop_blank_foot(png: Path) -> None:
    """Cut the white rows under the page's last content (the window is taller than any page)."""
    import numpy as np
    from PIL import Image

    with Image.open(png) as image:
        pixels = np.asarray(image.convert("L"))
        rows = np.flatnonzero((pixels < 250).any(axis=1))
        if rows.size:
            image.crop((0, 0, image.width, min(image.height, int(rows[-1]) + 40))).save(png)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("shots"))
    parser.add_argument("--time-limit", default="20", help="--time-limit of each planning command (s)")
    parser.add_argument("--only", help="comma-separated names (default: all)")
    parser.add_argument("--browser", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--width", type=int, default=1400)
    args = parser.parse_args()
    todo = runs(args.out, args.time_limit)
    names = args.only.split(",") if args.only else list(todo)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in names:
        cmd, folder = todo[name]
        shutil.rmtree(args.out / "runs" / name, ignore_errors=True)
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", *cmd], cwd=ROOT, env=env, capture_output=True, text=True)
        print(f"{name}: exit {done.returncode} in {time.monotonic() - start:.0f} s")
        if done.returncode not in (0, 1):
            print(done.stderr[-2000:])
            continue
        page = folder / "report.html"
        if not page.exists():
            page = picture_page(folder)
        png = args.out / f"{name}.png"
        shoot(args.browser, page, png, args.width, TALL)
        crop_blank_foot(png)
        print(f"  {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
