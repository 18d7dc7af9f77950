"""Tests of posenc.analysis.plots: every kind renders for every scheme it applies to, and writes a
non-empty PNG/SVG; errors name the kind and list the valid ones."""

from __future__ import annotations

import subprocess
import sys

import matplotlib.pyplot as plt
import pytest
import torch

import posenc
from _analysis_toys import ToyALiBi, ToyRoPE, registered
from posenc.analysis import make_probe
from posenc.analysis.plots import PLOT_KINDS, applicable_kinds, plot, render, save

SMALL = {"d_model": 32, "head_dim": 16, "num_heads": 4, "max_len": 64}


def test_every_kind_renders_for_every_applicable_registered_scheme(tmp_path):
    written = {}
    with registered():
        for name in posenc.schemes():
            probe = make_probe(name, SMALL)
            for kind in applicable_kinds(probe):
                path = save(render(probe, kind), tmp_path / f"{name}-{kind}.png", dpi=50)  # small: fast
                data = path.read_bytes()
                assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000, (name, kind)
                written.setdefault(kind, []).append(name)
    assert set(written) == set(PLOT_KINDS)  # every kind was drawn for at least one scheme
    assert "toy_alibi" in written["bias"] and "toy_rope" in written["scalings"]
    assert all("nope" not in names for names in written.values())
    assert not plt.get_fignums()  # every figure was closed


def test_svg_output_and_kinds_by_hook(tmp_path):
    path = plot("sinusoidal", "surface", tmp_path / "s.svg", context=SMALL)
    text = path.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text and len(text) > 5000
    with registered(ToyALiBi, ToyRoPE):
        assert "bias" in applicable_kinds("toy_alibi", SMALL) and "heatmap" not in applicable_kinds(
            "toy_alibi", SMALL
        )
        assert {"heatmap", "frequencies", "scalings"} <= set(applicable_kinds("toy_rope", SMALL))
    assert "frequencies" not in applicable_kinds("learned", SMALL)  # a random table has no frequencies
    assert applicable_kinds("nope", SMALL) == []


def test_errors_list_the_kinds(tmp_path):
    with pytest.raises(ValueError, match="unknown plot kind 'heat'; valid values: 'heatmap'"):
        render("sinusoidal", "heat", context=SMALL)
    with pytest.raises(
        ValueError, match=r"plot kind 'bias' does not apply to 'sinusoidal'.*applicable kinds: heatmap"
    ):
        render("sinusoidal", "bias", context=SMALL)
    with pytest.raises(ValueError, match=r"must end in \.png or \.svg"):
        plot("sinusoidal", "heatmap", tmp_path / "x.jpg", context=SMALL)
    assert not plt.get_fignums()


def test_import_posenc_stays_light():
    code = "import sys, posenc, posenc.cli; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_plot_defects_stay_fixed():
    import matplotlib.pyplot as plt

    from posenc.analysis.plots import render

    waves = render("sinusoidal", "waves")
    labels = [t.get_text() for t in waves.axes[0].get_legend().get_texts()]
    assert "dim 0" not in labels and "dim 1" not in labels  # the fastest pairs read as noise
    sim = render("sinusoidal", "similarity")
    image = sim.axes[0].images[0]
    lo, hi = image.get_clim()
    assert hi == 1.0 and lo == pytest.approx(float(image.get_array().min())) and lo > -0.5  # its own range
    kernel = render("rope", "kernel")  # one panel: a figure about its width, no blank half
    assert kernel.get_size_inches()[0] < 5.5
    bias = render("alibi", "bias")  # both panels carry a colour bar (the curves: which head)
    assert sorted(ax.get_ylabel() for ax in bias.axes if ax.get_label() == "<colorbar>") == [
        "bias (scaled-logit units)",
        "head",
    ]
    for fig in (waves, sim, kernel, bias):
        plt.close(fig)


def test_grid_schemes_are_drawn_on_their_grid():
    from posenc.analysis.grid import GRID_SIZE, plane_kernel

    probe = make_probe("mrope", SMALL)
    fig = render(probe, "grid")
    images = [im for ax in fig.axes for im in ax.get_images()]
    # one 2-D image per plane of the three axes (time x height, time x width, height x width), each
    # the kernel from the centre of that plane, axes named as the scheme declares them
    assert [im.get_array().shape for im in images] == [(GRID_SIZE, GRID_SIZE)] * 3
    assert (images[2].get_array() == plane_kernel(probe, (1, 2))[0].float().numpy()).all()
    labels = {ax.get_xlabel() for ax in fig.axes}
    assert {"height offset from the centre", "width offset from the centre"} <= labels
    plt.close(fig)
    fig = render(probe, "axes")  # the head as a strip coloured by the axis turning each dimension
    strip = fig.axes[1].get_images()[0].get_array()
    assert strip.shape == (1, 16) and sorted(set(strip.ravel().tolist())) == [1, 2, 3]
    plt.close(fig)
    assert "grid" not in applicable_kinds("rope", context=SMALL)
    assert "axes" not in applicable_kinds("sinusoidal_2d", context=SMALL)


def test_the_scalings_compared_are_the_ones_a_scheme_declares():
    # read from eval_variants, never found by trying every rule and skipping refusals
    from posenc.analysis.captions import figure_caption
    from posenc.analysis.plots import SCALING_FACTOR, scaling_probes

    with registered(ToyRoPE):
        probes = scaling_probes(make_probe("toy_rope", SMALL))
        assert list(probes) == ["none", "linear", "ntk"]
        assert probes["linear"].scheme.scaling == {"rope_type": "linear", "factor": SCALING_FACTOR}
        assert "linear ×4" in figure_caption(make_probe("toy_rope", SMALL), "scalings")
    rope = scaling_probes(make_probe("rope", SMALL))
    # dynamic follows the current length (at L it is the scheme as built): left out
    assert set(rope) == {"none", *posenc.RotaryEmbedding.eval_variants} - {"dynamic"}
    assert rope["yarn"].scheme.scaling_params["original_max_position_embeddings"] == SMALL["max_len"]
    assert "scalings" not in applicable_kinds("xpos", SMALL)  # a rotation that declares no scalings


def test_the_scalings_keep_the_schemes_own_options_and_refuse_a_bare_module():
    from posenc.analysis.captions import figure_caption
    from posenc.analysis.plots import scaling_probes

    mine = make_probe("rope", SMALL, {"base": 500000.0})
    probes = scaling_probes(mine)
    assert probes["none"] is mine  # the scheme as given, not a default one
    assert {p.scheme.base for p in probes.values()} == {500000.0}
    default = scaling_probes(make_probe("rope", SMALL))
    assert not torch.equal(probes["linear"].scheme.inv_freq, default["linear"].scheme.inv_freq)

    class MyRoPE(posenc.RotaryEmbedding):  # not registered: a module whose options are unknown
        name = "my_rope"

    module = make_probe(MyRoPE(SMALL["head_dim"]), SMALL)
    assert "scalings" not in applicable_kinds(module)
    with pytest.raises(ValueError, match="must be given by its registry name and options"):
        scaling_probes(module)
    with pytest.raises(ValueError, match="must be given by its registry name and options"):
        figure_caption(module, "scalings")
