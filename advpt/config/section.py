"""A section of settings: a documented dataclass whose fields are checked against their types.

Each field's ``--help`` text is the docstring written under it (:func:`field_docs`); its declared
type is the check (:func:`checked`): a ``Literal`` admits its choices only, an integer field no
YAML ``yes``, a float field an integer too, a list field a list of its item type, and
``X | None`` also unset. A section adds the constraints between its fields in its ``rules``,
beside them (:func:`at_least` words the commonest). A section may extend another, inheriting its
fields and their docstrings. Nothing here knows flags or run files (``advpt.config.cli``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import sys
import textwrap
import types
import typing
from typing import Any, ClassVar, Literal, get_args, get_origin

from advpt.errors import ConfigError, shorten


class Section:
    """A group of settings. Its fields are flags; its ``rules`` constrain them, beside them.

    :meth:`validate` checks every field against its declared type first (a ``Literal`` against
    its choices), so a config built in code is held to the same choices as one parsed from
    flags, then that its ``REQUIRED`` fields are set, then the section's own rules. A field that
    is itself a section is validated in turn.
    """

    REQUIRED: ClassVar[tuple[str, ...]] = ()
    """The fields that must be given, having no default that could do (a command's --out)."""

    def rules(self) -> list[tuple[bool, str]]:
        """(holds, the sentence if it does not) for each constraint on this section's fields."""
        return []

    def validate(self) -> None:
        """Raise ``ConfigError`` for a value that cannot make a run."""
        for name, kind in field_types(type(self)).items():
            value = getattr(self, name)
            if isinstance(value, Section):
                value.validate()
            else:
                checked(name, value, kind, type(self).__name__)
        missing = [f"--{name}" for name in self.REQUIRED if not getattr(self, name)]
        if missing:
            raise ConfigError(f"the following settings are required: {', '.join(missing)}")
        for ok, message in self.rules():
            if not ok:
                raise ConfigError(message)


def at_least(name: str, value: int | None, least: int) -> tuple[bool, str]:
    """The rule that setting ``name`` is unset or at least ``least``, worded for its flag."""
    return value is None or value >= least, f"--{name} must be at least {least}, not {value}"


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written under it in the source of ``cls`` or of the section
    it extends, one line of prose."""
    docs = {}
    for owner in reversed(cls.__mro__):  # a base's fields first, as dataclasses order them
        if dataclasses.is_dataclass(owner):
            docs |= _own_field_docs(owner)
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    """Field name -> docstring, of the fields written in ``cls``'s own body."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for field_node, doc_node in zip(body, body[1:], strict=False):
        if (
            isinstance(field_node, ast.AnnAssign)
            and isinstance(field_node.target, ast.Name)
            and isinstance(doc_node, ast.Expr)
            and isinstance(doc_node.value, ast.Constant)
            and isinstance(doc_node.value.value, str)
        ):
            docs[field_node.target.id] = " ".join(doc_node.value.value.split())
    return docs


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Field name -> declared type (resolved), in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def unwrap_optional(kind: Any) -> tuple[Any, bool]:
    """(the type inside ``X | None``, True) or (``kind``, False)."""
    if get_origin(kind) in (typing.Union, types.UnionType):
        inner = [a for a in get_args(kind) if a is not type(None)]
        if len(inner) == 1 and len(get_args(kind)) == 2:
            return inner[0], True
    return kind, False


def _describe(kind: Any) -> str:
    kind, optional = unwrap_optional(kind)
    if get_origin(kind) is Literal:
        text = " | ".join(str(a) for a in get_args(kind))
    elif get_origin(kind) is list:
        text = f"a list, each {_describe(get_args(kind)[0])}"
    else:
        names = {bool: "true or false", int: "a 64-bit integer", float: "a finite number"}
        text = {**names, str: "a string"}.get(kind, str(kind))
    return f"{text} or unset" if optional else text


def checked(name: str, value: Any, kind: Any, source: str) -> Any:
    """``value`` as the declared ``kind`` of setting ``name``, or a ``ConfigError``.

    Checked against the declaration, not the current value: a YAML ``yes`` is no integer, and
    an integer is a fine float.
    """
    inner, optional = unwrap_optional(kind)
    if value is None and optional:
        return None
    if get_origin(inner) is Literal:
        ok = isinstance(value, str) and value in get_args(inner)
    elif inner is float:  # finite: no setting means anything by NaN or infinity
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and abs(value) <= sys.float_info.max  # not NaN, infinite or past a float
        value = float(value) if ok else value
    elif inner is int:  # 64 bits: what numpy and torch hold
        ok = isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
    elif get_origin(inner) is list:  # each item checked as the declared item type
        ok = isinstance(value, list)
        if ok:
            try:
                value = [checked(name, item, get_args(inner)[0], source) for item in value]
            except ConfigError:  # the message names the list, not the item
                ok = False
    else:
        ok = isinstance(value, inner)
    if not ok:
        raise ConfigError(
            f"{source}: setting {name!r} must be {_describe(kind)}, got {shorten(value)}"
        )
    return value
