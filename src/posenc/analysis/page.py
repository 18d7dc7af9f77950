"""HTML building blocks of the report: style, static images, interactive figures, tables.

Interactive figures are Plotly figure specifications (plain ``{"data": [...], "layout": {...}}``
dicts, see https://plotly.com/javascript/reference/) written into the page as JSON and drawn by
plotly.js, which :func:`plotly_script` embeds in the page itself: the file works offline and
fetches nothing. Only the JavaScript bundle is taken from the ``plotly`` Python package.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "CSS",
    "WIDE",
    "ZOOM",
    "esc",
    "figure_data_uri",
    "figure_img",
    "img",
    "interactive",
    "json_for_script",
    "num",
    "plotly_script",
    "rounded",
    "table",
]


def esc(value: Any) -> str:
    """``value`` as HTML text: the page's one escaping rule for anything not written by posenc
    itself (a study's run names and numbers, paths, error messages). Quotes are escaped too, so
    the result is safe inside an attribute."""
    return html.escape(str(value), quote=True)


def num(value: Any, spec: str = ".3f") -> str:
    """A number formatted with ``spec`` (e.g. ``"+.3f"``); anything that is not a real number (a
    string read from a file, None) is shown as escaped text instead, never interpreted."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, spec)
    return "–" if value is None else esc(value)


def json_for_script(value: Any) -> str:
    """``value`` as JSON that is safe inside a ``<script>`` element: ``<``, ``>`` and ``&`` are
    written as ``\\u003c`` etc., so no ``</script>`` or ``<!--`` can appear in the text (JSON
    allows these characters only inside strings, where the escapes mean the same)."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1180px;margin:0 auto;
padding:24px;color:#1d1d1f;line-height:1.5;font-size:15px}
h1{margin-bottom:4px}h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:44px}
h3{margin-top:28px}
code,.formula{font-family:ui-monospace,Menlo,Consolas,monospace;background:#f4f4f6;padding:1px 4px;
border-radius:3px;font-size:13px}
table{border-collapse:collapse;margin:12px 0;font-size:13px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f3}
td.pass{background:#dff3e3}td.fail{background:#f8d0d0;font-weight:bold}td.no{background:#fff2cc}
td.na{color:#999}td.num{text-align:right;font-variant-numeric:tabular-nums}
.figs{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
figure{margin:8px 0;max-width:100%}
.figs figure{flex:1 1 420px}.figs figure.wide{flex-basis:100%}
.figs img{max-width:100%;height:auto;border:1px solid #eee;cursor:zoom-in}
figure img.zoom{position:fixed;inset:0;margin:auto;width:auto;max-width:98vw;max-height:98vh;
height:auto;z-index:10;background:#fff;box-shadow:0 0 0 100vmax rgba(0,0,0,.6);cursor:zoom-out}
.maths{margin:8px 0 12px}.eq{margin:4px 0}img.math{vertical-align:middle;max-width:100%}
figcaption{font-size:13px;color:#444;max-width:900px;margin-top:4px}
.plot{width:100%;min-height:200px}
.muted{color:#666;font-size:13px}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:8px 12px;margin:12px 0}
.read{background:#eef5ff;border-left:4px solid #3b7ddd;padding:8px 16px;margin:12px 0}
nav a{margin-right:10px}
.tag{display:inline-block;font-size:12px;padding:0 6px;border-radius:8px;background:#eee;margin-left:6px}
.tag.trained{background:#dff3e3}.tag.untrained{background:#fff2cc}
"""


#: Image pixels per displayed pixel of a static figure: drawn at ``dpi * ZOOM`` and shown at
#: ``dpi``, so it stays sharp when enlarged on click (and on high-density screens).
ZOOM = 2.5

#: A static figure shown wider than this (CSS pixels) takes a row of the page to itself.
WIDE = 760


def figure_data_uri(fig: Any, *, dpi: int = 72) -> str:
    """A matplotlib figure as a ``data:image/png;base64,...`` URI (the figure is closed).

    The PNG holds a 256-colour palette (median cut, no dithering): the figures' flat colour maps and
    lines survive, and the file is about a third of the full-colour one, so a figure drawn at 2.5x
    the resolution costs the page about what a 1x full-colour one did.
    """
    import matplotlib.pyplot as plt
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    palette = image.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    out = io.BytesIO()
    palette.save(out, format="png", optimize=True)
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")


def img(uri: str, caption: str, alt: str, *, width: int | None = None) -> str:
    """A static figure: ``uri`` a data URI, ``caption`` HTML (what to notice), ``alt`` plain text,
    ``width`` the displayed width in CSS pixels (default: the image's own)."""
    size = f' width="{int(width)}"' if width is not None else ""
    wide = " class='wide'" if width is not None and width > WIDE else ""  # a row of its own
    return (
        f'<figure{wide}><img src="{uri}"{size} alt="{esc(alt)}"><figcaption>{caption}</figcaption></figure>'
    )


def figure_img(fig: Any, caption: str, alt: str, *, dpi: int = 72, zoom: float = ZOOM) -> str:
    """A matplotlib figure as a static figure (:func:`img`) shown ``figwidth * dpi`` CSS pixels
    wide and drawn at ``dpi * zoom``: enlarged on click, it shows ``zoom`` times the detail."""
    width = round(fig.get_figwidth() * dpi)
    return img(figure_data_uri(fig, dpi=round(dpi * zoom)), caption, alt, width=width)


def rounded(value: Any, digits: int = 4) -> Any:
    """``value`` with every float rounded to ``digits`` significant digits (lists and dicts walked),
    so a figure's JSON stays small; non-finite floats become ``None`` (a gap in the plot)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value


def interactive(fig_id: str, spec: dict[str, Any], caption: str, *, height: int = 380) -> str:
    """An interactive figure: a ``<div>`` drawn by plotly.js from ``spec`` (a Plotly figure dict with
    ``data`` and ``layout``), and ``caption`` (HTML). The spec travels as JSON in a
    ``<script type="application/json">`` element, read by :func:`plotly_script`'s loader."""
    layout = {
        "height": height,
        "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
        "font": {"size": 13},
        "template": None,
        **spec.get("layout", {}),
    }
    payload = json_for_script(
        rounded({"data": spec["data"], "layout": layout, "frames": spec.get("frames", [])})
    )
    fig_id = esc(fig_id)
    return (
        f'<figure><div class="plot" id="{fig_id}" data-spec="{fig_id}-spec"></div>'
        f'<script type="application/json" id="{fig_id}-spec">{payload}</script>'
        f"<figcaption>{caption}</figcaption></figure>"
    )


_LOADER = """
function posencSelector(div, sel) {
  // a menu and a slider that choose a group of traces independently (interactive.selector_figure)
  const show = () => Plotly.restyle(div, {visible: sel.owner.map(
    (o) => o === null || (o[0] === sel.menu && o[1] === sel.slider))});
  div.on("plotly_buttonclicked", (e) => { sel.menu = e.active; show(); });
  div.on("plotly_sliderchange", (e) => { sel.slider = e.slider.active; show(); });
}
document.querySelectorAll("div.plot").forEach((div) => {
  const spec = JSON.parse(document.getElementById(div.dataset.spec).textContent);
  Plotly.newPlot(div, spec.data, spec.layout, {responsive: true, displaylogo: false,
    toImageButtonOptions: {format: "svg"}}).then(() => {
      const sel = spec.layout.meta && spec.layout.meta.selector;
      if (sel) posencSelector(div, sel);
      div.dataset.rendered = "1";
    });
});
document.querySelectorAll("figure img").forEach((img) => {
  img.title = "click to enlarge";
  img.addEventListener("click", () => img.classList.toggle("zoom"));
});
"""


def plotly_script() -> str:
    """plotly.js, embedded, and the loader that draws every :func:`interactive` figure.

    Raises:
        ImportError: the ``plotly`` package is missing (``pip install posenc[viz]``).
    """
    try:
        from plotly.offline import get_plotlyjs
    except ImportError as err:
        raise ImportError("the report's interactive figures need plotly: pip install 'posenc[viz]'") from err
    return f"<script>{get_plotlyjs()}</script>\n<script>{_LOADER}</script>"


def table(header: Sequence[str], rows: Iterable[Sequence[str]], *, numeric: Sequence[int] = ()) -> str:
    """An HTML table; cells are HTML already (escape text first); ``numeric`` columns align right."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f"<td class='num'>{c}</td>" if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"
