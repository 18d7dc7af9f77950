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


def test_write_text_replaces_the_file_with_ordinary_permissions_and_leaves_no_temporary(
    tmp_path, monkeypatch
):
    """What a user opens (the report's index.html, results.json) is written whole or not at all, with
    the permissions any new file gets (a temporary file from mkstemp would leave it 0600), and never
    through a link planted at the temporary name."""
    import os

    from posenc import _paths

    target = tmp_path / "index.html"
    target.write_text("old", encoding="utf-8")
    old_mask = os.umask(0o022)
    try:
        _paths.write_text(target, "new é")
    finally:
        os.umask(old_mask)
    assert target.read_text(encoding="utf-8") == "new é"
    assert target.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["index.html"]

    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.write_text("theirs")
    (tmp_path / f".index.html.tmp{os.getpid()}").symlink_to(outside)  # a link left at the temporary name
    _paths.write_text(target, "again")
    assert outside.read_text() == "theirs" and target.read_text() == "again"

    def broken(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(_paths.os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        _paths.write_text(target, "half")
    assert target.read_text(encoding="utf-8") == "again"  # the old file stays whole
    assert [p.name for p in tmp_path.iterdir()] == ["index.html"]
