"""The built-in schemes' declarations, read from their source files without importing them.

``posenc list`` answers in a fraction of a second because it never imports torch: this module
parses ``registry.py`` (which classes are registered, in which order, from which file) and each
scheme file (each class's ``name``, ``hooks``, ``summary``, ``causal_ok`` and constructor keys)
with :mod:`ast`. The scheme files stay the one place these are written; ``tests/test_catalog.py``
checks that the result equals :func:`posenc.registry.describe` for every built-in scheme.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any

__all__ = ["builtin_schemes"]

_HERE = Path(__file__).parent
_FACTORY_KEYS = ("device", "dtype")
_BASE = {"hooks": (), "summary": "", "causal_ok": True}  # PositionalScheme's class attributes


@functools.cache
def _parse(module: str) -> ast.Module:
    path = _HERE.joinpath(*module.split(".")).with_suffix(".py")  # "rotary.modules" -> rotary/modules.py
    if not path.is_file():
        path = _HERE.joinpath(*module.split("."), "__init__.py")
    return ast.parse(path.read_text(encoding="utf-8"))


def _literal(node: ast.AST | None) -> Any:
    try:
        return ast.literal_eval(node)  # type: ignore[arg-type]
    except (ValueError, TypeError, SyntaxError):
        return ast.unparse(node) if node is not None else None


def _classes(module: str, _seen: tuple[str, ...] = ()) -> dict[str, ast.ClassDef]:
    """The module's own classes, and the classes it imports from its package (a scheme may
    subclass one defined in another file): name -> class definition. ``_seen``: the modules
    being read further up (an import cycle stops there)."""
    tree = _parse(module)
    out = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    package = module.split(".")[:-1]
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level and node.module:
            base = package[: len(package) - node.level + 1]  # "from .x" within rotary/ -> rotary.x
            source = ".".join([*base, node.module])
            wanted = [a.name for a in node.names if a.name[:1].isupper() and not a.name.isupper()]
            if not wanted or source in (*_seen, module):
                continue  # no class names (constants are upper case), or a cycle
            found = _classes(source, (*_seen, module))
            out.update({name: found[name] for name in wanted if name in found and name not in out})
    return out


def _attrs(cls: ast.ClassDef) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for node in cls.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        if isinstance(target, ast.Name) and target.id in ("name", *_BASE) and node.value is not None:
            out[target.id] = _literal(node.value)
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            out["__init__"] = node
    return out


def _keys(init: ast.FunctionDef) -> dict[str, Any]:
    """Constructor keys with their defaults (``...`` marks a required key)."""
    args = init.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [...] * (len(positional) - len(args.defaults)) + [_literal(d) for d in args.defaults]
    keys = dict(zip((a.arg for a in positional), defaults))
    keys.update({a.arg: ... if d is None else _literal(d) for a, d in zip(args.kwonlyargs, args.kw_defaults)})
    return {k: v for k, v in keys.items() if k != "self" and k not in _FACTORY_KEYS}


def builtin_schemes() -> list[dict[str, Any]]:
    """``[{name, hooks, summary, causal, required, optional}]`` for every built-in scheme, in
    registration order: what :func:`posenc.registry.describe` returns, without importing torch."""
    registry = _parse("registry")
    origin: dict[str, str] = {}
    for node in registry.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            origin.update({a.name: node.module for a in node.names})
    order = next(
        [e.id for e in node.value.elts]
        for node in registry.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_BUILTIN"
    )
    parsed: dict[str, dict[str, ast.ClassDef]] = {}
    out = []
    for cls_name in order:
        module = origin[cls_name]
        classes = parsed.setdefault(module, _classes(module))
        chain, cls = [], classes[cls_name]
        while cls is not None:  # the class and its bases within the package, nearest first
            chain.append(_attrs(cls))
            base = next((b.id for b in cls.bases if isinstance(b, ast.Name) and b.id in classes), None)
            cls = classes.get(base) if base else None
        info = {**_BASE}
        for attrs in reversed(chain):
            info.update(attrs)
        keys = _keys(info["__init__"])
        out.append(
            {
                "name": info["name"],
                "hooks": list(info["hooks"]),
                "summary": info["summary"],
                "causal": info["causal_ok"],
                "required": [k for k, v in keys.items() if v is ...],
                "optional": {k: v for k, v in keys.items() if v is not ...},
            }
        )
    return out
