"""Tests of posenc.benchmarks.commands: `posenc bench` (and python -m posenc bench): case selection,
the JSON report's keys, tables and markdown, --out checked first, missing peers named. No timing
assertions: speed depends on the machine and its load and is never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from posenc.benchmarks import GROUPS, select
from posenc.benchmarks.commands import SCHEMA, run
from posenc.benchmarks.harness import like_for_like
from posenc.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_select_groups_and_cases():
    assert set(select(["sinusoidal"], quick=True)) == {"sinusoidal_table", "sinusoidal_embed"}
    assert list(select(["rope_decode"], quick=True)) == ["rope_decode"]
    with pytest.raises(ValueError, match="unknown benchmark case 'rope_fast'; valid: groups rope"):
        select(["rope_fast"], quick=True)
    assert set(GROUPS) == {"rope", "sinusoidal", "embedding", "bias", "train_step"}


CASE_KEYS = {
    "case",
    "description",
    "params",
    "bytes",
    "results",
    "copy_gbps",
    "clone_gbps",
    "speedup",
    "skipped",
    "loadavg_before",
    "loadavg_after",
}
RESULT_KEYS = {
    "kind",
    "form",
    "layout",
    "note",
    "median_s",
    "q1_s",
    "q3_s",
    "gbps",
    "copy_fraction",
    "limit",
    "of_limit",
    "of_limit_q1",
    "of_limit_q3",
    "of_limit_medians",
    "check",
    "max_abs_err",
}


def test_cli_quick_json_has_the_documented_keys(capsys, tmp_path):
    out_file = tmp_path / "bench.json"
    argv = ["bench", "sinusoidal_embed", "rope_decode", "--quick", "--json", "--out", str(out_file)]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads(out_file.read_text())
    assert report["schema"] == SCHEMA and report["quick"] is True
    env = report["environment"]
    assert {"cpu", "cores", "torch", "threads", "allocator", "malloc_env", "loadavg"} <= set(env)
    assert [c["case"] for c in report["cases"]] == ["sinusoidal_embed", "rope_decode"]
    for case in report["cases"]:
        assert set(case) == CASE_KEYS
        assert case["bytes"] > 0 and case["copy_gbps"] > 0
        for name, r in case["results"].items():
            paired = {"versus", "versus_ratio", "versus_q1", "versus_q3"}  # a module beside its function
            beside = name in ("posenc_module", "posenc_module_precompute")
            assert set(r) == (RESULT_KEYS | paired if beside else RESULT_KEYS), name
            assert r["median_s"] > 0 and r["gbps"] == pytest.approx(case["bytes"] / r["median_s"] / 1e9)
        mine = [n for n, r in case["results"].items() if r["kind"] == "posenc"]
        peers = [n for n, r in case["results"].items() if r["kind"] == "peer"]
        assert mine and set(case["speedup"]) == set(mine)
        for p in mine:  # speed-ups only against peers of the same form and layout
            same = {q for q in peers if like_for_like(case["results"][p], case["results"][q])}
            assert set(case["speedup"][p]) == same
    rope = report["cases"][1]
    assert {"posenc_half", "posenc_half_inplace", "hf_eager", "meta_complex"} <= set(rope["results"])
    assert rope["skipped"]["hf_compiled"] == "--quick: no torch.compile"


def test_cli_table_list_and_errors(capsys):
    assert main(["bench", "--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert "rope_prefill_fp32" in listed and "train_step_alibi" in listed and "bias_alibi" in listed
    assert main(["bench", "sinusoidal_table", "--quick", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "cores" in out.splitlines()[0] and "torch" in out.splitlines()[0]  # the environment line
    assert "== sinusoidal_table" in out and "posenc_vaswani" in out and "allocator system" in out
    assert main(["bench", "nonsense"]) == 2
    assert "unknown benchmark case 'nonsense'" in capsys.readouterr().err
    assert main(["bench", "rope", "--repeats", "0"]) == 2
    assert "--repeats must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["folder", "under_file"])
def test_out_checked_before_the_benchmark_runs(capsys, tmp_path, monkeypatch, where):
    import posenc.benchmarks.commands

    monkeypatch.setattr(
        posenc.benchmarks.commands, "run", lambda *a, **k: pytest.fail("ran before checking --out")
    )
    (tmp_path / "f").write_text("x")
    out = tmp_path if where == "folder" else tmp_path / "f" / "r.json"
    assert main(["bench", "sinusoidal_table", "--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert ("is a folder; give a file name" in err or "lies under the file" in err) and "Traceback" not in err


def test_saved_run_renders_as_markdown_without_running(capsys, tmp_path):
    out_file = tmp_path / "run.json"
    assert main(["bench", "sinusoidal_table", "--quick", "--repeats", "2", "--out", str(out_file)]) == 0
    text = capsys.readouterr().out
    assert main(["bench", "--from", str(out_file), "--markdown"]) == 0
    md = capsys.readouterr().out
    head = "| impl | form | median | IQR | GB/s | of limit | posenc speed-up | check |"
    assert "**sinusoidal_table**" in md and head in md
    assert "| **posenc_vaswani** |" in md and "| copy |" in md
    assert main(["bench", "--from", str(out_file)]) == 0  # the plain tables of the run, as printed then
    assert capsys.readouterr().out.split("\n")[1:] == text.split("\n")[1:]
    (tmp_path / "other.json").write_text('{"cases": []}')
    assert main(["bench", "--from", str(tmp_path / "other.json")]) == 2
    assert "not a posenc bench report" in capsys.readouterr().err
    assert main(["bench", "--from", str(tmp_path / "missing.json")]) == 2
    assert "cannot read a JSON report" in capsys.readouterr().err
    assert main(["bench", "rope", "--from", str(out_file)]) == 2
    assert "drop case names" in capsys.readouterr().err


def test_run_api_train_step_without_byte_count():
    report = run(["train_step_rope"], quick=True, repeats=1)
    (case,) = report["cases"]
    assert case["bytes"] == 0 and case["copy_gbps"] is None
    mine, theirs = case["params"]["params_posenc"], case["params"]["params_x_transformers"]
    assert abs(mine - theirs) == 3 * 16  # same model; x-transformers' LayerNorms have no bias
    assert all(r["gbps"] is None for r in case["results"].values())


def test_long_train_step_times_the_blocked_and_the_full_table_paths():
    report = run(["train_step_long_alibi"], quick=True, repeats=1)
    (case,) = report["cases"]
    assert case["params"]["L"] == 300  # more than one 256-query block
    assert {"posenc_alibi", "posenc_alibi_full_table"} <= set(case["results"])
    assert all(r["median_s"] > 0 for r in case["results"].values())


def test_python_dash_m_runs_the_same_benchmarks():
    result = subprocess.run(
        [sys.executable, "-m", "posenc", "bench", "sinusoidal", "--quick", "--json", "--repeats=2"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    report = json.loads(result.stdout)
    assert [c["case"] for c in report["cases"]] == ["sinusoidal_table", "sinusoidal_embed"]


def test_missing_peers_are_named_with_how_to_enable_them(capsys, monkeypatch):
    import posenc.benchmarks.commands

    monkeypatch.setitem(posenc.benchmarks.commands.PEERS, "posenc_no_such_peer", "no-such-peer")
    assert posenc.benchmarks.commands.missing_peers() == ["no-such-peer"]
    assert main(["bench", "sinusoidal_table", "--quick", "--repeats", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == (
        "not installed, so not compared: no-such-peer; to compare with them: "
        "pip install 'posenc[bench]' (or pip install no-such-peer)"
    )


def test_the_bench_extra_lists_every_peer():
    import tomllib

    from posenc.benchmarks.commands import PEERS

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    named = {req.split(">")[0].split("=")[0].strip() for req in extras["bench"]}
    assert named == set(PEERS.values())
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert "posenc[bench]" in readme or '".[bench' in readme or ".[all,bench]" in readme


def test_cli_stops_with_exit_1_when_an_implementation_disagrees(monkeypatch, capsys):
    """A case whose implementation computes something else fails loudly: one line, exit 1, no
    table printed for it."""
    from posenc.benchmarks import rope

    real = rope.meta_complex_rotary
    monkeypatch.setattr(rope, "meta_complex_rotary", lambda x, f, r: real(x, f, r) * 1.1)
    assert main(["bench", "rope_decode", "--quick", "--repeats", "1"]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("posenc bench: failed: benchmark case 'rope_decode': meta_complex disagrees")
    assert "== rope_decode" not in out


@pytest.mark.parametrize("threads", ["0", "-3", "100000"])
def test_cli_refuses_thread_counts_out_of_range_before_running(capsys, threads):
    """100,000 threads crashed torch's pool and 5,000 took minutes: refused in one line, nothing timed."""
    import torch

    before = torch.get_num_threads()
    assert main(["bench", "sinusoidal_table", "--quick", "--threads", threads]) == 2
    captured = capsys.readouterr()
    assert "--threads" in captured.err and threads in captured.err
    assert captured.out == ""  # no environment line, no case ran
    assert torch.get_num_threads() == before


def test_run_refuses_too_many_threads():
    with pytest.raises(ValueError, match="threads 100000 is more than"):
        run(["sinusoidal_table"], quick=True, threads=100000)
