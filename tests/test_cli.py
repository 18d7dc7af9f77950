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


def test_show_mrope_draws_its_three_axes(capsys):
    """`posenc show mrope` maps the head: 16 dims at the default split (2, 3, 3) pairs, half layout, so
    pair i is dims i and i + 8; each axis turns its pairs by RoPE's frequencies base^(-2i/16)."""
    assert main(["show", "mrope", "--dim", "16", "--digits", "6"]) == 0
    out = capsys.readouterr().out
    assert "3 position axes (time, height, width)" in out
    assert "head: TTHHHWWWTTHHHWWW  (T time, H height, W width)" in out
    rows = [ln.split() for ln in out.splitlines() if ln.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == list(range(16))
    axes = [r[1] for r in rows]
    assert axes == (["time"] * 2 + ["height"] * 3 + ["width"] * 3) * 2
    angles = torch.tensor([float(r[2]) for r in rows], dtype=torch.float64)
    pair = (torch.arange(16) % 8).double()
    torch.testing.assert_close(angles, 10000.0 ** (-2 * pair / 16.0), atol=5.1e-7, rtol=0)


def test_show_rope_is_one_axis(capsys):
    assert main(["show", "rope", "--dim", "8", "--columns", "2"]) == 0
    out = capsys.readouterr().out
    assert "head: PPPPPPPP  (P position)" in out
    assert len([ln for ln in out.splitlines() if ln.strip()[:1].isdigit()]) == 2


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["show", "nope"], "has no table to show"),
        (["show", "alibi"], "has no table to show"),
        (
            ["show", "transformer_xl"],
            "has no table to show: it acts inside attention (hooks: queries, score_bias)",
        ),
        (["show", "nope_temperature"], "it acts inside attention (hooks: queries)"),
        (["show", "mrope", "--dim", "100000"], "wider than 4,096"),
        (["show", "mrope", "--dim", "7"], "head_dim must be even"),
        (["show", "rope", "--variant", "vaswani"], "--variant applies to absolute schemes"),
        (["show", "sinusoidal", "--positions", "a:b"], "is not START:STOP"),
        (["show", "sinusoidal", "--dim", "15"], "d_model must be even"),
        (["show", "magic"], "unknown scheme 'magic'"),
        (["show", "sinusoidal", "--positions", "5:1"], "--positions '5:1' is empty"),
        (["show", "sinusoidal", "--positions", "0:100000000"], "100,000,000 positions, more than 625,000"),
        (["show", "sinusoidal", "--positions", "0:1000000000000"], "more than 625,000"),
        (["show", "sinusoidal", "--dim", "100000000", "--positions", "0:2"], "more than 10,000,000 values"),
        (["show", "sinusoidal", "--digits", "-1"], "--digits must be >= 0, got -1"),
        (["show", "sinusoidal", "--columns", "-2"], "--columns must be >= 1, got -2"),
    ],
)
def test_show_errors(argv, match, capsys):
    assert main(argv) == 2
    assert match in capsys.readouterr().err


def test_parse_positions():
    assert parse_positions("2:8:3").tolist() == [2, 5]
    assert parse_positions("4,1").tolist() == [4, 1]
    assert parse_positions(":3").tolist() == [0, 1, 2]


def _user_errors(tmp_path):
    (tmp_path / "afile").write_text("x")
    f = str(tmp_path / "afile")
    return [
        ["show", "sinusoidal", "--positions", "5:1"],
        ["show", "sinusoidal", "--positions", "0:1000000000000"],
        ["report", "-o", f],
        ["report", "-o", f + "/sub"],
        ["plot", "rope", "--kind", "kernel", "-o", str(tmp_path)],
        ["plot", "rope", "--kind", "kernel", "-o", f + "/x.png"],
        ["train", "--device", "bogus", "--out", str(tmp_path / "t")],
        ["train", "--out", f],
        ["extrapolate", "--out", f + "/sub"],
        ["bench", "sinusoidal_table", "--out", str(tmp_path)],
    ]


@pytest.mark.slow
def test_user_errors_are_one_line_and_exit_code_2(tmp_path):
    """Each bad command in its own process: exit code 2, one line on stderr, no traceback, fast."""
    for argv in _user_errors(tmp_path):
        done = subprocess.run(
            [sys.executable, "-m", "posenc", *argv], capture_output=True, text=True, timeout=60
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2, (argv, done.stderr[-800:])
        assert len(lines) == 1 and "Traceback" not in done.stderr, (argv, done.stderr[-800:])
        assert lines[0].startswith(f"posenc {argv[0]}: error: "), lines


def test_console_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-m", "posenc", "list"], capture_output=True, text=True, check=True
    )
    assert "sinusoidal" in result.stdout


@pytest.mark.slow
def test_huge_sizes_in_the_cli_are_one_line_errors(tmp_path):
    for argv in (
        ["train", "--d-model", "1048576", "--heads", "4", "--out", str(tmp_path / "t")],
        ["encode", "hi", "--tokenizer", "bpe", "--vocab-size", "1000000000"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "posenc", *argv], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, (argv, done.stderr[-800:])
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_reader_that_leaves_early_is_not_an_error():
    """`posenc show ... | head`: the closed pipe ends the command quietly (exit code 0)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "posenc", "show", "sinusoidal", "--positions", "0:20000", "--dim", "64"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout.read(100)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and "Traceback" not in err, err[-1500:]


#: A handful of bad values for any flag: negative, zero, not a number, overflowing, enormous, a
#: missing path, a folder, a file where a folder is expected, empty.
FUZZ_VALUES = ["-1", "0", "abc", "1e309", "99999999999999999999", "/nonexistent/dir/x", "{dir}", "{file}", ""]


def _fuzz_base(tmp_path, corpus) -> dict[str, list[str]]:
    """Per command, arguments that make a valid run cheap (so a bad value is what is tested)."""
    tiny = [
        "--train-len",
        "8",
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--d-model",
        "16",
        "--layers",
        "1",
        "--heads",
        "2",
        "--corpus",
        str(corpus),
        "--no-progress",
    ]
    return {
        "list": [],
        "show": ["sinusoidal"],
        "verify": ["sinusoidal"],
        "plot": ["rope", "--kind", "kernel", "-o", str(tmp_path / "p.png")],
        "report": ["-o", str(tmp_path / "rep"), "nope"],
        "encode": ["hi", "--tokenizer", "byte"],
        "extrapolate": [
            "--schemes",
            "alibi",
            "--eval-lens",
            "8,16",
            "--eval-windows",
            "2",
            "--seeds",
            "0",
            "--workers",
            "1",
            "--variants",
            "none",
            *tiny,
        ],
        "train": ["--scheme", "alibi", "--out", str(tmp_path / "tr"), "--overwrite", *tiny],
        "bench": ["sinusoidal_table", "--quick", "--repeats", "1"],
    }


@pytest.mark.slow
# Commands write their outputs into the working folder, and a value such as "{dir}" or "." then
# hands those PNG/safetensors files to a corpus reader, which skips them with this warning (its own
# test: tests/test_text_corpus.py).
@pytest.mark.filterwarnings("ignore:skipping binary file:UserWarning")
def test_fuzz_every_flag_of_every_command(tmp_path, monkeypatch):
    """Every flag of every command gets each bad value in turn: the command ends with exit code 0
    or 2 (argparse's own errors included), never with a traceback, within 15 s, except a valid
    enormous amount of work (e.g. --steps 99999999999999999999), which starts and is stopped."""
    import contextlib
    import io
    import signal

    from posenc.cli import build_parser

    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(12):
        (corpus / f"d{i}.txt").write_text(f"posenc fuzz corpus line {i}\n" * 120)
    monkeypatch.chdir(tmp_path)
    base = _fuzz_base(tmp_path, corpus)
    threads = torch.get_num_threads()

    class Timeout(Exception):
        pass

    def alarm(*_):
        raise Timeout

    previous = signal.signal(signal.SIGALRM, alarm)
    failures = []
    try:
        for command, args in base.items():
            for action in build_parser([command])[1][command]._actions:  # only the chosen one has its flags
                if not action.option_strings or action.nargs == 0:
                    continue
                flag = action.option_strings[-1]
                for raw in FUZZ_VALUES:
                    value = raw.format(dir=tmp_path / "dir", file=tmp_path / "file")
                    argv = [command, *args]
                    if flag in argv:  # replace the base's own value
                        del argv[argv.index(flag) : argv.index(flag) + 2]
                    argv += [flag, value] + ([value] if action.nargs == 2 else [])
                    err = io.StringIO()
                    signal.alarm(15)
                    try:
                        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                            code = main(argv)
                    except SystemExit as exc:  # argparse: a bad choice or type
                        code = exc.code
                    except Timeout:
                        code = "started" if value.isdigit() and int(value) > 10**6 else "timeout"
                    except BaseException as exc:
                        code = f"{type(exc).__name__}: {exc}"
                    finally:
                        signal.alarm(0)
                        # an alarm can land inside torch.no_grad's __enter__, leaving grad mode off
                        # for every later test of this worker: restore the process's torch state
                        torch.set_grad_enabled(True)
                        torch.set_num_threads(threads)
                    if code not in (0, 2, "started") or "Traceback" in err.getvalue():
                        failures.append(([command, flag, value], code, err.getvalue()[-300:]))
    finally:
        signal.signal(signal.SIGALRM, previous)
        torch.set_num_threads(threads)
    assert not failures, failures[:10]


# ---------------------------------------------------------------------------------------------
# Light commands, one error format, close matches
# ---------------------------------------------------------------------------------------------
_NO_TORCH = """
import contextlib, io, sys
from posenc.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:  # --help and --version exit through argparse
        code = exc.code
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))[:5]
print(code)
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        [],
        ["list"],
        ["list", "--json"],
        ["show", "--help"],
        ["lst"],
        ["show", "sinusoidal", "--dmi", "4"],
        ["bench", "--help"],
        ["encode", "--help"],
        ["train", "--help"],
        ["extrapolate", "--help"],
        ["train", "--out", "x", "--stpes", "3"],
        ["encode"],
        ["plot", "--help"],
        ["verify", "--help"],
        ["report", "--help"],
        ["report", "--fats"],
    ],
)
def test_help_version_list_and_argument_errors_do_not_import_torch(argv):
    done = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.strip() in ("0", "2")


def test_list_reads_the_same_schemes_as_the_registry(capsys):
    import json

    assert main(["list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == json.loads(json.dumps([posenc.describe(n) for n in posenc.schemes()], default=str))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["lst"], "posenc: error: unknown command 'lst'; commands: list, show,"),
        (["show", "sinusoidal", "--dmi", "4"], "unrecognized arguments: --dmi 4; did you mean '--dim'"),
        (["plot", "rope", "--knid", "kernel", "-o", "x.png"], "did you mean '--kind'?"),
        (["plot", "rope", "--kind", "kernl", "-o", "x.png"], "invalid choice: 'kernl' (choose from"),
        (["plot", "rope", "--kind", "kernl", "-o", "x.png"], "did you mean 'kernel'?"),
        (["plot", "rope", "-o", "x.png"], "posenc plot: error: --kind is required for a scheme: one of"),
        (["plot", "rope", "--kind", "kernel"], "plot: error: the following arguments are required: -o"),
        (["show", "rop"], "unknown scheme 'rop'; valid schemes: nope,"),
        (["show", "sinusoidal", "--dim", "x"], "posenc show: error: argument --dim: invalid int value: 'x'"),
    ],
)
def test_argument_errors_are_one_line_with_close_matches(argv, expected, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1, err
    assert "usage:" not in err


def test_plot_usage_lists_the_kinds_and_they_match_the_plots(capsys):
    plots = pytest.importorskip("posenc.analysis.plots")
    from posenc.analysis.commands import PLOT_KIND_NAMES

    assert tuple(plots.PLOT_KINDS) == PLOT_KIND_NAMES
    with pytest.raises(SystemExit):
        main(["plot", "--help"])
    usage = capsys.readouterr().out.split("\n\n")[0]
    assert "--kind {heatmap,waves," in usage and "embeddings --checkpoint PATH" in usage


def test_a_negative_position_needs_no_equals_sign(capsys):
    assert main(["show", "sinusoidal", "--dim", "4", "--positions", "-2:1"]) == 0
    assert "position -2:" in capsys.readouterr().out


def test_verify_prints_a_compact_matrix_and_details_with_verbose(capsys):
    assert (
        main(["verify", "sinusoidal", "alibi", "--property", "translation_inv", "--property", "bounded"]) == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["scheme", "1", "2"]
    assert out[1].split() == ["sinusoidal", "pass", "pass"] and out[2].split() == ["alibi", "pass", "-"]
    assert "1 translation_inv  2 bounded" in out and max(map(len, out)) <= 100
    assert main(["verify", "alibi", "--verbose"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert sum(r.rstrip().endswith('"') for r in rows) >= 3  # a reason repeated for one scheme: once


@pytest.mark.parametrize(
    ("raise_it", "code", "line"),
    [
        (lambda: (_ for _ in ()).throw(KeyboardInterrupt), 130, "posenc list: interrupted; "),
        (
            lambda: __import__("os").kill(__import__("os").getpid(), __import__("signal").SIGTERM),
            143,
            "posenc list: terminated (SIGTERM); ",
        ),
    ],
)
def test_ctrl_c_and_sigterm_end_a_command_with_one_line(raise_it, code, line, monkeypatch, capsys):
    import signal
    import threading
    import time

    import posenc.cli as cli

    if code == 143 and threading.current_thread() is not threading.main_thread():
        pytest.skip("SIGTERM is turned into an exception only in the main thread")

    def run(args):
        raise_it()
        time.sleep(5)  # SIGTERM arrives here (the handler runs between bytecodes)
        return 0

    monkeypatch.setitem(cli.COMMANDS, "list", (*cli.COMMANDS["list"][:2], run))
    before = signal.getsignal(signal.SIGTERM)
    assert main(["list"]) == code
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1 and "Traceback" not in err
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handler is gone again


_FULL = (  # what safetensors raises when the disk is full
    'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
)


@pytest.mark.parametrize("where", ["checkpoint", "json"])
def test_a_full_disk_is_one_line_not_a_traceback(where, tmp_path, monkeypatch, capsys):
    """`train` ended in a SafetensorError traceback when the disk filled up."""
    import errno
    import os

    import safetensors
    import safetensors.torch

    from _lab_toys import text_corpus_in

    (tmp_path / "corpus").mkdir()
    corpus = text_corpus_in(tmp_path / "corpus")
    if where == "checkpoint":

        def full(*args, **kwargs):
            raise safetensors.SafetensorError(_FULL)

        monkeypatch.setattr(safetensors.torch, "save_file", full)
    else:
        real_fsync = os.fsync

        def full_fsync(fd):
            if os.readlink(f"/proc/self/fd/{fd}").endswith(".json.tmp" + str(os.getpid())):
                raise OSError(errno.ENOSPC, "No space left on device")
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", full_fsync)
    out = tmp_path / "run"
    argv = [
        "train",
        "--corpus",
        str(corpus),
        "--out",
        str(out),
        "--steps",
        "2",
        "--train-len",
        "8",
        "--batch-size",
        "2",
        "--d-model",
        "16",
        "--layers",
        "1",
        "--heads",
        "2",
        "--threads",
        "1",
        "--no-progress",
        "--checkpoint-every",
        "1",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("posenc train: error: ") and "o space left on device" in err
    if where == "checkpoint":
        assert str(out / "checkpoint") in err
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]  # no temporary left
