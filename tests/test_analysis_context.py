"""Tests of posenc.analysis.context: DEFAULT_CONTEXT holds the sizes analysis builds schemes with,
is the one object the analysis modules share, and importing it does not import torch (``posenc
report --help`` reads it)."""

from __future__ import annotations

import subprocess
import sys

from posenc.analysis.context import DEFAULT_CONTEXT


def test_default_context_keys_and_types():
    assert set(DEFAULT_CONTEXT) == {"d_model", "num_heads", "head_dim", "max_len", "causal"}
    assert DEFAULT_CONTEXT["causal"] is False
    for key in ("d_model", "num_heads", "head_dim", "max_len"):
        value = DEFAULT_CONTEXT[key]
        assert type(value) is int and value > 0, key
    assert DEFAULT_CONTEXT["head_dim"] % 2 == 0  # rotary schemes pair dimensions


def test_the_analysis_modules_share_one_default_context():
    import posenc.analysis
    from posenc.analysis import kernel

    assert posenc.analysis.DEFAULT_CONTEXT is DEFAULT_CONTEXT and kernel.DEFAULT_CONTEXT is DEFAULT_CONTEXT


def test_importing_the_context_does_not_import_torch():
    code = (
        "import sys\n"
        "from posenc.analysis.context import DEFAULT_CONTEXT\n"
        "assert DEFAULT_CONTEXT['max_len'] > 0\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
