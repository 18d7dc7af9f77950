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
    # grid schemes are drawn on their grid: the kernel over each plane, and a rotation's head axes
    assert kinds["sinusoidal_2d"] == kinds["sinusoidal_3d"] == ["grid"]
    assert kinds["rope_2d"] == kinds["mrope"] == ["grid", "axes"]
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
    assert any(t.startswith("<b>learned (initialisation)</b> · max |K| ") for t in titles)
    # magnitudes shown: ALiBi's mean bias at the far end of the panel, in logit units, in its title
    alibi = next(t for t in overview["data"] if t["name"] == "alibi: kernel")
    assert max(abs(v) for v in alibi["y"]) > 1.5
    assert f"<b>alibi</b> · max |K| {max(abs(v) for v in alibi['y']):.3g}" in titles


def test_page_order_labels_and_plain_words(report):
    path, names, _ = report
    html = path.read_text(encoding="utf-8")
    assert html.index("How to read this page") < html.index("<h2")
    for name in names:
        assert f"<tr><th>{name}</th>" in html and f"id='{name}'" in html
    assert "Built without training (fast mode)" in html and "initialisation</span>" in html
    for section in ("the positional kernel of every scheme", "The input layer, end to end", "Explore"):
        assert section in html
    assert "0.0128" in html and "0.024543" in html  # the numbers usually quoted, next to the measured
    assert not re.search(r"DESIGN\.md|seed notes?|seed 0\d\d|issue \d", html)
    with registered(ToyRoPE, ToyALiBi, ToyLearnedBias):
        broken = [f"{r.scheme}.{r.property}" for r in verify(context=SMALL) if r.broken_promise]
    if broken:  # tiny heads (d_h = 16) over L = 64 need not decay; the page must say so
        assert "Broken promises: " + ", ".join(broken) in html
    else:
        assert "No scheme breaks a property it promises." in html


def _sections(html: str) -> dict[str, str]:
    """Each scheme's section of the page (from its h3 to the next h3 or h2)."""
    part = html[html.index("<h2 id='schemes'>") : html.index("<h2 id='trained'>")]
    found = re.findall(r"<h3 id='([^']+)'>.*?(?=<h3|$)", part, re.S)
    return {
        name: re.search(rf"<h3 id='{re.escape(name)}'>.*?(?=<h3|$)", part, re.S).group(0) for name in found
    }


def test_every_scheme_is_taught_with_maths_a_worked_example_and_its_own_captions(report):
    path, names, _ = report
    html = path.read_text(encoding="utf-8")
    sections = _sections(html)
    assert set(names) <= set(sections)
    owner: dict[str, str] = {}
    for name, section in sections.items():
        assert "<img class='math' src='data:image/svg+xml;base64," in section, name
        assert "<b>Worked example</b>" in section and "<b>The problem.</b>" in section, name
        for caption in re.findall(r"<figcaption>(.*?)</figcaption>", section, re.S):
            assert owner.setdefault(caption, name) == name, f"{name} and {owner[caption]} share: {caption}"
    # the page reads as a course: the input layer, then the schemes (no position, added, rotated,
    # biased), then the comparisons
    groups = [
        "The problem: no positional signal",
        "Added to the input",
        "Rotating queries and keys",
        "Biasing the attention logits",
    ]
    order = [
        "<h2 id='input'>",
        *(f"<h3 class='group'>{g}</h3>" for g in groups),
        "<h2 id='kernels'>",
        "<h2 id='which'>",
    ]
    assert [html.index(t) for t in order] == sorted(html.index(t) for t in order)


def test_a_default_build_answers_which_scheme_and_shows_no_local_path(report):
    path, _, _ = report
    html = path.read_text(encoding="utf-8")
    which = html[html.index("<h2 id='which'>") : html.index("<h2 id='properties'>")]
    assert "posenc ships the summary of one real study" in which and which.count("<table>") == 2
    text = re.sub(r"<script.*?</script>|data:[^'\"]+", "", html, flags=re.S)  # the words a reader sees
    assert not re.search(r"(/home/|/root/|/tmp/|/Users/|/private/|[A-Z]:\\\\)", text), re.search(
        r".{60}(/home/|/root/|/tmp/|/Users/).{60}", text
    )
    assert "nats" not in text and "causal" in html[: html.index("<nav>")]


def test_scheme_groups_follow_the_hooks():
    groups = {n: scheme_group(make_probe(n, SMALL)) for n in ("sinusoidal", "rope", "alibi", "nope")}
    assert groups == {"sinusoidal": "embed", "rope": "rotate", "alibi": "score_bias", "nope": "none"}
    # Transformer-XL's rotate hook adds a content term only: it is grouped with the biases
    assert scheme_group(make_probe("transformer_xl", SMALL)) == "score_bias"


def test_trained_report_trains_once_then_reuses(tmp_path):
    (tmp_path / "corpus").mkdir()
    corpus = write_corpus(tmp_path / "corpus")
    training = {
        "steps": 3,
        "batch_size": 4,
        "d_model": 16,
        "num_layers": 1,
        "num_heads": 2,
        "train_len": 8,
        "eval_lens": (8,),
        "corpus": str(corpus),
        "eval_windows": 2,
    }
    lines: list[str] = []
    kwargs = dict(context=SMALL, cache_dir=tmp_path / "cache", training=training, workers=1, log=lines.append)
    path = build_report(tmp_path / "rep", ["learned", "t5", "rope"], **kwargs)
    html = path.read_text(encoding="utf-8")
    assert "Built without training" not in html
    assert html.count("<span class='tag trained'>trained</span></h3>") == 2  # learned and t5, not rope
    specs = dict(SPEC.findall(html))
    assert {"trained-learned", "trained-learned-pe", "trained-t5"} <= set(specs)
    assert "after 3 steps at L = 8" in html
    for name in ("learned", "t5"):  # each initial panel has its own visible range
        initial = json.loads(specs[f"trained-{name}"])["data"][0]
        assert initial["name"] == "initial"
        values = [v for row in initial["z"] for v in row if v is not None]
        assert (max(values) - min(values)) > 0.1 * (initial["zmax"] - initial["zmin"]), name
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
    assert "From the study <code>study</code>" in html and "over 2 seeds" in html
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
    // static figures: drawn at least twice as wide as they are shown, so an enlarged one is sharp
    const figs = imgs.filter((i) => !i.classList.contains("math"));
    const sharp = figs.filter((i) => i.naturalWidth >= 2 * i.width && i.width > 0).length;
    const div = document.createElement("div");
    div.id = "page-check";
    const sliders = document.querySelectorAll("g.slider-container").length;
    div.textContent = `plots drawn ${drawn.length}/${plots.length}; images loaded ${ok}/${imgs.length}; ` +
      `high-resolution figures ${sharp}/${figs.length}; ` +
      `sliders ${sliders}; errors ${JSON.stringify(window.__errors)}`;
    document.body.appendChild(div);
  };
  report();
});
</script></body>"""


#: Drives the rotary scalings explorer as a reader would (Plotly's own events) and writes what is
#: shown into the DOM.
SELECTOR_CHECK = """<script>
window.addEventListener("load", () => {
  const find = () => [...document.querySelectorAll("div.plot")].find(
    (d) => d.data && d.layout.updatemenus && d.layout.updatemenus[0].buttons[0].label.startsWith("scaling"));
  const shown = (div) => div.data.filter((t) => t.visible === true).map((t) => t.name).join(" + ");
  const run = () => {
    const div = find();
    if (!div || div.dataset.rendered !== "1") { setTimeout(run, 250); return; }
    const ntk = div.layout.updatemenus[0].buttons.findIndex((b) => b.label === "scaling: ntk");
    div.emit("plotly_buttonclicked", {menu: div.layout.updatemenus[0], active: ntk});
    setTimeout(() => {
      const menu = shown(div);
      const slider = div._fullLayout.sliders[0];
      slider.active = slider.steps.findIndex((st) => st.label === "8");
      div.emit("plotly_sliderchange", {slider: slider, step: slider.steps[slider.active]});
      setTimeout(() => {
        const out = document.createElement("div");
        out.id = "selector-check";
        out.textContent = `after menu: ${menu}; after slider: ${shown(div)}`
          .replaceAll("none (plain RoPE)", "reference");
        document.body.appendChild(out);
      }, 500);
    }, 500);
  };
  run();
});
</script></body>"""


#: Clicks the first figure of the page and reports its width shown, enlarged and in the image
#: itself; and whether the section of a grid scheme (rope_2d) shows its kernel on the grid, decoded.
ZOOM_CHECK = """<script>
window.addEventListener("load", () => setTimeout(() => {
  const img = [...document.querySelectorAll("figure img")][0];
  const shown = img.getBoundingClientRect().width;
  img.click();
  setTimeout(() => {
    const enlarged = img.getBoundingClientRect().width;
    let grid = 0;
    for (let el = document.getElementById("rope_2d"); el && el.tagName !== "H2"; el = el.nextElementSibling) {
      if (el.tagName === "H3" && el.id !== "rope_2d") break;
      el.querySelectorAll("img").forEach((i) => {
        if (i.alt === "rope_2d: kernel on the grid" && i.complete && i.naturalWidth > 0) grid = 1;
      });
    }
    const out = document.createElement("div");
    out.id = "zoom-check";
    out.textContent = `shown ${shown}; enlarged ${enlarged}; natural ${img.naturalWidth}; grid ${grid}`;
    document.body.appendChild(out);
  }, 300);
}, 500));
</script></body>"""


def _with_script(page, script: str):
    """A copy of ``page`` with ``script`` before ``</body>``."""
    copy = page.with_name(f"check-{abs(hash(script))}.html")
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", script), encoding="utf-8")
    return copy


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
                "--virtual-time-budget=30000",
                "--hide-scrollbars",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )


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
    images = expected + html.count("<img class='math'")  # the figures and the typeset formulas
    assert found.group(1) == (
        f"plots drawn {n_plots}/{n_plots}; images loaded {images}/{images}; "
        f"high-resolution figures {expected}/{expected}; sliders 5; errors []"
    )
    # a click enlarges a figure to its own resolution (not past it: no blur), and a grid scheme's
    # section holds its kernel as a 2-D image that the browser decoded
    zoom = _chromium(
        "--window-size=1400,1000", "--dump-dom", _with_script(path, ZOOM_CHECK).resolve().as_uri()
    )
    found = re.search(r'<div id="zoom-check">(.*?)</div>', zoom.stdout)
    assert found, zoom.stdout[-500:]
    shown, enlarged, natural, grid = (float(v) for v in re.findall(r"[\d.]+", found.group(1)))
    assert natural >= 2 * shown and 1.5 * shown <= enlarged <= natural + 2, found.group(1)  # + its border
    assert grid == 1, found.group(1)
    # the scalings explorer: a new scaling keeps the chosen factor, a new factor keeps the scaling
    selector = _chromium("--dump-dom", _with_script(path, SELECTOR_CHECK).resolve().as_uri())
    found = re.search(r'<div id="selector-check">(.*?)</div>', selector.stdout)
    assert found, selector.stdout[-500:]
    assert found.group(1) == "after menu: ntk, factor 4 + reference; after slider: ntk, factor 8 + reference"
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


#: Injected into every string and number field of a study's results.json: it must show as text.
PAYLOAD = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 1"><!--'

#: Reports whether any injected script ran, once the page has loaded.
PWNED_CHECK = """<script>
window.addEventListener("load", () => setTimeout(() => {
  const out = document.createElement("div");
  out.id = "pwned-check";
  out.textContent = `pwned ${window.__pwned === 1}`;
  document.body.appendChild(out);
}, 3000));
</script></body>"""


def _hostile_study(folder):
    cell = {"mean": PAYLOAD, "low": PAYLOAD, "high": PAYLOAD, "n": PAYLOAD}
    row = {
        "name": PAYLOAD,
        "scheme": PAYLOAD,
        "variant": PAYLOAD,
        "length": PAYLOAD,
        "seeds": [PAYLOAD],
        "delta": cell,
        "bpb_window": cell,
        "note": PAYLOAD,
    }
    results = {
        "config": {
            "mode": "lm",
            "schemes": [PAYLOAD],
            "seeds": [PAYLOAD],
            "train_len": PAYLOAD,
            "eval_lens": [PAYLOAD, PAYLOAD + "2"],
            "steps": PAYLOAD,
            "d_model": PAYLOAD,
            "num_layers": PAYLOAD,
            "num_heads": PAYLOAD,
            "corpus": PAYLOAD,
        },
        "summary": [row, {**row, "length": PAYLOAD + "2"}],
        "cells": [{"cell": PAYLOAD, "train": {"steps": PAYLOAD, "final_loss_nats": PAYLOAD}}],
    }
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(results), encoding="utf-8")
    return folder


def test_a_study_with_script_in_every_field_shows_it_as_text(tmp_path):
    path = build_report(
        tmp_path / "rep", ["alibi", "nope"], context=SMALL, study=_hostile_study(tmp_path / "s")
    )
    html = path.read_text(encoding="utf-8")
    # no element comes from the file: the only scripts are plotly.js, the loader and the figures' data
    assert html.count("<script") == len(SPEC.findall(html)) + 2
    assert PAYLOAD not in html and "<img src=x" not in html  # never written as markup
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in html  # shown, as text
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium): the page was checked as text only")
    done = _chromium("--dump-dom", _with_script(path, PWNED_CHECK).resolve().as_uri())
    found = re.search(r'<div id="pwned-check">(.*?)</div>', done.stdout)
    assert found and found.group(1) == "pwned false", done.stdout[-500:]
