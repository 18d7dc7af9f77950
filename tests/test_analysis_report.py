"""Tests of posenc.analysis.report: one self-contained page (images and plotly.js embedded, nothing
fetched), learnable schemes trained or labelled as untrained, a study's results shown, and (when
Chromium is installed) the page loads in a real headless browser without JavaScript errors, every
interactive figure renders, and screenshots are taken."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import tempfile

import pytest

import posenc
from _analysis_toys import ToyALiBi, ToyLearnedBias, ToyRoPE, registered
from _lab_toys import tiny_study, write_corpus
from posenc.analysis import check, make_probe, verify
from posenc.analysis.plots import PLOT_KINDS
from posenc.analysis.report import build_report, report_html, report_kinds, scheme_group

SMALL = {"d_model": 32, "head_dim": 16, "num_heads": 4, "max_len": 64}
IMG = re.compile(r'<img src="([^"]*)"')
SPEC = re.compile(r'<script type="application/json" id="([^"]*)-spec">(.*?)</script>', re.S)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    with registered(ToyRoPE, ToyALiBi, ToyLearnedBias):
        path = build_report(out, context=SMALL, fast=True)
        names = posenc.schemes()
        kinds = {
            n: report_kinds(p, check(p, ["translation_inv"])) for n in names for p in [make_probe(n, SMALL)]
        }
    # every kind appears where it applies: the kernel heatmap only where it is not a constant-diagonal
    # image, the kernel curve only for rotations (the overview draws every other scheme's)
    assert kinds["toy_alibi"] == ["bias", "kernel"]
    assert kinds["learned"] == ["heatmap", "kernel"]
    assert kinds["toy_rope"] == ["heatmap", "frequencies", "kernel_curve", "scalings"]
    drawn = {k for ks in kinds.values() for k in ks}
    assert kinds["nope"] == [] and set(PLOT_KINDS) - {"waves", "similarity", "surface"} == drawn
    return path, names, sum(len(k) for k in kinds.values())


def test_every_image_is_an_embedded_png_and_nothing_is_fetched(report):
    path, _, expected = report
    html = path.read_text(encoding="utf-8")
    srcs = IMG.findall(html)
    assert len(srcs) == expected
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert not re.search(r"<script[^>]*\bsrc=", html)  # plotly.js is inline, not loaded
    page = re.sub(r"<script>.*?</script>", "", html, flags=re.S)  # the page without plotly.js's own code
    assert not re.search(r'(src|href)="(https?:|//|file:)', page)
    assert "Plotly.newPlot" in html and len(html) < 8_000_000


def test_interactive_figures_are_valid_plotly_specs(report):
    path, _, _ = report
    html = path.read_text(encoding="utf-8")
    specs = dict(SPEC.findall(html))
    # the overview, four explore figures (toy schemes do not take their options), the input layer
    assert {"overview", "input-layer", "explore-0", "explore-1", "explore-2", "explore-3"} <= set(specs)
    for fig_id, text in specs.items():
        spec = json.loads(text)
        assert spec["data"], fig_id
        assert f'<div class="plot" id="{fig_id}" data-spec="{fig_id}-spec">' in html
    overview = json.loads(specs["overview"])
    titles = [a["text"] for a in overview["layout"]["annotations"]]
    assert "<b>learned (initialisation)</b>" in titles and "<b>alibi</b>" in titles


def test_page_order_labels_and_plain_words(report):
    path, names, _ = report
    html = path.read_text(encoding="utf-8")
    assert html.index("How to read this page") < html.index("<h2")
    for name in names:
        assert f"<tr><th>{name}</th>" in html and f"id='{name}'" in html
    assert "Built without training (fast mode)" in html and "initialisation</span>" in html
    for section in ("The positional kernel of every scheme", "The input layer, end to end", "Explore"):
        assert section in html
    assert "0.0128" in html and "0.024543" in html  # the numbers usually quoted, next to the measured
    assert not re.search(r"DESIGN\.md|seed notes?|seed 0\d\d|issue \d", html)
    with registered(ToyRoPE, ToyALiBi, ToyLearnedBias):
        broken = [f"{r.scheme}.{r.property}" for r in verify(context=SMALL) if r.broken_promise]
    if broken:  # tiny heads (d_h = 16) over L = 64 need not decay; the page must say so
        assert "Broken promises: " + ", ".join(broken) in html
    else:
        assert "No scheme breaks a property it promises." in html


def test_scheme_groups_follow_the_hooks():
    groups = {n: scheme_group(make_probe(n, SMALL)) for n in ("sinusoidal", "rope", "alibi", "nope")}
    assert groups == {"sinusoidal": "embed", "rope": "rotate", "alibi": "score_bias", "nope": "none"}
    # Transformer-XL's rotate hook adds a content term only: it is grouped with the biases
    assert scheme_group(make_probe("transformer_xl", SMALL)) == "score_bias"


def test_trained_report_trains_once_then_reuses(tmp_path):
    (tmp_path / "corpus").mkdir()
    corpus = write_corpus(tmp_path / "corpus")
    training = {"steps": 3, "batch_size": 4, "d_model": 16, "num_layers": 1, "num_heads": 2,
                "train_len": 8, "eval_lens": (8,), "corpus": str(corpus), "eval_windows": 2}  # fmt: skip
    lines: list[str] = []
    kwargs = dict(context=SMALL, cache_dir=tmp_path / "cache", training=training, workers=1, log=lines.append)
    path = build_report(tmp_path / "rep", ["learned", "t5", "rope"], **kwargs)
    html = path.read_text(encoding="utf-8")
    assert "Built without training" not in html
    assert html.count("<span class='tag trained'>trained</span></h3>") == 2  # learned and t5, not rope
    specs = dict(SPEC.findall(html))
    assert {"trained-learned", "trained-learned-pe", "trained-t5"} <= set(specs)
    assert "after 3 steps at L = 8" in html
    assert sum("3 steps in" in line for line in lines) == 2
    lines.clear()
    build_report(tmp_path / "rep2", ["learned", "t5"], **kwargs)
    assert sum("reused" in line for line in lines) == 2 and not any("steps in" in line for line in lines)


def test_report_with_a_study(tmp_path):
    from posenc.lab.extrapolate import run_study

    (tmp_path / "corpus").mkdir()
    corpus = write_corpus(tmp_path / "corpus")
    config = tiny_study(corpus, schemes=("nope", "sinusoidal", "t5"), seeds=(0, 1), variants=())
    run_study(config, out=tmp_path / "study", log=None)
    path = build_report(
        tmp_path / "rep", ["sinusoidal", "t5", "nope"], context=SMALL, study=tmp_path / "study"
    )
    html = path.read_text(encoding="utf-8")
    assert "From the study in" in html and "over 2 seeds" in html
    assert re.search(r"<td class='num'>[+-]\d\.\d{3} ±\d\.\d{3}</td>", html)  # deltas with intervals
    assert "study" in dict(SPEC.findall(html)) and "trained-t5" in html
    assert "sinusoidal encodings let a model read inputs longer than it was trained on" in html
    with pytest.raises(ValueError, match=r"holds no results\.json"):
        build_report(tmp_path / "rep2", ["t5"], study=tmp_path / "corpus")


def test_report_in_one_process_and_errors(tmp_path):
    page = report_html(["sinusoidal", "nope"], context=SMALL, workers=1, fast=True)
    assert page.count('<img src="data:image/png;base64,') == 2  # heatmap, frequencies
    with pytest.raises(ValueError, match="unknown scheme 'nosuch'"):
        build_report(tmp_path, ["nosuch"], fast=True)
    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        report_html(["nope"], workers=0, fast=True)


# ---------------------------------------------------------------------------------------------- browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

#: Appended to a copy of the page: records JavaScript errors, waits for every interactive figure to
#: finish drawing, then writes what it found into the DOM (read back with --dump-dom).
CHECK = """<script>
window.__errors = [];
window.addEventListener("error", (e) => window.__errors.push(String(e.message)));
window.addEventListener("load", () => {
  let waited = 0;
  const report = () => {
    const plots = [...document.querySelectorAll("div.plot")];
    const drawn = plots.filter((d) => d.dataset.rendered === "1" && d.querySelector("svg.main-svg"));
    if (drawn.length < plots.length && waited < 20000) { waited += 250; setTimeout(report, 250); return; }
    const imgs = [...document.images];
    const ok = imgs.filter((i) => i.complete && i.naturalWidth > 0).length;
    const div = document.createElement("div");
    div.id = "page-check";
    const sliders = document.querySelectorAll("g.slider-container").length;
    div.textContent = `plots drawn ${drawn.length}/${plots.length}; images loaded ${ok}/${imgs.length}; ` +
      `sliders ${sliders}; errors ${JSON.stringify(window.__errors)}`;
    document.body.appendChild(div);
  };
  report();
});
</script></body>"""


def _chromium(*args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             "--enable-logging=stderr", "--v=0", "--virtual-time-budget=30000", "--hide-scrollbars", *args],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_report_in_headless_chromium(report, tmp_path):
    path, _, expected = report
    html = path.read_text(encoding="utf-8")
    n_plots = html.count('<div class="plot"')
    # 1. the page itself: no console messages at all (errors would be logged as CONSOLE lines)
    plain = _chromium("--dump-dom", path.resolve().as_uri())
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert "CONSOLE" not in plain.stderr and "Uncaught" not in plain.stderr, plain.stderr[-2000:]
    # 2. a copy with the checking script: every figure drawn by plotly.js, every image decoded
    probe = path.with_name("check.html")
    probe.write_text(html.replace("</body>", CHECK), encoding="utf-8")
    checked = _chromium("--dump-dom", probe.resolve().as_uri())
    found = re.search(r'<div id="page-check">(.*?)</div>', checked.stdout)
    assert found, checked.stdout[-500:]
    assert found.group(1) == (
        f"plots drawn {n_plots}/{n_plots}; images loaded {expected}/{expected}; sliders 5; errors []"
    )
    # 3. screenshots, kept under pytest's tmp_path: the top of the page, and the explore section
    # alone (a copy without what comes before it: a headless screenshot starts at the top)
    explore = path.with_name("explore.html")
    cut = (
        "<script>(() => { const stop = document.getElementById('explore'); "
        "while (stop.previousElementSibling) stop.previousElementSibling.remove(); })();</script>\n"
    )
    explore.write_text(html.replace("<script>", cut + "<script>", 1), encoding="utf-8")
    for name, page in (("top", path), ("explore", explore)):
        shot = tmp_path / f"report-{name}.png"
        done = _chromium("--window-size=1280,1400", f"--screenshot={shot}", page.resolve().as_uri())
        assert done.returncode == 0 and shot.stat().st_size > 50_000, done.stderr[-1000:]
