"""Tests of posenc._catalog: the built-in schemes read from source equal the registry's view."""

from __future__ import annotations

import json
import subprocess
import sys

import posenc
from posenc._catalog import builtin_schemes


def test_catalog_equals_describe_for_every_builtin_scheme():
    rows = builtin_schemes()
    assert [r["name"] for r in rows] == posenc.schemes()
    for row in rows:
        want = posenc.describe(row["name"])
        assert json.dumps(row, default=str, sort_keys=True) == json.dumps(want, default=str, sort_keys=True)


def test_catalog_imports_no_torch():
    code = "import sys; from posenc._catalog import builtin_schemes as b; b(); print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    )
