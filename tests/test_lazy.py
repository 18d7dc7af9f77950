"""Tests of posenc._lazy: a package's names load on first use and then stay plain attributes."""

from __future__ import annotations

import subprocess
import sys

import pytest

import posenc
from posenc._lazy import lazy_attributes


def test_names_load_on_first_use_and_are_then_attributes():
    import posenc.text as text

    text.__dict__.pop("load_corpus", None)  # as before first use
    value = text.load_corpus
    assert value.__module__ == "posenc.text.corpus" and text.__dict__["load_corpus"] is value
    assert {"load_corpus", "Tokenizer"} <= set(dir(text))
    assert posenc.analysis.properties.__name__ == "posenc.analysis.properties"  # a submodule
    with pytest.raises(AttributeError, match=r"module 'posenc\.text' has no attribute 'nosuch'"):
        text.nosuch  # noqa: B018


def test_the_lab_keeps_train_the_function_after_its_submodule_loads():
    import posenc.lab as lab
    import posenc.lab.train  # noqa: F401 - the submodule of the same name

    assert callable(lab.train) and lab.train.__module__ == "posenc.lab.train"


def test_importing_the_packages_does_not_import_torch():
    code = "import posenc, posenc.lab, posenc.text, posenc.analysis, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_helper_made_for_any_package():
    getattr_, dir_ = lazy_attributes("posenc", {"build": "registry"}, ("rotary",))
    assert getattr_("build") is posenc.build and "rotary" in dir_()
    with pytest.raises(AttributeError, match="module 'posenc' has no attribute 'x'"):
        getattr_("x")
