"""Library code never imports a command: imports flow from the commands into the library.

A command is a module under ``advpt/`` that defines a top-level ``main()`` (``advpt.train``,
``advpt.data.prepare``, ...), or any module of a package whose ``__main__`` does
(``advpt.study.jobs``), but for that package's ``__init__``, which the library may import
(``advpt.environment``: the report, whose ``__main__`` prints it). Commands may import each
other; no other module may import one.
"""

from __future__ import annotations

import ast
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


def _imported(tree: ast.Module) -> set[str]:
    """Every module name an import in ``tree`` may name (``from a import b``: ``a`` and
    ``a.b``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_library_module_imports_a_command():
    modules = _modules()
    packages = {name.removesuffix(".__main__") for name in modules if name.endswith(".__main__")}
    commands = {
        name
        for name, tree in modules.items()
        if _defines_main(tree) or any(name.startswith(f"{p}.") for p in packages)
    }
    assert {"advpt.train", "advpt.data.prepare", "advpt.study.jobs"} <= commands
    assert "advpt.environment.__main__" in commands and "advpt.environment" not in commands
    wrong = sorted(
        f"{name} imports {imported}"
        for name, tree in modules.items()
        if name not in commands
        for imported in _imported(tree) & commands
    )
    assert wrong == [], "library modules import commands:\n" + "\n".join(wrong)
