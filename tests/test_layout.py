"""The code's shape, checked: imports go one way (no cycle, never from a lower layer to a higher one),
every long file and function is listed with its reason, and no module outside a scheme's own file
and the registry tells schemes apart by name. Read with :mod:`ast`; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "posenc"

#: Lower layers first; a module may import its own layer and the ones before it. Function-level
#: imports count too (a late import is still a dependency).
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "posenc._validate",
        "posenc._paths",
        "posenc._alloc",
        "posenc._precision",
        "posenc._catalog",
        "posenc._lazy",
        "posenc._threads",
        "posenc.positions",
        "posenc.kernels",
    ),
    (
        "posenc.base",
        "posenc.absolute",
        "posenc.absolute_nd",
        "posenc.rotary",
        "posenc.bias",
        "posenc.relative",
        "posenc.fire",
        "posenc.kerple",
        "posenc.cope",
        "posenc.temperature",
        "posenc.registry",
    ),
    ("posenc.embedding", "posenc.vectors"),
    ("posenc.model",),
    ("posenc.text",),
    ("posenc.lab",),
    ("posenc.analysis", "posenc.benchmarks"),
    ("posenc.cli", "posenc.__main__"),
)

#: Files past 500 lines, each with the reason. A length is a smell to look at, never a limit to cut
#: to: a file is split where it holds two concepts, and otherwise stays whole and listed here.
LONG_FILES: dict[str, str] = {
    "model/transformer.py": "two model classes (decoder-only, encoder-decoder) with their shared "
    "HF-style habits; generation (sampling, stopping) is a concept of its own, to move out",
    "lab/config.py": "the lab's configuration dataclasses (training, corpus, run, study) and their "
    "composition by field name; presets",
    "rotary/modules.py": "RotaryEmbedding: one module with its tables, kept rows and evaluation variants",
    "lab/checkpoint.py": "the training checkpoint: one folder written and swapped in whole, read back "
    "with every field checked",
    "analysis/kernel.py": "the positional kernel of every hook (embed, rotate, queries, score_bias) and "
    "its views (encodings, frequencies, curves), with the probe that feeds each hook the form its "
    "scheme declares; the probe (Probe, make_probe, rotate_rows, query_rows) could be a file of its own",
}

#: Functions allowed past 60 lines (body and docstring), with the reason.
LONG_FUNCTIONS: dict[str, str] = {
    "benchmarks/rope.py:_case": "one benchmark table: each peer configured and checked in line",
    "lab/checkpoint.py:load_checkpoint": "public entry point: each part of the trainer state checked "
    "and restored in turn",
    "benchmarks/bias.py:_case": "one benchmark table: each path configured and checked in line",
    "benchmarks/rope.py:_module_impls": "the module peers of one table, each configured in line",
    "benchmarks/sinusoidal.py:_embed_case": "one benchmark table: each peer configured and checked in line",
    "benchmarks/train_step.py:_case": "one benchmark table: each peer configured and checked in line",
    "lab/train.py:train": "public entry point: 47 lines of docstring (14 arguments), a 50-line body",
    "kernels/_rope_triton_jit.py:rope_pair_kernel": "a Triton kernel: one compiled function",
    "lab/plot.py:plot_study": "one figure, three panels",
    "text/pipeline.py:format_pipeline": "one printed table per step",
    "rotary/hf.py:hf_rope_config": "one case per Hugging Face config generation",
    "text/projection.py:plot_embedding_space": "one figure",
    "model/config.py:__post_init__": "one check per field",
    "bias.py:t5_relative_bucket": "T5's bucket formula with its argument checks, as in the paper's code",
    "kernels/_rope_triton_jit.py:_rows": "a Triton kernel body: one compiled function",
    "benchmarks/embedding.py:_case": "one benchmark table: each implementation set up and checked in line",
    "analysis/interactive.py:overview_figure": "one figure: a panel per scheme and its layout",
    "analysis/lessons.py:worked_example": "one worked example, each hook's numbers in turn",
    "analysis/sections.py:study_section": "one section: the two tables of a study and its figure",
    "analysis/report.py:build_report": "public entry point: 18 lines of docstring, then the build's steps",
    "lab/commands.py:extrapolate_run": "the command's steps in order (train, evaluate, print, write, plot)",
    "lab/evalset.py:sample_eval_set": "20 lines of docstring; the document cap and the near-duplicate "
    "drop are two concepts to cut apart",
    "lab/evaluate.py:evaluate_task": "15 lines of docstring; generation and scoring in one pass",
    "lab/tables.py:format_table": "one printed table per measure, each a call to a table helper",
    "lab/probe.py:repeated_string_probe": "13 lines of docstring; the probe and its paired control",
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every posenc module ``name`` imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            targets = [
                f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names
            ]
        else:
            continue
        out |= {t for t in targets if t in MODULES and t != name}
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(name: str) -> int | None:
    found = None
    for i, group in enumerate(LAYERS):
        if any(name == g or name.startswith(g + ".") for g in group):
            found = i
    return found


def test_every_module_has_a_layer():
    assert [m for m in MODULES if m != "posenc" and _layer(m) is None] == []


def test_no_import_goes_up_a_layer():
    up = [
        f"{m} -> {d}"
        for m, deps in GRAPH.items()
        for d in deps
        if _layer(m) is not None and _layer(d) is not None and _layer(d) > _layer(m)
    ]
    assert up == []


def test_no_import_cycle():
    """Tarjan's strongly connected components: any component of two or more modules is a cycle."""
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert cycles == []


def _rel(path: Path) -> str:
    return path.relative_to(PKG).as_posix()


def test_files_stay_under_500_lines():
    long = {_rel(p): n for p in MODULES.values() if (n := len(p.read_text().splitlines())) > 500}
    assert set(long) <= set(LONG_FILES), {k: v for k, v in long.items() if k not in LONG_FILES}
    stale = set(LONG_FILES) - set(long)
    assert not stale, f"remove from LONG_FILES (now short): {stale}"


def test_functions_stay_under_60_lines():
    long = set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.end_lineno - node.lineno >= 60
            ):
                long.add(f"{_rel(path)}:{node.name}")
    assert long <= set(LONG_FUNCTIONS), sorted(long - set(LONG_FUNCTIONS))
    stale = set(LONG_FUNCTIONS) - long
    assert not stale, f"remove from LONG_FUNCTIONS (now short): {sorted(stale)}"


def _scheme_names() -> set[str]:
    names = set()
    for path in PKG.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    is_name = isinstance(stmt, ast.Assign) and getattr(stmt.targets[0], "id", "") == "name"
                    if is_name and isinstance(stmt.value, ast.Constant) and stmt.value.value != "base":
                        names.add(stmt.value.value)
    for path in (PKG / "rotary").glob("*.py"):
        names |= {
            stmt.value.value
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.ClassDef)
            for stmt in node.body
            if isinstance(stmt, ast.Assign) and getattr(stmt.targets[0], "id", "") == "name"
        }
    return names


#: Where scheme names may be compared: the schemes' own files and the registry; the benchmarks
#: (their peers are other libraries' implementations of one named scheme).
NAME_OK = ("absolute.py", "bias.py", "relative.py", "rotary/", "registry.py", "_catalog.py", "benchmarks/")


def test_no_module_compares_scheme_names_outside_the_schemes():
    names = _scheme_names()
    assert {"sinusoidal", "rope", "alibi", "t5", "learned"} <= names
    found = []
    for path in MODULES.values():
        if _rel(path).startswith(NAME_OK):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            parts = [node.left, *node.comparators]
            values = [p.value for p in parts if isinstance(p, ast.Constant)]
            values += [
                e.value
                for p in parts
                if isinstance(p, (ast.Tuple, ast.List, ast.Set))
                for e in p.elts
                if isinstance(e, ast.Constant)
            ]
            if any(isinstance(v, str) and v in names for v in values):
                found.append(f"{_rel(path)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_ruff_check_and_format_are_clean():
    """The CI's style gate: `ruff check` and `ruff format --check` over src and tests."""
    import shutil
    import subprocess
    import sys

    import pytest

    if (
        shutil.which("ruff") is None
        and subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True).returncode != 0
    ):
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    root = SRC.parent
    for args in (["check", "src", "tests"], ["format", "--check", "src", "tests"]):
        done = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=root, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-500:]


#: Private names a lab module imports from outside the lab, each with its reason (none from the lab).
LAB_PRIVATE_IMPORTS: dict[str, str] = {}


def test_lab_modules_import_no_private_names():
    """A lab module imports another module's public names only (``from .cells import _record`` is
    how a file cut at a line count shows: the concept it needs lives elsewhere)."""
    found = set()
    for name, path in MODULES.items():
        if not name.startswith("posenc.lab"):
            continue
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
                continue
            base = package.split(".")
            if node.level:
                base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, node.module] if node.module else base) if node.level else node.module
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.endswith("__")
                if private and f"{source}.{alias.name}" not in MODULES:
                    found.add(f"{_rel(path)}: {source}.{alias.name}")
    assert found == set(LAB_PRIVATE_IMPORTS), sorted(found ^ set(LAB_PRIVATE_IMPORTS))


def test_no_formatter_skips():
    """No line of posenc is kept from the formatter: joining lines to meet a size hides a size."""
    marked = [_rel(p) for p in MODULES.values() if "# fmt: skip" in p.read_text(encoding="utf-8")]
    assert not marked, marked
