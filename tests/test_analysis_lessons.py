"""Tests of posenc.analysis.lessons: every registered scheme's lesson renders its formulas as SVG
and a worked example whose numbers posenc computed (RoPE: pair 0 turns by m theta_0 and the logit
depends only on m - n; a learned table: it does not; NoPE: no positional term); a scheme registered
at run time gets a lesson from its hooks; the study line quotes the study's numbers."""

from __future__ import annotations

import base64
import re

import posenc
from _analysis_toys import ToyALiBi, registered
from posenc.analysis.default_study import load_default_study
from posenc.analysis.lessons import LESSONS, lesson_html, math_svg, worked_example
from posenc.registry import describe


def test_every_registered_scheme_has_words_and_formulas_that_render():
    assert set(posenc.schemes()) <= set(LESSONS)
    for name, lesson in LESSONS.items():
        for tex in lesson.formulas:
            svg = base64.b64decode(math_svg(tex).split(",", 1)[1])
            assert svg.startswith(b"<?xml") and b"<svg" in svg, name


def test_rope_worked_example_turns_pair_0_by_m_theta_0_and_depends_on_the_distance():
    text = worked_example("rope")
    assert "3θ<sub>0</sub> = 3.000 rad" in text and "θ<sub>0</sub> = 1.000 rad" in text  # theta_0 = base^0
    k31 = re.search(r"K\(3, 1\) = ([+−][\d.]+)", text).group(1)
    k53 = re.search(r"K\(5, 3\) = ([+−][\d.]+)", text).group(1)
    assert k31 == k53 and "this scheme sees only the distance" in text
    assert text.count("masked") == 15  # causal: the 15 entries above the diagonal of a 6 x 6 table


def test_a_learned_table_is_absolute_and_nope_has_no_term():
    learned = worked_example("learned")
    assert "different for the same distance" in learned and "not equal" in learned
    sinusoidal = worked_example("sinusoidal")
    assert "the same for the same distance" in sinusoidal
    assert "every K(m, n) is 0" in worked_example("nope")


def test_a_scheme_registered_at_run_time_gets_a_lesson_from_its_hooks():
    with registered(ToyALiBi):
        html = lesson_html("toy_alibi", describe("toy_alibi")["hooks"])
    assert "score_bias" in html and html.count("<img class='math'") == 1 and "Worked example" in html


def test_the_study_line_quotes_the_studys_intervals():
    study = load_default_study()
    html = lesson_html("alibi", ["score_bias"], study)
    rows = [
        r
        for r in study["summary"]
        if r["name"] == "alibi" and r["length"] == 2 * study["config"]["train_len"]
    ]
    (row,) = rows
    half = (row["delta"]["high"] - row["delta"]["low"]) / 2
    assert f"E = {row['length']}: {row['delta']['mean']:+.3f} ±{half:.3f}" in html
    assert "not in the study above" in lesson_html("xpos", ["rotate"], study)


def test_misreadings_type_no_measurement_and_their_numbers_are_computed():
    # the words of a misreading quote no measured number: only names (GPT-2, 1-D, T5), subscripts and
    # the constant 1 of a formula; every number a settlement quotes is measured when the page is built
    for name, lesson in LESSONS.items():
        words = re.sub(r"<[^>]+>", "", re.sub(r"<sub>\d</sub>|GPT-\d|\d-D|T5", "", lesson.misreading))
        assert set(re.findall(r"\d+(?:[.,]\d+)*", words)) <= {"1"}, (name, words)
    settled = {n: lesson.settle() for n, lesson in LESSONS.items() if lesson.settle is not None}
    assert {"sinusoidal", "alibi", "kerple_log", "nope_temperature", "mrope"} <= set(settled)
    # closed forms the measurements must reproduce: pair 0 of the sinusoid turns 1 rad per position
    # (wavelength 2 pi); ALiBi's steepest of 8 heads has slope 2^-1 (bias -500 at 1,000 back); Llama
    # 4's factor is 1 until (m + 1) / 8192 reaches 1; multimodal RoPE on text is RoPE exactly
    assert "pair 0 repeats every 6.28 positions" in settled["sinusoidal"]
    assert "bias is -500 for a key 1,000 tokens back and -0.5 one token back" in settled["alibi"]
    assert "e<sup>-499.5</sup>" in settled["alibi"]
    assert "exactly 1 at positions 0 to 8,190 and 1.069 at 8,191" in settled["nope_temperature"]
    assert settled["mrope"].endswith(": 0.")
    html = lesson_html("alibi", ["score_bias"])
    assert settled["alibi"] in html and "<b>Misreading.</b>" in html
