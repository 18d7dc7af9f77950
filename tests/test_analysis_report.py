"""Tests of posenc.analysis.report: one self-contained page, every image embedded, and (when
Chromium is installed) every image loads in a real headless browser without console errors."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import tempfile

import pytest

import posenc
from _analysis_toys import ToyALiBi, ToyLearnedBias, ToyRoPE, registered
from posenc.analysis import check, make_probe, verify
from posenc.analysis.plots import PLOT_KINDS
from posenc.analysis.report import build_report, report_kinds

SMALL = {"d_model": 32, "head_dim": 16, "num_heads": 4, "max_len": 64}
IMG = re.compile(r'<img src="([^"]*)"')


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    with registered(ToyRoPE, ToyALiBi, ToyLearnedBias):
        path = build_report(out, context=SMALL)
        names = posenc.schemes()
        kinds = {
            n: report_kinds(p, check(p, ["translation_inv"])) for n in names for p in [make_probe(n, SMALL)]
        }
    expected = 1 + sum(len(k) for k in kinds.values())  # the comparison figure + the kinds per scheme
    # every kind appears where it applies; the kernel heatmap only where it is not a constant-diagonal image
    assert kinds["toy_alibi"] == ["kernel_curve", "bias", "kernel"]
    assert kinds["learned"] == ["heatmap", "kernel_curve", "kernel"]
    assert kinds["toy_rope"] == ["heatmap", "frequencies", "kernel_curve", "scalings"]
    drawn = {k for ks in kinds.values() for k in ks}
    assert kinds["nope"] == [] and set(PLOT_KINDS) - {"waves", "similarity", "surface"} == drawn
    return path, names, expected


def test_every_image_is_embedded_as_a_png_data_uri(report):
    path, _, expected = report
    html = path.read_text(encoding="utf-8")
    srcs = IMG.findall(html)
    assert len(srcs) == expected
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    # self-contained: nothing fetched from elsewhere
    assert not re.search(r'(src|href)="(https?:|//|file:)', html)
    assert "<script" not in html


def test_report_has_the_property_table_formulas_and_seed_corrections(report):
    path, names, _ = report
    html = path.read_text(encoding="utf-8")
    for name in names:
        assert f"<tr><th>{name}</th>" in html and f"id='{name}'" in html
    assert "positional kernel" in html and "trace(R<sub>m</sub><sup>T</sup>R<sub>n</sub>)" in html
    assert "0.0128" in html and "0.024543" in html  # the seeds' numbers, next to the measured ones
    with registered(ToyRoPE, ToyALiBi, ToyLearnedBias):
        broken = [f"{r.scheme}.{r.property}" for r in verify(context=SMALL) if r.broken_promise]
    if broken:  # tiny heads (d_h = 16) over L = 64 need not decay; the page must say so
        assert "Broken promises: " + ", ".join(broken) in html
    else:
        assert "No scheme breaks a property it promises." in html


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

CHECK = """<script>
window.addEventListener("load", () => {
  const imgs = [...document.images];
  const ok = imgs.filter((i) => i.complete && i.naturalWidth > 0).length;
  const div = document.createElement("div");
  div.id = "img-check";
  div.textContent = `images loaded ${ok}/${imgs.length}`;
  document.body.appendChild(div);
});
</script></body>"""


def _chromium(*args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--enable-logging=stderr",
                "--v=0",
                "--virtual-time-budget=10000",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_report_loads_in_headless_chromium(report):
    path, _, expected = report
    # 1. the page itself: no console messages at all (errors would be logged as CONSOLE lines)
    plain = _chromium("--dump-dom", path.resolve().as_uri())
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert "CONSOLE" not in plain.stderr and "Uncaught" not in plain.stderr, plain.stderr[-2000:]
    assert "<h1>posenc" in plain.stdout
    # 2. a copy with a checking script: every <img> decoded with a non-zero width
    probe = path.with_name("check.html")
    probe.write_text(path.read_text(encoding="utf-8").replace("</body>", CHECK), encoding="utf-8")
    checked = _chromium("--dump-dom", probe.resolve().as_uri())
    assert f"images loaded {expected}/{expected}" in checked.stdout, checked.stdout[-500:]


def test_report_in_one_process_and_errors(tmp_path):
    from posenc.analysis.report import report_html

    page = report_html(["sinusoidal", "nope"], context=SMALL, workers=1)
    assert page.count('<img src="data:image/png;base64,') == 4  # heatmap, frequencies, curve + comparison
    with pytest.raises(ValueError, match="unknown scheme 'nosuch'"):
        build_report(tmp_path, ["nosuch"])
    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        report_html(["nope"], workers=0)
