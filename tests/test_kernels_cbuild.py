"""Tests of posenc.kernels._cbuild: C kernels built once, cached, and rebuilt when the cache is corrupt."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from posenc.kernels import _cbuild

SOURCE = "int posenc_test_answer(void) { return 42; }\n"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_KERNEL_CACHE", str(tmp_path))
    if _cbuild._compiler() is None:
        pytest.skip("no C compiler")
    return tmp_path


def test_builds_once_and_reuses_the_cached_library(cache):
    lib = _cbuild._build("posenc_test", SOURCE)
    assert lib is not None and lib.posenc_test_answer() == 42
    (built,) = list(cache.glob("posenc_test-*.so"))
    stamp = built.stat().st_mtime_ns
    assert _cbuild._build("posenc_test", SOURCE).posenc_test_answer() == 42
    assert built.stat().st_mtime_ns == stamp  # not compiled again


def _answer_in_a_new_process(cache) -> str:
    code = (
        "from posenc.kernels import _cbuild\n"
        f"print(_cbuild._build('posenc_test', {SOURCE!r}).posenc_test_answer())"
    )
    env = {**os.environ, "POSENC_KERNEL_CACHE": str(cache)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()


def test_a_corrupt_cached_library_is_rebuilt(cache):
    """Each process loads the cached library; one left corrupt (a disk that filled up, a killed
    copy) is deleted and built again instead of leaving the kernel off for good."""
    assert _answer_in_a_new_process(cache) == "42"
    (built,) = list(cache.glob("posenc_test-*.so"))
    garbage = cache / "garbage"
    garbage.write_bytes(b"not an ELF file")
    os.replace(garbage, built)  # a new file under the cached name (a loaded library is never written)
    assert _answer_in_a_new_process(cache) == "42"
    assert built.read_bytes()[:4] == b"\x7fELF"


def test_status_names_why_a_kernel_is_off(monkeypatch):
    from posenc.kernels import set_enabled

    monkeypatch.setenv("POSENC_C_KERNELS", "0")
    assert _cbuild.status("anything") == "disabled"
    monkeypatch.setenv("POSENC_C_KERNELS", "1")
    set_enabled(None)  # the variable is read once: read it again
    assert _cbuild.status("never_built_kernel") == "not built yet"


def test_source_inlines_the_csrc_files_a_kernel_includes():
    files = {
        "k.c": '#include <stdint.h>\n#if X\n#include "k_simd.c"\n#endif\nint f(void);\n',
        "k_simd.c": "int g(void);\n",
    }
    assert (
        _cbuild.source("k", files.__getitem__)
        == "#include <stdint.h>\n#if X\nint g(void);\n#endif\nint f(void);\n"
    )
    rope = _cbuild.source("rope_cpu")  # the shipped kernel: its per-instruction-set loops inlined
    assert '#include "' not in rope and "body2_once_half" in rope and "body_bf16_half" in rope


def test_a_cached_library_without_the_kernels_functions_is_rebuilt(cache):
    """A cached file that loads but lacks the functions (another build's, a stale one) raised
    AttributeError in every later process and was never rebuilt."""
    assert _answer_in_a_new_process(cache) == "42"
    (built,) = list(cache.glob("posenc_test-*.so"))
    other = cache / "other.c"
    other.write_text("int posenc_something_else(void) { return 7; }\n")
    cc = _cbuild._compiler()
    subprocess.run([cc, "-shared", "-fPIC", str(other), "-o", str(cache / "other.so")], check=True)
    os.replace(cache / "other.so", built)
    assert _answer_in_a_new_process(cache) == "42"
    assert _cbuild.exported(SOURCE) == ["posenc_test_answer"]


def test_the_build_folders_of_killed_builds_are_removed(cache):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = cache / f".build-{dead.pid}-abc123"
    left.mkdir()
    (left / "rope_cpu.c").write_text("half a build")
    mine = cache / f".build-{os.getpid()}-def456"  # a live process's build: kept
    mine.mkdir()
    assert _cbuild._build("posenc_test", SOURCE).posenc_test_answer() == 42
    assert not left.exists() and mine.exists()
    assert [p.name for p in cache.iterdir() if p.name.startswith(".build-")] == [mine.name]


def test_status_says_the_build_failed_when_the_cache_is_not_writable(tmp_path, monkeypatch):
    """An unwritable cache was reported as "no compiler"."""
    if _cbuild._compiler() is None:
        pytest.skip("no C compiler")
    blocked = tmp_path / "a_file"
    blocked.write_text("the cache path is a file")
    monkeypatch.setenv("POSENC_KERNEL_CACHE", str(blocked / "kernels"))
    monkeypatch.setattr(_cbuild, "_loaded", {})
    with pytest.warns(RuntimeWarning):
        assert _cbuild.load("posenc_test", SOURCE) is None
    assert _cbuild.status("posenc_test").startswith("build failed (")
