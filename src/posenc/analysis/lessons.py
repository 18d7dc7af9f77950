"""The teaching part of each scheme's section: the problem it solves, its definition as rendered
mathematics, a worked example computed by posenc, its behaviour past the trained length, and the
misreadings to avoid.

Formulas are written in matplotlib's mathtext (a subset of TeX) and rendered to SVG here, embedded
as ``data:`` images: the page shows typeset mathematics offline, without a script or a font
download. The worked example builds the scheme through the registry at small sizes and prints
its numbers; every sentence that compares numbers is decided by the numbers.

:data:`LESSONS` holds the words for the registered schemes, keyed by registry name; a scheme
without an entry (one registered at run time) gets a section from its declared hooks, with the
same worked example.

Legend: ``h`` heads, ``d`` model width, ``d_h`` head width, ``m`` query position, ``n`` key
position.
"""

from __future__ import annotations

import base64
import functools
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .kernel import Probe, display_kernel, encodings, make_probe, positional_kernel, rotation_frequencies
from .page import esc, table
from .settlements import (
    settle_alibi,
    settle_kerple_log,
    settle_mrope,
    settle_nope_temperature,
    settle_shaw,
    settle_sinusoidal,
    settle_xpos,
)

__all__ = ["HOOK_FORMULAS", "LESSONS", "Lesson", "lesson_html", "math_svg", "worked_example"]


@dataclass(frozen=True)
class Lesson:
    """The words of one scheme's section (HTML fragments, written by posenc).

    Attributes:
        problem: what the scheme is for, and the idea in one or two sentences.
        formulas: its definition, each a mathtext string (``$...$``).
        where: where each symbol comes from (one sentence).
        misreading: a common misreading and what settles it, in words (no typed measurement).
        settle: where the settlement quotes a number, the function that measures it with posenc
            when the page is built (the scheme built by name at its default sizes), as a sentence.
    """

    problem: str
    formulas: tuple[str, ...]
    where: str
    misreading: str
    settle: Callable[[], str] | None = None


#: The attention logit every hook changes, shown where a scheme has no lesson of its own.
HOOK_FORMULAS: dict[str, str] = {
    "embed": r"$x_p = e_{t_p} + \mathrm{PE}(p)$",
    "rotate": r"$a_{mn} = (R_m\, q_m)^{\top} (R_n\, k_n) / \sqrt{d_h}$",
    "score_bias": r"$a_{mn} = q_m^{\top} k_n / \sqrt{d_h} + b_h(m, n)$",
    "relative_values": r"$o_m = \sum_n \alpha_{mn}\, (v_n + a^V_{mn})$",
}

_SIN = (
    r"$\mathrm{PE}(p)_{2i} = \sin(p\,\theta_i),\quad \mathrm{PE}(p)_{2i+1} = \cos(p\,\theta_i),\quad "
    r"\theta_i = 10000^{-2i/d}$"
)
_ROPE_PAIR = (
    r"$q'_{2i} = q_{2i} \cos m\theta_i - q_{2i+1} \sin m\theta_i,\quad "
    r"q'_{2i+1} = q_{2i} \sin m\theta_i + q_{2i+1} \cos m\theta_i,\quad \theta_i = b^{-2i/d_h}$"
)
_ROPE_REL = r"$(R_m q)^{\top} (R_n k) = q^{\top} R_{n-m}\, k$"


LESSONS: dict[str, Lesson] = {
    "nope": Lesson(
        "Attention by itself is blind to order: permute the tokens and each one gets the same output, "
        "permuted. NoPE adds nothing. In a causal decoder the mask still breaks the symmetry: token m "
        "sees m + 1 tokens, so the model can count, and Kazemnejad et al. (2023) found NoPE "
        "generalises to longer inputs better than several encodings on small tasks.",
        (r"$a_{mn} = q_m^{\top} k_n / \sqrt{d_h},\quad n \leq m$",),
        "q and k are the query and key of tokens m and n; nothing in the logit depends on m or n.",
        "<i>“Without positions a Transformer cannot tell order.”</i> True of a bidirectional encoder; a "
        "causal decoder reads order from its mask. The NoPE row of the study above gives its measured "
        "bits/byte next to the encodings'.",
    ),
    "sinusoidal": Lesson(
        "The first answer (Vaswani et al. 2017): give every position a fixed vector of sines and "
        "cosines at geometrically spaced frequencies and add it to the token embedding. Fast pairs "
        "tell neighbours apart, slow pairs tell far positions apart, and nothing has to be learned.",
        (_SIN, r"$x_p = \sqrt{d}\; e_{t_p} + \mathrm{PE}(p)$"),
        "e<sub>t</sub> is the embedding of token t, p its position, i a pair of dimensions, d the "
        "model width.",
        "<i>“Sinusoids let the model read any length.”</i> The vector exists at every position, but a "
        "model trained at L has never seen the later ones; the line above gives what that costs. "
        "<i>“The first dimensions change slowest.”</i> They change fastest; the heatmap shows it.",
        settle_sinusoidal,
    ),
    "scaled_sinusoidal": Lesson(
        "Sinusoidal positions times one learned number g (Hua et al. 2022): the model decides how "
        "loud positions are next to the token embeddings, instead of a fixed √d.",
        (r"$x_p = e_{t_p} + g \cdot \mathrm{PE}(p)$", _SIN),
        "g is a single trainable scalar, shared by every position and dimension.",
        "<i>“A learned gain makes it a learned encoding.”</i> Only the loudness is learned: the shape "
        "of every position's vector stays the fixed sinusoid, so it still exists past L (unlike a "
        "learned table) and still shifts by a fixed rotation.",
    ),
    "learned": Lesson(
        "BERT and GPT-2 learn one vector per position, like a word embedding indexed by position. "
        "Nothing is assumed about how positions relate; training must discover it, and positions "
        "past the table's length simply do not exist.",
        (r"$x_p = e_{t_p} + P_p,\quad P \in \mathbb{R}^{L \times d}$",),
        "P is a trainable table with one row per position p < L.",
        "<i>“GPT uses sinusoidal positions.”</i> GPT-2 and GPT-3 learn them. <i>“A learned table "
        "learns a smooth code.”</i> Partly: compare its initial and trained kernels in the trained "
        "section; the rows it rarely sees stay noisy.",
    ),
    "sinusoidal_2d": Lesson(
        "Image patches sit on a grid: half of the channels encode the row with a 1-D sinusoid, the "
        "other half the column, so a patch knows both coordinates.",
        (r"$\mathrm{PE}(r, c) = [\,\mathrm{PE}_{d/2}(r)\,;\, \mathrm{PE}_{d/2}(c)\,]$",),
        "r and c are the patch's row and column; each half uses the 1-D sinusoid of width d/2.",
        "<i>“Flatten the grid and use 1-D positions.”</i> Then patches one row apart are W positions "
        "apart; the per-axis code keeps vertical neighbours close.",
    ),
    "sinusoidal_3d": Lesson(
        "Video and volumes: a third of the channels per axis (x, y, z: time, row and column of a "
        "video), each a 1-D sinusoid.",
        (
            r"$\mathrm{PE}(t, r, c) = [\,\mathrm{PE}_{d/3}(t)\,;\, \mathrm{PE}_{d/3}(r)\,;\, "
            r"\mathrm{PE}_{d/3}(c)\,]$",
        ),
        "t, r, c are the coordinates; each third uses the 1-D sinusoid of width d/3.",
        "<i>“More axes cost more channels.”</i> The width is shared: each axis gets fewer frequencies, "
        "so each coordinate is told apart less finely than a 1-D code of width d would.",
    ),
    "rope": Lesson(
        "Rotary positions (Su et al. 2021) act inside attention: each pair of dimensions of a query or "
        "key is rotated by an angle proportional to its position. The dot product of two rotated "
        "vectors depends only on the difference of their angles, so attention sees only the "
        "distance m − n, and nothing is added to the token's own vector.",
        (_ROPE_PAIR, _ROPE_REL),
        "pair i turns by θ<sub>i</sub> per position (b = 10 000 by default); R<sub>m</sub> is the block "
        "rotation of all pairs at position m.",
        "<i>“RoPE extrapolates because it is relative.”</i> Its logits depend only on m − n, but a "
        "model trained at L has never seen the larger distances; the line above gives what that "
        "costs. The scalings (explore section) change which distances it has seen.",
    ),
    "xpos": Lesson(
        "xPos (Sun et al. 2022) is RoPE with an extra per-pair decay: the query is scaled up and the "
        "key down by ζ<sub>i</sub> to the power of the position, so the logit falls with distance "
        "for any content, not only on average.",
        (
            r"$\tilde q_m = \zeta^{m/\gamma} R_m q,\quad \tilde k_n = \zeta^{-n/\gamma} R_n k,\quad "
            r"\zeta_i = (2i/d_h + 0.4)/1.4$",
        ),
        "γ is the scale base (512); ζ<sub>i</sub> &lt; 1, slow pairs decay least.",
        "<i>“xPos is rotation-only, so it keeps norms.”</i> It does not: it scales q and k on "
        "purpose (the <code>bounded</code> check says no, and is not promised).",
        settle_xpos,
    ),
    "rope_2d": Lesson(
        "Axial 2-D RoPE for image patches: half of the rotary pairs turn with the row, half with the "
        "column, so the logit depends on the 2-D offset between two patches.",
        (r"$\phi_i(r, c) = r\,\theta_i \;(i < d_h/4),\qquad \phi_i(r, c) = c\,\theta_i \;(i \geq d_h/4)$",),
        "r, c are the patch's row and column; each half of the pairs uses the frequencies of a 1-D "
        "RoPE of width d<sub>h</sub>/2.",
        "<i>“2-D RoPE is RoPE on the flattened index.”</i> Flattened, a patch below is W positions "
        "away; axially, it is one step along the row axis.",
    ),
    "alibi": Lesson(
        "ALiBi (Press et al. 2022) adds no vector at all: each head subtracts a fixed penalty "
        "proportional to the distance from the logit. Heads get slopes from steep to flat, so some "
        "attend locally and some across the context, and the rule is the same at any length.",
        (r"$a_{mn} = \frac{q_m^{\top} k_n}{\sqrt{d_h}} - s_h\,(m - n),\quad s_h = 2^{-8h/H}$",),
        "h = 1..H is the head; the slopes form a geometric sequence (for H a power of two).",
        "<i>“ALiBi reads longer inputs better.”</i> Reading more without getting worse (the line "
        "above) is not using more: the bias grows with the distance times the head's slope, so far "
        "tokens get almost no weight in the steep heads.",
        settle_alibi,
    ),
    "t5": Lesson(
        "T5 (Raffel et al. 2020) learns one number per head for each bucket of distances: exact "
        "buckets for short distances, logarithmically wider ones for long distances, and one last "
        "bucket for everything beyond max_distance.",
        (
            r"$a_{mn} = q_m^{\top} k_n + b_{h,\,\mathrm{bucket}(m-n)}$",
            r"$\mathrm{bucket}(r) = r \;\;(r < B/2),\qquad B/2 + \left\lfloor \frac{B}{2}\, "
            r"\frac{\ln(2r/B)}{\ln(2D/B)} \right\rfloor \;\;\mathrm{otherwise}$",
        ),
        "B is the number of buckets (32; halved per direction when bidirectional), D = max_distance "
        "(128); b is a trainable [buckets, heads] table.",
        "<i>“T5's bias decays with distance by design.”</i> Nothing in the formula decays: at "
        "initialisation the buckets are random (figures below); training makes them fall.",
    ),
    "shaw": Lesson(
        "Shaw et al. (2018) learn a vector per clipped relative distance and dot it with the query, "
        "so the positional term depends on what the query asks for. Distances beyond ±k share one "
        "vector.",
        (
            r"$a_{mn} = q_m^{\top}\,(k_n + a^K_{\mathrm{clip}(n - m,\, k)}) / \sqrt{d_h}$",
            r"$\mathrm{clip}(r, k) = \max(-k, \min(k, r))$",
        ),
        "a<sup>K</sup> is a trainable table of 2k + 1 vectors of width d<sub>h</sub>; with values on, "
        "a<sup>V</sup> is added to the weighted values the same way.",
        "<i>“Shaw's bias is a number per distance.”</i> It is a vector per distance, dotted with the "
        "query: its kernel has mean zero over random queries, which is why the figures use one "
        "random query.",
        settle_shaw,
    ),
    "transformer_xl": Lesson(
        "Transformer-XL (Dai et al. 2019) splits the logit into four terms: content–content, "
        "content–position, a global content bias u and a global position bias v, with the relative "
        "distance encoded by a sinusoid projected by W<sub>R</sub>.",
        (r"$a_{mn} = q_m^{\top} k_n + q_m^{\top} W_R R_{m-n} + u^{\top} k_n + v^{\top} W_R R_{m-n}$",),
        "R<sub>m−n</sub> is the sinusoidal vector of the distance; u, v and W<sub>R</sub> are trainable.",
        "<i>“u and v are positional.”</i> u multiplies the key's content only: it is a content prior "
        "that posenc declares apart from the position terms.",
    ),
    "fire": Lesson(
        "FIRE (Li et al. 2024) learns the bias as a small network of the distance, on a log scale and "
        "divided by the query's own (log) position, so the network's input stays in [0, 1] however "
        "long the input: a longer context reuses the range seen in training instead of distances "
        "never seen.",
        (
            r"$b_h(m, n) = f_\theta\!\left(\frac{\psi(m - n)}{\psi(\max(m, L)) + \epsilon}\right)_h,"
            r"\quad \psi(x) = \ln(1 + c\,|x|)$",
        ),
        "f<sub>θ</sub> is an MLP 1 → 32 → H with a ReLU; c and the threshold L are learned (L starts "
        "at 512); below L the divisor is fixed, so the bias is a function of the distance alone.",
        "<i>“FIRE is translation invariant, like T5.”</i> Only below its threshold: past it the bias "
        "of the same distance changes with the query's position (posenc promises FIRE no "
        "translation invariance, and <code>posenc verify fire</code> checks what it promises).",
    ),
    "kerple_log": Lesson(
        "KERPLE (Chi et al. 2022) reads the bias as a kernel of the distance and learns its shape: "
        "the log variant subtracts a penalty that grows like the logarithm of the distance, two "
        "learned positive numbers per head.",
        (r"$b_h(m, n) = -r_{1,h}\,\ln(1 + r_{2,h}\,|m - n|),\quad r_{1,h},\, r_{2,h} > 0$",),
        "r<sub>1</sub> sets the penalty's height and r<sub>2</sub> how soon it bends; both are "
        "trained (kept at or above 0.01).",
        "<i>“A logarithmic penalty is no penalty far away.”</i> It still grows without bound, only "
        "slowly, as −r<sub>1</sub>·ln(1 + r<sub>2</sub>|m − n|), which the figures below draw per head.",
        settle_kerple_log,
    ),
    "kerple_power": Lesson(
        "KERPLE's power variant subtracts a learned power of the distance; with the exponent 1 and "
        "fixed slopes it is ALiBi, so it can learn ALiBi or bend away from it.",
        (r"$b_h(m, n) = -r_{1,h}\,|m - n|^{\,r_{2,h}},\quad 0 < r_{2,h} \leq 2$",),
        "r<sub>1</sub> (the slope) and r<sub>2</sub> (the exponent) are trained per head.",
        "<i>“KERPLE power is ALiBi with learned slopes.”</i> Only where r<sub>2</sub> = 1: an "
        "exponent below 1 penalises far tokens less than linearly, above 1 more.",
    ),
    "cope": Lesson(
        "CoPE (Golovneva et al. 2024) counts positions in the content instead of in tokens: each key "
        "opens a gate from its logit, and a key's position seen from a query is the sum of the gates "
        "between them, so a query can look for “the third sentence back” when the gates open on "
        "sentence ends.",
        (
            r"$g_{mt} = \sigma(q_m^{\top} k_t / \sqrt{d_h}),\quad p_{mn} = \sum_{t=n}^{m} g_{mt}$",
            r"$b(m, n) = (1 - w)\, q_m^{\top} e_{\lfloor p_{mn} \rfloor} + w\, q_m^{\top} "
            r"e_{\lceil p_{mn} \rceil},\quad w = p_{mn} - \lfloor p_{mn} \rfloor$",
        ),
        "e is a table of learned position vectors shared by the heads; the gates follow the "
        "attention mask, so CoPE is causal only (an encoder refuses it).",
        "<i>“CoPE's positions are token indices with noise.”</i> They are counts of opened gates: "
        "with every gate open they are token distances plus one, with gates open only on some "
        "tokens they count those tokens.",
    ),
    "mrope": Lesson(
        "Multimodal RoPE (Qwen2-VL) gives each token three coordinates, time, row and column, and "
        "shares the rotated pairs out among them, so two image patches interact through their row "
        "and column offsets while text keeps plain RoPE.",
        (r"$\phi_i = c_{a(i)}\, \theta_i,\quad (c_t, c_y, c_x) = (p, p, p)\;\mathrm{for\ text}$",),
        "a(i) is the axis pair i belongs to (mrope_section splits the pairs into three runs; "
        "Qwen3-VL interleaves them); θ<sub>i</sub> are RoPE's frequencies.",
        "<i>“Multimodal RoPE changes text.”</i> For a text token all three coordinates are its "
        "index, so every pair turns by p: plain RoPE.",
        settle_mrope,
    ),
    "nope_temperature": Lesson(
        "Llama 4's layers without positions: no rotation at all, but each query is multiplied by a "
        "factor that grows slowly with its position, which sharpens attention again as more keys "
        "share the softmax at long lengths.",
        (r"$q_m \leftarrow q_m \left(\beta \ln\!\left(1 + \lfloor (m + 1)/F \rfloor\right) + 1\right)$",),
        "F = floor_scale (8192) and β = attn_scale (0.1) in Llama 4; keys are not touched.",
        "<i>“The temperature is a positional encoding.”</i> It never tells two positions apart "
        "inside a window of F tokens (the factor is exactly 1 there), so order must still come from "
        "the causal mask and the other layers.",
        settle_nope_temperature,
    ),
}


@functools.lru_cache(maxsize=256)
def math_svg(tex: str, size: int = 15) -> str:
    """``tex`` (mathtext, ``$...$``) typeset by matplotlib as a ``data:image/svg+xml`` URI.

    Raises:
        ValueError: matplotlib cannot parse ``tex``.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import mathtext
    from matplotlib.font_manager import FontProperties

    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "posenc"}):
        mathtext.math_to_image(tex, buf, prop=FontProperties(size=size), dpi=72, format="svg")
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _formula(tex: str) -> str:
    return f"<img class='math' src='{math_svg(tex)}' alt='{esc(tex)}'>"


#: Sizes of the worked example: small enough to print every number.
EXAMPLE_CONTEXT: dict[str, Any] = {"d_model": 8, "num_heads": 2, "head_dim": 4, "max_len": 16, "causal": True}


#: Sizes of a grid scheme's worked example: wide enough that every axis of a 3-D grid gets
#: dimensions (d = 12: four per axis; multimodal RoPE's default split gives each axis two pairs).
GRID_EXAMPLE_CONTEXT: dict[str, Any] = {**EXAMPLE_CONTEXT, "d_model": 12, "head_dim": 12}


def _fmt(x: float) -> str:
    """Three significant digits, signed (small initial values stay readable)."""
    return f"{x:+.3g}".replace("-", "−")


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def worked_example(name: str) -> str:
    """The worked example of scheme ``name`` (HTML): the scheme built by posenc at
    :data:`EXAMPLE_CONTEXT`'s sizes, its numbers, and what they show."""
    try:
        probe = make_probe(name, EXAMPLE_CONTEXT)
    except (ValueError, TypeError) as err:
        return f"<p class='muted'>No worked example: {esc(err)}</p>"
    if probe.scheme.position_dims != 1:
        return _grid_example(make_probe(name, GRID_EXAMPLE_CONTEXT))
    state = "; its trainable values at initialisation, random" if probe.trainable else ""
    parts = [
        f"<p><b>Worked example</b> (posenc builds <code>{esc(name)}</code> with d = {probe.d_model}, "
        f"{probe.num_heads} heads of d<sub>h</sub> = {probe.head_dim}, causal{state}):</p>"
    ]
    if "embed" in probe.hooks:
        pe = encodings(probe, 6).double()  # [6, d]
        rows = [[str(p), *(_fmt(float(v)) for v in pe[p])] for p in range(4)]
        header = ["p", *(f"PE(p)<sub>{i}</sub>" for i in range(pe.shape[1]))]
        parts.append(table(header, rows, numeric=range(1, pe.shape[1] + 1)))
        a, b = float(pe[1] @ pe[3]), float(pe[3] @ pe[5])
        same = _same(a, b)
        parts.append(
            f"<p>PE(1)·PE(3) = {_fmt(a)} and PE(3)·PE(5) = {_fmt(b)}: "
            + (
                "the same for the same distance, because PE(p + k) is a fixed rotation of PE(p).</p>"
                if same
                else "different for the same distance: the vectors carry absolute positions, and "
                "how they relate must be learned.</p>"
            )
        )
    if probe.rotates:
        theta = rotation_frequencies(probe)  # [d_h/2]
        parts.append(
            f"<p>Its pairs turn by θ = {', '.join(f'{float(t):.4g}' for t in theta)} rad per position. "
            f"A query at m = 3 turns pair 0 by 3θ<sub>0</sub> = {3 * float(theta[0]):.3f} rad, a key at "
            f"n = 1 by θ<sub>0</sub> = {float(theta[0]):.3f} rad: the angle between them is "
            f"2θ<sub>0</sub>, as it is for m = 5, n = 3.</p>"
        )
    if not probe.hooks:
        parts.append(
            "<p>posenc computes no positional term: every K(m, n) is 0, and the logit is the content "
            "term q·k/√d<sub>h</sub> whatever m and n are.</p>"
        )
        return "".join(parts)
    kern, content = display_kernel(probe, 6)  # [h, 6, 6]
    k = kern[0]
    how = "one random query" if content == "random" else "mean content"
    rows = [[f"m = {m}", *(_fmt(float(k[m, n])) if n <= m else "masked" for n in range(6))] for m in range(6)]
    parts.append(
        f"<p>K(m, n) of head 0 ({how}), the logit change due to position alone:</p>"
        + table(["", *(f"n = {n}" for n in range(6))], rows, numeric=range(1, 7))
    )
    k31, k53, k50 = float(k[3, 1]), float(k[5, 3]), float(k[5, 0])
    verdict = (
        "equal: this scheme sees only the distance m − n"
        if _same(k31, k53)
        else "not equal: this scheme also knows where the pair sits"
    )
    trend = "lower" if k50 < k53 else "higher" if k50 > k53 else "the same"
    parts.append(
        f"<p>K(3, 1) = {_fmt(k31)} and K(5, 3) = {_fmt(k53)} (both distance 2) are {verdict}. At distance "
        f"5, K(5, 0) = {_fmt(k50)}, {trend} than at distance 2.</p>"
    )
    return "".join(parts)


def _grid_example(probe: Probe) -> str:
    """The worked example of a grid scheme: K between grid points, computed on coordinates."""
    import torch

    from .grid import axis_names

    dims = probe.scheme.position_dims
    names = axis_names(probe)
    origin = torch.zeros(1, dims, dtype=torch.long)  # [1, D]
    steps = torch.eye(dims, dtype=torch.long)  # [D, D]: one step along each axis
    k_steps = positional_kernel(probe, origin, torch.cat([origin, steps]))[0, 0]  # [1 + D]
    offset = torch.tensor([[1, 2, 0][:dims]])  # [1, D]
    here, there = torch.tensor([[2, 1, 1][:dims]]), torch.tensor([[0] * dims])
    k_a = float(positional_kernel(probe, there, there + offset)[0, 0, 0])
    k_b = float(positional_kernel(probe, here, here + offset)[0, 0, 0])
    k0 = float(k_steps[0])
    rows = [["the point itself", _fmt(k0), "–"]] + [
        [f"one step along {esc(n)}", _fmt(float(k_steps[a + 1])), _fmt(float(k_steps[a + 1]) - k0)]
        for a, n in enumerate(names)
    ]
    coords = ", ".join(esc(n) for n in names)
    same = _same(k_a, k_b)
    return (
        f"<p><b>Worked example</b> (posenc builds <code>{esc(probe.name)}</code> with d = {probe.d_model}, "
        f"d<sub>h</sub> = {probe.head_dim}): positions are {dims}-D coordinates ({coords}). K between "
        "the point at the origin and:</p>"
        + table(["key", "K", "change from the point itself"], rows, numeric=(1, 2))
        + f"<p>K({tuple(there[0].tolist())}, {tuple((there + offset)[0].tolist())}) = {_fmt(k_a)} and "
        f"K({tuple(here[0].tolist())}, {tuple((here + offset)[0].tolist())}) = {_fmt(k_b)}, the same "
        "offset at two places: "
        + (
            "equal, so this scheme sees only the offset on each axis.</p>"
            if same
            else "not equal, so this scheme also knows where the pair sits.</p>"
        )
    )


def _study_line(name: str, study: dict[str, Any] | None) -> str:
    """The scheme's paired deltas in ``study`` (from the numbers), or how to measure them."""
    if study is None:
        return ""
    cfg = study["config"]
    L = cfg.get("train_len")
    rows = [
        r
        for r in study["summary"]
        if r.get("name") == name and isinstance(r.get("delta"), dict) and r.get("length") != L
    ]
    if not rows:
        return (
            f"<p><b>Past the trained length</b>: not in the study above; <code>posenc extrapolate "
            f"--schemes {esc(name)}</code> measures it.</p>"
        )
    from .sections import interval_text

    cells = ", ".join(f"E = {esc(r['length'])}: {interval_text(r['delta'], True)}" for r in rows)
    return (
        f"<p><b>Past the trained length</b> (study above, trained at L = {esc(L)}; bits/byte of the same "
        f"bytes in windows of E minus L, mean ±95% half-width): {cells}.</p>"
    )


def lesson_html(name: str, hooks: Sequence[str], study: dict[str, Any] | None = None) -> str:
    """The teaching part of scheme ``name``'s section: problem, rendered formulas, worked example,
    its measured behaviour past L in ``study``, and a misreading."""
    lesson = LESSONS.get(name)
    if lesson is None:
        formulas = tuple(HOOK_FORMULAS[h] for h in hooks if h in HOOK_FORMULAS) or (HOOK_FORMULAS["embed"],)
        lesson = Lesson(
            "A scheme registered with posenc; its maths acts through the hooks it declares: "
            f"{esc(', '.join(hooks) or 'none')}.",
            formulas,
            "The formulas are the general form of each hook.",
            "",
        )
    maths = "".join(f"<div class='eq'>{_formula(t)}</div>" for t in lesson.formulas)
    return (
        f"<p><b>The problem.</b> {lesson.problem}</p>"
        f"<div class='maths'>{maths}<p class='muted'>{lesson.where}</p></div>"
        + worked_example(name)
        + _study_line(name, study)
        + (
            f"<p><b>Misreading.</b> {lesson.misreading}"
            + (f" {lesson.settle()}" if lesson.settle is not None else "")
            + "</p>"
            if lesson.misreading
            else ""
        )
    )
