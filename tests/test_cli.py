import subprocess
import sys

import pytest
import torch

import posenc
from posenc.absolute import sinusoidal_table
from posenc.cli import main, parse_positions


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in posenc.schemes():
        assert name in out


def test_show_prints_the_table(capsys):
    assert main(["show", "sinusoidal", "--dim", "16", "--positions", "0:3", "--digits", "6"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("position")]
    table = sinusoidal_table(3, 16)
    assert len(lines) == 3
    for p, line in enumerate(lines):
        values = [float(v) for v in line.split("[")[1].rstrip("]").split(",")]
        assert len(values) == 16
        torch.testing.assert_close(torch.tensor(values), table[p], atol=5.1e-7, rtol=0)  # 6 printed digits


def test_show_learned_and_variant(capsys):
    assert main(["show", "learned", "--dim", "4", "--positions", "0,7"]) == 0
    assert main(["show", "sinusoidal", "--variant", "tensor2tensor", "--dim", "8", "--columns", "2"]) == 0
    out = capsys.readouterr().out
    assert "position 7:" in out


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["show", "nope"], "has no table to show"),
        (["show", "sinusoidal", "--positions", "a:b"], "is not START:STOP"),
        (["show", "sinusoidal", "--dim", "15"], "d_model must be even"),
        (["show", "magic"], "unknown scheme 'magic'"),
    ],
)
def test_show_errors(argv, match, capsys):
    assert main(argv) == 2
    assert match in capsys.readouterr().err


def test_parse_positions():
    assert parse_positions("2:8:3").tolist() == [2, 5]
    assert parse_positions("4,1").tolist() == [4, 1]


def test_console_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-m", "posenc", "list"], capture_output=True, text=True, check=True
    )
    assert "sinusoidal" in result.stdout
