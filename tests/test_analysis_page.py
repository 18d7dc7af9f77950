"""Tests of posenc.analysis.page: floats rounded to significant digits (non-finite ones become gaps),
interactive figures whose JSON spec survives the trip through an HTML ``<script>`` element, tables
with right-aligned numeric columns, plotly.js embedded with its loader, and PNG data URIs."""

from __future__ import annotations

import base64
import json
import math
import re
import struct
import sys

import pytest

from posenc.analysis.page import figure_data_uri, img, interactive, plotly_script, rounded, table

SPEC = re.compile(r'<script type="application/json" id="([^"]*)-spec">(.*?)</script>', re.S)


# ---------------------------------------------------------------------------------------------- rounded
def test_rounded_keeps_significant_digits():
    assert rounded(1234.5678) == 1235.0
    assert rounded(0.000123456) == 0.0001235
    assert rounded(-98765.4321) == -98770.0
    assert rounded(3.14159, 2) == 3.1
    assert rounded(2.5e-300) == 2.5e-300
    # every value lies within half a unit of its 4th significant digit
    for v in (math.pi, -math.e * 1e7, 1 / 7, 123456.789, -0.000987654321, 7.0):
        unit = 10 ** (math.floor(math.log10(abs(v))) - 3)
        assert abs(rounded(v) - v) <= unit / 2 * (1 + 1e-12)
        assert isinstance(rounded(v), float)


def test_rounded_walks_lists_and_dicts_and_turns_non_finite_into_none():
    value = {
        "a": [1.23456, (2.34567, float("nan")), [[float("-inf")]]],
        "b": {"c": float("inf"), "d": 0.1 + 0.2},
        "n": 123456789,
        "s": "3.14159",
        "t": True,
        "z": None,
    }
    assert rounded(value) == {
        "a": [1.235, [2.346, None], [[None]]],
        "b": {"c": None, "d": 0.3},
        "n": 123456789,  # ints are exact already
        "s": "3.14159",
        "t": True,
        "z": None,
    }
    assert rounded(float("nan")) is None and rounded(-0.0) == 0.0


# ---------------------------------------------------------------------------------------------- interactive
def _spec(page: str) -> tuple[str, dict]:
    found = SPEC.findall(page)
    assert len(found) == 1
    fig_id, text = found[0]
    return fig_id, json.loads(text)


def test_interactive_spec_round_trips_through_json():
    spec = {
        "data": [
            {"type": "scatter", "x": [0, 1, 2], "y": [0.123456789, float("nan"), 2.0 / 3.0], "name": "a & b"},
            {"type": "heatmap", "z": [[1.0, -1e-9], [float("inf"), 5.55555]]},
        ],
        "layout": {"title": {"text": "kernel"}},
        "frames": [{"name": "f0"}],
    }
    page = interactive("fig-1", spec, "what <b>to</b> notice")
    fig_id, back = _spec(page)
    assert fig_id == "fig-1"
    assert back["data"] == [
        {"type": "scatter", "x": [0, 1, 2], "y": [0.1235, None, 0.6667], "name": "a & b"},
        {"type": "heatmap", "z": [[1.0, -1e-9], [None, 5.556]]},
    ]
    assert back["frames"] == [{"name": "f0"}]
    assert '<div class="plot" id="fig-1" data-spec="fig-1-spec"></div>' in page
    assert "<figcaption>what <b>to</b> notice</figcaption>" in page
    assert json.loads(SPEC.findall(interactive("x", {"data": []}, ""))[0][1])["frames"] == []


def test_a_script_end_tag_in_a_string_cannot_end_the_element():
    name = 'evil</script><script>alert("x")</script>'
    page = interactive("f", {"data": [{"type": "scatter", "name": name, "y": [1.0]}]}, "c")
    start = page.index('<script type="application/json" id="f-spec">')
    first_end = page.index("</script>", start)
    payload = page[start + len('<script type="application/json" id="f-spec">') : first_end]
    assert "</" not in payload  # the HTML parser sees no end tag inside
    assert json.loads(payload)["data"][0]["name"] == name  # and JSON reads the string back whole
    assert page[first_end:].startswith("</script><figcaption>c</figcaption></figure>")


def test_default_layout_is_merged_and_the_spec_wins():
    _, plain = _spec(interactive("a", {"data": []}, "", height=250))
    assert plain["layout"] == {
        "height": 250,
        "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
        "font": {"size": 13},
        "template": None,
    }
    own = {"height": 600, "margin": {"t": 70}, "xaxis": {"type": "log"}}
    _, merged = _spec(interactive("b", {"data": [], "layout": own}, "", height=250))
    assert merged["layout"] == {
        "height": 600,  # the spec's own values win
        "margin": {"t": 70},
        "font": {"size": 13},
        "template": None,
        "xaxis": {"type": "log"},
    }


# ---------------------------------------------------------------------------------------------- table, img
def test_table_marks_numeric_columns():
    out = table(["name", "value", "note"], [["a", "1.5", "x"], ["b", "-2", "y"]], numeric=(1,))
    assert out.startswith("<table><tr><th>name</th><th>value</th><th>note</th></tr>")
    rows = re.findall(r"<tr>(<td.*?)</tr>", out)
    assert rows == [
        "<td>a</td><td class='num'>1.5</td><td>x</td>",
        "<td>b</td><td class='num'>-2</td><td>y</td>",
    ]
    assert "class='num'" not in table(["a"], [["1"]])


def test_img_escapes_its_alt_text():
    out = img("data:image/png;base64,AAAA", "<i>cap</i>", 'a "quoted" <alt>')
    assert 'alt="a &quot;quoted&quot; &lt;alt&gt;"' in out and "<figcaption><i>cap</i></figcaption>" in out


# ---------------------------------------------------------------------------------------------- plotly, PNG
def test_plotly_script_embeds_plotly_and_the_loader():
    from plotly.offline import get_plotlyjs

    out = plotly_script()
    assert out.startswith("<script>" + get_plotlyjs() + "</script>")
    assert not re.search(r"<script[^>]*\bsrc=", out)  # nothing is fetched
    loader = out.split("</script>\n<script>", 1)[1]
    assert 'document.querySelectorAll("div.plot")' in loader
    assert "JSON.parse(document.getElementById(div.dataset.spec).textContent)" in loader
    assert "Plotly.newPlot(div, spec.data, spec.layout" in loader


def test_plotly_script_without_plotly_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly.offline", None)
    with pytest.raises(ImportError, match=r"pip install 'posenc\[viz\]'"):
        plotly_script()


def test_figure_data_uri_is_a_png_of_the_figure_size():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2.0, 1.5))
    ax.plot([0, 1], [1, 0])
    uri = figure_data_uri(fig, dpi=40)
    assert uri.startswith("data:image/png;base64,")
    png = base64.b64decode(uri.split(",", 1)[1], validate=True)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert struct.unpack(">II", png[16:24]) == (2.0 * 40, 1.5 * 40)  # width, height in pixels
    assert not plt.fignum_exists(fig.number)  # closed


# ---------------------------------------------------------------------------------------------- hostile text
def test_esc_and_num_show_text_from_a_file_as_text():
    from posenc.analysis.page import esc, num

    assert esc("<script>alert('x')</script> & \"q\"") == (
        "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;q&quot;"
    )
    assert esc(3) == "3" and esc(None) == "None"
    assert num(0.12345, "+.3f") == "+0.123" and num(7, "d") == "7"
    assert num("<script>", "+.3f") == "&lt;script&gt;" and num(None) == "–" and num(True) == "True"


def test_json_for_script_cannot_end_the_element_or_open_a_comment():
    from posenc.analysis.page import json_for_script

    value = {"name": "</script><script>alert(1)</script>", "c": "<!-- x -->", "a": "&amp;"}
    text = json_for_script(value)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == value  # the escapes mean the same characters
