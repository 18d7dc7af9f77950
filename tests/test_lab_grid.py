"""Tests of posenc.lab.grid: ``--vary FIELD=v1,v2`` parsed and checked (unknown fields with a close
match, fields a study sets itself, values a model refuses), the settings' product with randomized
positions, run names; and a tiny study that trains every scheme with every setting."""

from __future__ import annotations

import pytest

from _lab_toys import tiny_study
from posenc.lab.cells import study_cells
from posenc.lab.extrapolate import run_study
from posenc.lab.grid import (
    check_vary,
    model_fields,
    parse_value,
    parse_vary,
    run_name,
    setting_label,
    split_setting,
    study_settings,
)
from posenc.lab.tables import format_table
from posenc.model import ModelConfig


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    from _lab_toys import write_corpus

    return write_corpus(tmp_path_factory.mktemp("corpus"))


def test_values_parse_as_json_or_strings():
    assert [
        parse_value(v) for v in ("none", "None", "true", "False", "0.02", "3", "post", "sqrt_d_model")
    ] == [None, None, True, False, 0.02, 3, "post", "sqrt_d_model"]
    assert parse_vary(["norm=pre,post", "init_std=0.02,0.1"]) == {
        "norm": ("pre", "post"),
        "init_std": (0.02, 0.1),
    }


@pytest.mark.parametrize(
    ("specs", "match"),
    [
        (["norm"], r"--vary 'norm' is not FIELD=V1,V2,... ; e.g. --vary norm=pre,post"),
        (["norm="], "is not FIELD=V1,V2"),
        (["=pre,post"], "is not FIELD=V1,V2"),
        (["norm=pre", "norm=post"], "--vary 'norm' is given twice"),
    ],
)
def test_parse_vary_errors(specs, match):
    with pytest.raises(ValueError, match=match):
        parse_vary(specs)


def test_check_vary_names_the_field_the_value_and_the_fix():
    mc = ModelConfig(vocab_size=256, position="rope")
    with pytest.raises(ValueError, match="vary field 'nrom' is not a model setting; did you mean 'norm'"):
        check_vary({"nrom": ("pre", "post")}, mc)
    with pytest.raises(
        ValueError, match="vary field 'position' cannot be varied: give schemes with --schemes"
    ):
        check_vary({"position": ("rope", "alibi")}, mc)
    with pytest.raises(ValueError, match=r"vary norm='sideways': unknown norm 'sideways'"):
        check_vary({"norm": ("pre", "sideways")}, mc)
    with pytest.raises(TypeError, match=r"vary embed_norm='yes': embed_norm must be a bool"):
        check_vary({"embed_norm": (False, "yes")}, mc)
    with pytest.raises(ValueError, match="vary 'norm' needs distinct values"):
        check_vary({"norm": ("pre", "pre")}, mc)
    with pytest.raises(TypeError, match="vary must be a dict"):
        check_vary(["norm"], mc)
    assert check_vary({"norm": ["pre", "post"]}, mc) == {"norm": ("pre", "post")}
    # "none" parses as None; a field that takes no None gets the string back
    assert check_vary(parse_vary(["tie=output,none"]), mc) == {"tie": ("output", "none")}
    assert check_vary(parse_vary(["embed_scale=sqrt_d_model,none"]), mc) == {
        "embed_scale": ("sqrt_d_model", None)
    }
    assert "embed_scale" in model_fields() and "vocab_size" not in model_fields()


def test_settings_are_the_product_and_randomized_positions_double_them():
    vary = {"norm": ("pre", "post"), "tie": ("output", "none")}
    settings = study_settings(vary)
    assert settings == [
        (("norm", "pre"), ("tie", "output")),
        (("norm", "pre"), ("tie", "none")),
        (("norm", "post"), ("tie", "output")),
        (("norm", "post"), ("tie", "none")),
    ]
    assert study_settings({}) == [()]
    assert study_settings({}, 64) == [(), (("random_positions", 64),)]
    assert len(study_settings(vary, 64)) == 8
    setting = (("embed_scale", None), ("init_std", 0.02), ("random_positions", 64))
    assert setting_label(setting) == "embed_scale=null,init_std=0.02,random_positions=64"
    assert run_name("rope", setting[:1]) == "rope[embed_scale=null]" and run_name("rope", ()) == "rope"
    assert split_setting(setting) == ({"embed_scale": None, "init_std": 0.02}, {"random_positions": 64})


def test_a_study_trains_every_scheme_with_every_setting(corpus_dir):
    config = tiny_study(
        corpus_dir,
        schemes=("alibi", "rope"),
        vary={"norm": ("pre", "post")},
        randomized_positions=32,
        variants=(),
    )
    names = [c.name for c in study_cells(config)]
    assert (
        names[:4]
        == [
            "alibi[norm=pre]-seed0",
            "alibi[norm=pre,random_positions=32]-seed0",
            "alibi[norm=post]-seed0",
            "alibi[norm=post,random_positions=32]-seed0",
        ]
        and len(names) == 8
    )
    study = run_study(config, log=None)
    results = study.to_dict()
    mcs = results["model_configs"]
    assert mcs["rope[norm=post]"]["norm"] == "post" and mcs["rope[norm=pre]"]["norm"] == "pre"
    assert (
        mcs["rope[norm=pre,random_positions=32]"]["max_len"] == 32 and mcs["rope[norm=pre]"]["max_len"] == 8
    )
    runs = {(r["name"], r["seed"]): r for r in results["runs"]}
    assert runs["alibi[norm=post]", 0]["setting"] == {"norm": "post"}
    assert {r["name"] for r in results["summary"]} == {n.rsplit("-seed", 1)[0] for n in names}
    # the same model, trained with randomized positions or not, gives other numbers
    plain, randomized = runs["rope[norm=pre]", 0], runs["rope[norm=pre,random_positions=32]", 0]
    assert plain["eval"][0]["window_bits"] != randomized["eval"][0]["window_bits"]
    assert set(results["training"]) == {r["name"] for r in results["summary"]}
    train = results["cells"][0]["train"]  # 4 steps: one block of the mean loss every 10 steps
    assert len(train["loss_mean_10_steps"]) == 1 and train["loss_mean_10_steps"][0] < 6
    # every setting against the grid's first, same scheme, same bytes, seed for seed
    against = {e["run"]: e["against"] for e in results["settings"]}
    assert against["rope[norm=post,random_positions=32]"] == "rope[norm=pre]" and len(against) == 6
    entry = next(e for e in results["settings"] if e["run"] == "alibi[norm=post]")
    post, pre = runs["alibi[norm=post]", 0]["eval"][0], runs["alibi[norm=pre]", 0]["eval"][0]
    diff = sum(a - b for a, b in zip(post["window_bits"], pre["window_bits"])) / len(pre["window_bits"])
    assert (
        entry["rows"][0]["diff"]["mean"] == pytest.approx(diff, abs=1e-6)
        and entry["rows"][0]["over"] == "documents"
    )
    assert "each setting minus the first setting of the grid" in format_table(study)
