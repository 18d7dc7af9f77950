"""Tests of posenc._paths: output files checked before any work."""

from __future__ import annotations

import pytest

from posenc._paths import check_output_file


def test_check_output_file(tmp_path):
    existing = tmp_path / "old.png"
    existing.write_bytes(b"x")
    assert check_output_file(existing) == existing  # replaced, as -o does everywhere
    assert check_output_file(tmp_path / "new" / "deeper" / "x.json") == tmp_path / "new" / "deeper" / "x.json"
    with pytest.raises(ValueError, match=r"--out '.*' is a folder; give a file name, e.g. '.*out.json'"):
        check_output_file(tmp_path)
    with pytest.raises(ValueError, match=r"-o '.*old.png/x.png' lies under the file '.*old.png'"):
        check_output_file(existing / "x.png", "-o")
