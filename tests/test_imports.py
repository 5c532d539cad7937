"""Library code never imports a command: imports flow from the commands into the library.

A command is a module under ``advpt/`` that defines a top-level ``main()`` (``advpt.train``,
``advpt.prepare``, the dispatcher ``advpt.__main__``, ...), or any module of a package
below ``advpt`` whose ``__main__`` does (``advpt.study.jobs``), but for that package's
``__init__``, which the library may import (``advpt.environment``: the report, whose
``__main__`` prints it). Commands may import each other; no other module may import one.

Loading a trained model needs no trainer: the models, the loader and inference import neither
``advpt.training`` nor DeepSpeed (a ZeRO checkpoint's consolidation imports DeepSpeed when it
runs).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

ADVPT = Path(__file__).resolve().parent.parent / "advpt"


def _modules() -> dict[str, ast.Module]:
    modules = {}
    for path in ADVPT.rglob("*.py"):
        name = ".".join(path.relative_to(ADVPT.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = ast.parse(path.read_text())
    return modules


def _defines_main(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body)


def _imported(nodes: Iterable[ast.AST]) -> set[str]:
    """Every module name an import among ``nodes`` may name (``from a import b``: ``a`` and
    ``a.b``)."""
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_library_module_imports_a_command():
    modules = _modules()
    packages = {
        name.removesuffix(".__main__")
        for name in modules
        if name.endswith(".__main__") and name != "advpt.__main__"  # advpt is the library
    }
    commands = {
        name
        for name, tree in modules.items()
        if _defines_main(tree) or any(name.startswith(f"{p}.") for p in packages)
    }
    assert {"advpt.train", "advpt.prepare", "advpt.study.jobs"} <= commands
    assert "advpt.environment.__main__" in commands and "advpt.environment" not in commands
    assert "advpt.__main__" in commands and "advpt.inference" not in commands
    wrong = sorted(
        f"{name} imports {imported}"
        for name, tree in modules.items()
        if name not in commands
        for imported in _imported(ast.walk(tree)) & commands
    )
    assert wrong == [], "library modules import commands:\n" + "\n".join(wrong)


def _run_on_import(nodes: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """The nodes among ``nodes``, and below them, that importing their module runs: all but
    function bodies and ``if TYPE_CHECKING:`` blocks."""
    for node in nodes:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            yield from _run_on_import(node.orelse)
            continue
        yield node
        yield from _run_on_import(ast.iter_child_nodes(node))


def _loaded_with(module: str, modules: dict[str, ast.Module]) -> set[str]:
    """Every module that importing ``module`` imports: advpt's followed through their own
    imports and the packages above them, the others' names as imported."""
    loaded: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in loaded:
            continue
        loaded.add(name)
        for imported in _imported(_run_on_import(modules[name].body)) if name in modules else ():
            parts = imported.split(".")
            above = {".".join(parts[:n]) for n in range(1, len(parts))}
            todo.extend(m for m in above | {imported} if m in modules or parts[0] != "advpt")
    return loaded


def test_loading_a_model_imports_neither_the_trainer_nor_deepspeed():
    modules = _modules()
    loading = [name for name in modules if name.startswith("advpt.models")]
    loading += ["advpt.pretrained", "advpt.run_checkpoints", "advpt.inference"]
    wrong = {}
    for name in ["advpt.train", *loading]:
        loaded = _loaded_with(name, modules)
        wrong[name] = sorted(
            module
            for module in loaded
            if module.split(".")[0] == "deepspeed" or module.startswith("advpt.training")
        )
    assert "deepspeed" in wrong.pop("advpt.train")  # the check sees what a module imports
    assert {name: found[:5] for name, found in wrong.items() if found} == {}
    # nor does the loader take anything from the trainer where it runs
    anywhere = _imported(ast.walk(modules["advpt.pretrained"]))
    assert sorted(name for name in anywhere if name.startswith("advpt.training")) == []
