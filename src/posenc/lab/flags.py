"""Command-line flags generated from configuration dataclasses: one place to add a field.

A field of :class:`~posenc.lab.config.TrainConfig`, :class:`~posenc.lab.config.CorpusConfig`,
:class:`~posenc.lab.config.StudyConfig` or :class:`~posenc.model.ModelConfig` is a flag of the
commands that take it: ``--name-with-dashes``, its help the field's entry in its class docstring's
``Args`` table, its default the command's own configuration (stated once, in the dataclass), its
value parsed by the field's type. A field may rename its flag or add choices through
``dataclasses.field(metadata={"flag": ..., "aliases": ..., "choices": ..., "metavar": ...,
"const": ..., "empty": ...})``.

:class:`~posenc.model.ModelConfig` is read from its source file (``ast``, no import), so building
the parser of ``posenc extrapolate --help`` does not import torch.

Legend: ``F`` a field.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "FieldSpec",
    "add_field_flags",
    "field_docs",
    "field_specs",
    "given_fields",
    "parse_list",
    "shown",
    "source_field_specs",
]


@dataclass(frozen=True)
class FieldSpec:
    """One dataclass field as the command line sees it.

    Attributes:
        name: the field's name.
        type: its annotation, as text (``"int | None"``).
        default: its default (``dataclasses.MISSING`` when it has none).
        doc: its entry in the class docstring's ``Args`` table.
        metadata: its ``dataclasses.field`` metadata (flag name, aliases, choices, ...).
    """

    name: str
    type: str
    default: Any
    doc: str
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def flag(self) -> str:
        return self.metadata.get("flag") or "--" + self.name.replace("_", "-")


def field_docs(doc: str | None) -> dict[str, str]:
    """``{field: text}`` from a Google-style docstring's ``Args:`` sections (an entry ``a, b: text``
    documents both), markup removed (``:class:`~x.Y``` -> ``Y``, ````x```` -> ``x``)."""
    out: dict[str, str] = {}
    lines = (doc or "").expandtabs().splitlines()
    in_args, indent, names = False, 0, []
    for line in lines:
        stripped = line.strip()
        if stripped == "Args:":
            in_args, indent, names = True, 0, []
            continue
        if not in_args:
            continue
        if not stripped:
            continue
        depth = len(line) - len(line.lstrip())
        entry = re.match(r"([A-Za-z_][A-Za-z0-9_]*(?:, [A-Za-z_][A-Za-z0-9_]*)*):(\s|$)(.*)", stripped)
        if entry and (not indent or depth == indent):
            indent = depth
            names = entry.group(1).split(", ")
            for name in names:
                out[name] = entry.group(3).strip()
        elif names and depth > indent:
            for name in names:
                out[name] = f"{out[name]} {stripped}".strip()
        else:
            in_args = False
    return {k: _plain(v) for k, v in out.items()}


def _plain(text: str) -> str:
    text = re.sub(r":\w+:`~?(?:[\w.]+\.)?([^`]+)`", r"\1", text)
    return text.replace("``", "").replace("%", "%%")  # argparse formats help with %


def field_specs(cls: type, skip: Iterable[str] = ()) -> list[FieldSpec]:
    """The :class:`FieldSpec` of every field of dataclass ``cls`` but ``skip`` (whose default
    factories are not called); docs from the ``Args`` tables of ``cls`` and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's table adds to (or rewords) its bases'
        docs.update(field_docs(klass.__doc__))
    specs = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = f.default
        if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        specs.append(FieldSpec(f.name, str(f.type), default, docs.get(f.name, ""), dict(f.metadata)))
    return specs


def source_field_specs(path: str | Path, class_name: str) -> list[FieldSpec]:
    """The :class:`FieldSpec` of every field of dataclass ``class_name`` in the source file
    ``path``, read with ``ast`` (nothing imported); defaults that are not literals are ``MISSING``."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name)
    docs = field_docs(ast.get_docstring(node))
    specs = []
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        try:
            default = dataclasses.MISSING if stmt.value is None else ast.literal_eval(stmt.value)
        except ValueError:  # field(default_factory=...), a call: no literal default
            default = dataclasses.MISSING
        name = stmt.target.id
        specs.append(FieldSpec(name, ast.unparse(stmt.annotation), default, docs.get(name, "")))
    return specs


# ----------------------------------------------------------------------------------------------
# Values
# ----------------------------------------------------------------------------------------------
def parse_list(spec: str, kind: type = str, *, flag: str) -> tuple:
    """``"a,b,c"`` -> ``("a", "b", "c")`` (converted with ``kind``); a clear error naming ``flag``."""
    items = [x.strip() for x in spec.split(",") if x.strip()]
    if not items:
        example = "128,256" if kind is int else "a,b"
        raise ValueError(f"{flag} {spec!r} is empty; give a comma list like {example}")
    try:
        return tuple(kind(x) for x in items)
    except ValueError:
        raise ValueError(f"{flag} {spec!r} is not a comma list of {kind.__name__}s (e.g. 128,256)") from None


_SCALARS: dict[str, type] = {"int": int, "float": float, "str": str}


def _kinds(spec: FieldSpec) -> tuple[str, bool]:
    """``(the type without None, whether None is allowed)``, as text without spaces."""
    parts = [p for p in spec.type.replace(" ", "").split("|") if p != "None"]
    return "|".join(parts), "None" in spec.type.replace(" ", "").split("|")


def _argparse_type(spec: FieldSpec) -> Callable[[str], Any] | None:
    """The ``type=`` of a flag that argparse itself converts (a plain int, float or str field)."""
    base, optional = _kinds(spec)
    return None if optional else _SCALARS.get(base)


def _convert(spec: FieldSpec, text: str) -> Any:
    """A flag's text as the field's value (for the fields argparse does not convert)."""
    from .grid import parse_value

    base, optional = _kinds(spec)
    if optional and text.strip().lower() in ("none", "null"):
        return None
    if base.startswith("tuple["):
        if "empty" in spec.metadata and text.strip() == spec.metadata["empty"]:
            return ()
        kind = _SCALARS.get(base[len("tuple[") :].split(",")[0].rstrip("]"), str)
        return parse_list(text, kind, flag=spec.flag)
    if base in _SCALARS:
        try:
            return _SCALARS[base](text)
        except ValueError:
            what = {"int": "an integer", "float": "a number"}.get(base, f"a {base}")
            raise ValueError(f"{spec.flag} {text!r} is not {what} (or none)") from None
    if base == "bool":
        low = text.strip().lower()
        if low not in ("true", "false", "yes", "no", "1", "0"):
            raise ValueError(f"{spec.flag} {text!r} is not true or false")
        return low in ("true", "yes", "1")
    return parse_value(text)  # a union or a container: JSON when it parses, else the text


def shown(value: Any) -> str:
    """``value`` as a flag would spell it: ``1,2``, ``none``, ``true``."""
    if isinstance(value, (tuple, list)):
        return ",".join(map(shown, value)) if value else "none"
    if isinstance(value, bool):
        return str(value).lower()
    return "none" if value is None else str(value)


def add_field_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    specs: Iterable[FieldSpec],
    dest: str,
    defaults: Mapping[str, Any],
    *,
    skip: Iterable[str] = (),
    names: Mapping[str, str] | None = None,
    notes: Mapping[str, str] | None = None,
) -> None:
    """A flag per field of ``specs`` (but ``skip``): destination ``DEST__FIELD``, no default of its
    own (a flag not given is absent, so the configuration's default stands), help = the field's
    doc plus ``(default X)`` from ``defaults`` (``{field: value}``, the command's configuration) and
    ``notes[field]``. ``names`` renames flags (``{"num_layers": "--layers"}``); the generated name
    stays as an alias."""
    skip, names, notes = set(skip), dict(names or {}), dict(notes or {})
    for spec in specs:
        if spec.name in skip:
            continue
        strings = [names[spec.name]] if spec.name in names else []
        strings += [s for s in (spec.flag, *spec.metadata.get("aliases", ())) if s not in strings]
        default = defaults.get(spec.name, spec.default)
        note = notes.get(spec.name, "")
        said = "" if default is dataclasses.MISSING else f" (default {shown(default)}{note})"
        kwargs: dict[str, Any] = {
            "dest": f"{dest}__{spec.name}",
            "default": argparse.SUPPRESS,
            "help": (spec.doc or spec.name.replace("_", " ")) + said,
        }
        if "choices" in spec.metadata:
            kwargs["choices"] = list(spec.metadata["choices"])
        if "choices" not in spec.metadata:
            kwargs["metavar"] = spec.metadata.get("metavar", spec.name.upper())
        if "const" in spec.metadata:
            kwargs.update(nargs="?", const=spec.metadata["const"])
            kwargs["help"] += f"; {strings[0]} alone: {spec.metadata['const']}"
        kind = _argparse_type(spec)
        if kind is not None:
            kwargs["type"] = kind
        parser.add_argument(*strings, **kwargs)


def given_fields(args: argparse.Namespace, dest: str, specs: Iterable[FieldSpec]) -> dict[str, Any]:
    """``{field: value}`` of the flags of ``dest`` given on the command line, converted by type."""
    out = {}
    for spec in specs:
        key = f"{dest}__{spec.name}"
        if hasattr(args, key):
            value = getattr(args, key)
            converted = isinstance(value, str) and _argparse_type(spec) is None
            out[spec.name] = _convert(spec, value) if converted else value
    return out
