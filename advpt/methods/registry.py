"""Finding the run's masking method: a built-in, a registered one, an entry point or a file.

``--masking_method`` (``MethodConfig.masking_method``) names it; empty is the built-in that
``--mode``, ``--schedule`` and ``--estimator`` name (:func:`builtin_name`), so that old run
files, checkpoints and scripts train as they did. Otherwise it is looked up, in this order:

* a built-in's name (:data:`BUILTINS`), or one given to :func:`register` in this process;
* an entry point of group :data:`ENTRY_POINT_GROUP` (a package's ``pyproject.toml``:
  ``[project.entry-points."advpt.masking_methods"] my-method = "my_package.module:MyMethod"``);
* ``path/to/file.py:ClassName``: the class of that file, imported once per content.

What a checkpoint records as the method (:attr:`MethodSource.recorded`, under the setting's
name) is its name, and for a file its path, class and a digest of its content, so that a resume
with another method, or an edited file, is refused like any other change of settings.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

from advpt.config.pretrain import TrainConfig
from advpt.errors import ConfigError, first_line
from advpt.methods.alternating import AlternatingAdversary
from advpt.methods.base import MaskingMethod
from advpt.methods.importance_weighted import ImportanceWeighted, SimultaneousImportanceWeighted
from advpt.methods.random_mlm import RandomMLM
from advpt.methods.simultaneous import SimultaneousAdversary
from advpt.tokenizer import Vocabulary

ENTRY_POINT_GROUP = "advpt.masking_methods"

# The adversaries --schedule and --estimator name (--mode adversarial).
ADVERSARIES: dict[tuple[str, str], type[MaskingMethod]] = {
    ("alternating", "mixed"): AlternatingAdversary,
    ("simultaneous", "mixed"): SimultaneousAdversary,
    ("alternating", "importance"): ImportanceWeighted,
    ("simultaneous", "importance"): SimultaneousImportanceWeighted,
}
BUILTINS: dict[str, type[MaskingMethod]] = {
    cls.name: cls for cls in (RandomMLM, *ADVERSARIES.values())
}
_registered: dict[str, type[MaskingMethod]] = {}


def register(cls: type[MaskingMethod]) -> type[MaskingMethod]:
    """Make ``cls`` selectable by its ``name`` in this process (a class decorator); a name
    taken by another class is refused."""
    if not _is_method(cls):
        raise TypeError(f"{cls!r} is not a MaskingMethod subclass with a name")
    taken = BUILTINS.get(cls.name) or _registered.get(cls.name)
    if taken is not None and taken is not cls:
        raise ValueError(f"masking method name {cls.name!r} is taken by {taken.__qualname__}")
    _registered[cls.name] = cls
    return cls


def builtin_name(mode: str, schedule: str, estimator: str) -> str:
    """The built-in method that ``--mode``, ``--schedule`` and ``--estimator`` name."""
    if mode == "random":
        return RandomMLM.name
    return ADVERSARIES[schedule, estimator].name


@dataclass(frozen=True)
class MethodSource:
    """A method class, and how a checkpoint records it.

    Attributes:
        spec: what ``--masking_method`` said (or the built-in's name).
        cls: the class.
        recorded: its name; for a file, ``/absolute/path.py:ClassName (sha256 <16 hex>)``.
    """

    spec: str
    cls: type[MaskingMethod]
    recorded: str

    def build(self, config: TrainConfig, vocab: Vocabulary) -> MaskingMethod:
        """The method for ``config`` and the encoder's ``vocab``, its phases checked against the
        engines it has."""
        method = self.cls(config, vocab)
        engines = {"encoder", "noiser"} if method.trains_noiser else {"encoder"}
        for phase, spec in method.phases().items():
            if missing := set(spec.trains) - engines:
                raise ConfigError(
                    f"--masking_method {self.spec}: its phase {phase!r} trains "
                    f"{', '.join(sorted(missing))}, which a method with trains_noiser = "
                    f"{method.trains_noiser} does not have"
                )
        return method


def method_source(config: TrainConfig) -> MethodSource:
    """The method ``config`` trains: ``--masking_method``'s, else the built-in of its flags."""
    spec = config.method.masking_method
    if not spec:
        name = builtin_name(config.method.mode, config.method.schedule, config.masking.estimator)
        return MethodSource(name, BUILTINS[name], name)
    if spec.endswith(".py") or ".py:" in spec:
        return _from_file(spec)
    cls = BUILTINS.get(spec) or _registered.get(spec) or _from_entry_point(spec)
    return MethodSource(spec, cls, spec)


def build_method(config: TrainConfig, vocab: Vocabulary) -> MaskingMethod:
    """The method ``config`` trains, for the encoder's ``vocab`` (:func:`method_source`)."""
    return method_source(config).build(config, vocab)


def _is_method(cls: object) -> bool:
    return (
        isinstance(cls, type)
        and issubclass(cls, MaskingMethod)
        and isinstance(getattr(cls, "name", None), str)
        and bool(cls.name)
    )


def _checked(spec: str, cls: object, what: str) -> type[MaskingMethod]:
    """``cls`` if it is a method that can be built, else a one-sentence refusal naming ``what``
    it came from."""
    if not _is_method(cls):
        raise ConfigError(
            f"--masking_method {spec}: {what} is not a subclass of "
            "advpt.methods.base.MaskingMethod with a name"
        )
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise ConfigError(f"--masking_method {spec}: {what} does not define {missing}")
    return cls


def _from_entry_point(spec: str) -> type[MaskingMethod]:
    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=spec)
    if not found:
        known = sorted({*BUILTINS, *_registered})
        plugins = sorted(ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
        installed = f", entry points {', '.join(plugins)}" if plugins else ""
        raise ConfigError(
            f"--masking_method {spec} names no masking method (known: {', '.join(known)}"
            f"{installed}); give a name, an entry point of group {ENTRY_POINT_GROUP} or "
            "path/to/file.py:ClassName"
        )
    entry = next(iter(found))
    try:
        cls = entry.load()
    except Exception as err:  # whatever the plugin's import raises, said in one sentence
        raise ConfigError(
            f"--masking_method {spec}: entry point {entry.value} (group {ENTRY_POINT_GROUP}) "
            f"fails to load ({type(err).__name__}: {first_line(err)})"
        ) from err
    return _checked(spec, cls, f"entry point {entry.value}")


def _from_file(spec: str) -> MethodSource:
    path_text, colon, name = spec.rpartition(":")
    if not colon or not path_text.endswith(".py") or not name.isidentifier():
        raise ConfigError(
            f"--masking_method {spec}: name the class in the file as path/to/file.py:ClassName"
        )
    path = Path(path_text).expanduser().resolve()
    try:
        content = path.read_bytes()
    except OSError as err:
        raise ConfigError(
            f"--masking_method {spec}: cannot read {path_text} ({err.strerror or err})"
        ) from None
    digest = hashlib.sha256(content).hexdigest()[:16]
    module = _import_file(spec, path, digest)
    if not hasattr(module, name):
        raise ConfigError(f"--masking_method {spec}: {path_text} defines no {name}")
    cls = _checked(spec, getattr(module, name), f"{name} in {path_text}")
    return MethodSource(spec, cls, f"{path}:{name} (sha256 {digest})")


def _import_file(spec: str, path: Path, digest: str):
    """The module of the file at ``path`` (content ``digest``): imported once per content, under
    a name of its own, so that an edited file is imported anew."""
    module_name = f"advpt_masking_method_{path.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look their module up there
    try:
        loader_spec.loader.exec_module(module)
    except Exception as err:  # whatever the file's code raises, said in one sentence
        del sys.modules[module_name]
        raise ConfigError(
            f"--masking_method {spec}: {path} fails to import "
            f"({type(err).__name__}: {first_line(err)})"
        ) from err
    return module
