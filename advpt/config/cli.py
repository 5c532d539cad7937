"""The command line and run files of a settings root (``TrainConfig``, ``ScoreConfig``, ...).

A root holds sections (``advpt.config.section``) and settings of its own. Each field is a flag of
the same name (``--max_length 256``; a list field takes one or more values, ``--layers 0 3``)
whose ``--help`` text is the docstring under the field, but for the fields the root names in its
``POSITIONALS``, which are positional arguments in that order (``MODEL``; a list field one or
more, ``RUN_DIR [RUN_DIR ...]``); a JSON or YAML run file given with ``--config`` may set the
same names, flat or grouped by section (``masking: {random_rate: 0.1}``); flags win over the file.
:func:`parse` gives the root's defaults, then the file's values, then the flags', each checked
against its declared type, and then the root validated as a whole. Every argparse parser of
advpt's commands is built here; the scripts' parsers take :data:`positive` and
:data:`non_negative` numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

from advpt import ds_configs
from advpt.command import DEBUG_HELP
from advpt.config.section import Section, checked, field_docs, field_types, unwrap_optional
from advpt.errors import ConfigError, shorten

Root = TypeVar("Root", bound=Section)


@dataclass(frozen=True)
class _Setting:
    """One settable field: the object that holds it (a section or the root) and its type."""

    section: str  # "" for the root's own fields
    name: str
    kind: Any  # the declared type, resolved
    default: Any
    help: str


def _settings(root: type) -> dict[str, _Setting]:
    """Flag name -> setting, for the root's plain fields and its sections' fields.

    Names are unique across sections and differ from the section names, so flags and flat run
    files need no prefixes, and a run file's key is either a section or a setting.
    """
    defaults = root()
    out: dict[str, _Setting] = {}
    for name, kind in field_types(root).items():
        if isinstance(getattr(defaults, name), Section):
            docs = field_docs(kind)
            for sub, sub_kind in field_types(kind).items():
                value = getattr(getattr(defaults, name), sub)
                out[sub] = _Setting(name, sub, sub_kind, value, docs.get(sub, ""))
        else:
            value = getattr(defaults, name)
            out[name] = _Setting("", name, kind, value, field_docs(root).get(name, ""))
    return out


TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
"""What a true/false flag's value may be (any case); a bare flag is true."""


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_args(parser: argparse.ArgumentParser, root: type, argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed, a bare true/false flag before a positional read as bare
    (:func:`_bare_flags_stay_bare`) where that parses; otherwise as argparse reads it, so that a
    value that is no true/false word (``--no_plots maybe``) gets argparse's sentence."""
    bare = _bare_flags_stay_bare(root, argv)
    if bare != argv and not {"-h", "--help"} & set(argv):
        with contextlib.suppress(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            return parser.parse_args(bare)
    return parser.parse_args(argv)


def _bare_flags_stay_bare(root: type, argv: list[str]) -> list[str]:
    """``argv`` with ``true`` given to each true/false flag of ``root`` written bare before a
    positional argument (``advpt embed --per_residue MODEL INPUT``), which argparse would
    otherwise take for the flag's value; a word that is a true/false value stays the flag's."""
    if not getattr(root, "POSITIONALS", ()):
        return argv
    bools = {f"--{s.name}" for s in _settings(root).values() if unwrap_optional(s.kind)[0] is bool}
    out = []
    for token, after in zip(argv, [*argv[1:], None], strict=True):
        out.append(token)
        positional = after is not None and not after.startswith("-")
        if token in bools and positional and after.lower() not in TRUE_WORDS + FALSE_WORDS:
            out.append("true")
    return out


def _whole_number_from(least: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number from ``least``, else argparse's one sentence naming
    the flag (``argument --steps: must be at least 1, not 0``) and exit code 2, before any
    work."""

    def whole_number(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, not {value}")
        return value

    return whole_number


positive = _whole_number_from(1)
"""The ``type`` of a script's flag that takes a whole number from 1."""
non_negative = _whole_number_from(0)
"""The ``type`` of a script's flag that takes a whole number from 0."""


def _value_kwargs(kind: Any) -> dict[str, Any]:
    """How argparse reads one value of the declared ``kind``."""
    if kind is bool:
        return {"type": _parse_bool, "metavar": "BOOL"}
    if get_origin(kind) is Literal:  # checked by `checked`, so the message is the run file's
        return {"metavar": "{" + ",".join(get_args(kind)) + "}"}
    return {"type": kind}


def _flag_kwargs(setting: _Setting, required: bool) -> dict[str, Any]:
    """argparse arguments of one setting; values stay unset (None) unless given. A ``required``
    one may come from a run file too, so its absence is the root's to refuse."""
    kind, _ = unwrap_optional(setting.kind)
    default = "unset" if setting.default is None else setting.default
    said = "required" if required else f"default: {default}"
    text = f"{setting.help} [{said}]".replace("%", "%%")  # argparse %-formats help
    kwargs: dict[str, Any] = {"default": None, "help": text}
    if kind is bool:  # a bare --flag means true
        return kwargs | _value_kwargs(bool) | {"nargs": "?", "const": True}
    if get_origin(kind) is list:  # one or more values
        return kwargs | _value_kwargs(get_args(kind)[0]) | {"nargs": "+"}
    return kwargs | _value_kwargs(kind)


def _positional_kwargs(setting: _Setting) -> dict[str, Any]:
    """argparse arguments of a positional setting: one value, or one or more for a list."""
    many = get_origin(setting.kind) is list
    value = _value_kwargs(get_args(setting.kind)[0] if many else setting.kind)
    text = setting.help.replace("%", "%%")
    return value | {"nargs": "+" if many else None, "metavar": setting.name.upper(), "help": text}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Wraps help lines without splitting names such as gpu-bf16 at their hyphens."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _PrintDsConfig(argparse.Action):
    """``--print_ds_config ROLE/NAME``: print that shipped JSON as it is, then exit 0."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(ds_configs.text(values), end="")
        parser.exit()


def build_parser(root: type, prog: str | None = None) -> argparse.ArgumentParser:
    """A parser with one flag per setting of ``root``, grouped by section, help from the docs;
    ``prog`` names the command in its usage (``advpt score``)."""
    parser = argparse.ArgumentParser(
        prog=prog, description=inspect.getdoc(root), formatter_class=_HelpFormatter
    )
    settings = _settings(root)
    parser.add_argument("--config", help="JSON or YAML run file of these settings (flags win)")
    parser.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    if "deepspeed_config" in settings:  # the commands that run DeepSpeed engines
        parser.add_argument(
            "--print_ds_config",
            action=_PrintDsConfig,
            default=argparse.SUPPRESS,
            metavar="ROLE/NAME",
            help="print a DeepSpeed JSON shipped with advpt, to copy and edit, and exit: "
            + ", ".join(ds_configs.specs()),
        )
    recipes = getattr(root, "RECIPES", {})
    if recipes:
        parser.add_argument(
            "--recipe",
            choices=list(recipes),
            help="start from a recipe (advpt.recipes; recommended is the one "
            "docs/study.md's evidence picks): its flags, which a run file and flags override",
        )
    positionals = getattr(root, "POSITIONALS", ())
    for name in positionals:
        parser.add_argument(name, **_positional_kwargs(settings[name]))
    groups: dict[str, Any] = {"": parser}
    for setting in settings.values():
        if setting.name in positionals:
            continue
        owner = field_types(root)[setting.section] if setting.section else root
        if setting.section not in groups:
            groups[setting.section] = parser.add_argument_group(
                f"{setting.section} settings", inspect.getdoc(owner)
            )
        required = setting.name in owner.REQUIRED
        groups[setting.section].add_argument(f"--{setting.name}", **_flag_kwargs(setting, required))
    return parser


def _read_run_file(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"run file {path} does not exist")
    try:
        text = file.read_text()
        content = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"run file {path} cannot be read: {exc}") from None
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        reason = " ".join(str(exc).split())
        raise ConfigError(f"run file {path} is not valid JSON/YAML: {reason}") from None
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise ConfigError(f"run file {path} must hold a mapping of settings")
    return content


OLD_SECTIONS = ("data", "schedule")
"""Section names of earlier run files (and of their runs' config.json), still read: a mapping
under ``data`` or ``schedule`` is a section. These two alone are also settings (--data,
--schedule), so only for them does the kind of value decide."""


def _apply(config: Any, values: dict[str, Any], source: str) -> None:
    """Set ``values`` (flat, or grouped under section names) on ``config``, each type-checked."""
    settings = _settings(type(config))
    sections = {s.section for s in settings.values()} - {""}
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if key in sections and not isinstance(value, dict):
            raise ConfigError(
                f"{source}: section {key!r} must hold a mapping of settings, got {shorten(value)}"
            )
        if key in sections or (key in OLD_SECTIONS and isinstance(value, dict)):
            flat.update(value)
        else:
            flat[key] = value
    for name, value in flat.items():
        if name not in settings:
            close = [o for o in settings if o.startswith(str(name)[:4])]
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{source}: unknown setting {shorten(name)}{hint}")
        setting = settings[name]
        owner = getattr(config, setting.section) if setting.section else config
        setattr(owner, name, checked(name, value, setting.kind, source))


def parse(root: type[Root], argv: list[str] | None = None, prog: str | None = None) -> Root:
    """Defaults of ``root``, then the run file, then the flags; validated. ``prog``: as
    :func:`build_parser`'s."""
    parser = build_parser(root, prog)
    args = _parse_args(parser, root, sys.argv[1:] if argv is None else argv)
    config = root()
    if getattr(args, "recipe", None):
        named = vars(parser.parse_args(root.RECIPES[args.recipe]))
        values = {k: v for k, v in named.items() if v is not None and k in _settings(root)}
        _apply(config, values, f"recipe {args.recipe}")
    if args.config:
        _apply(config, _read_run_file(args.config), f"run file {args.config}")
    flags = {
        name: value
        for name, value in vars(args).items()
        if value is not None and name not in ("config", "local_rank", "debug", "recipe")
    }
    _apply(config, flags, "command line")
    config.validate()
    return config
