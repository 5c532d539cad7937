"""docs/how-it-works.md's code map names every module of the package where it lives: a module
added, moved or renamed without the map fails here."""

from __future__ import annotations

import re

from tests.helpers import REPO

PACKAGE = REPO / "advpt"


def code_map() -> list[tuple[str, str]]:
    """The map's rows as (module column, the whole row), from the table after '## Code map'."""
    text = (REPO / "docs" / "how-it-works.md").read_text()
    table = text.split("## Code map", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ")][2:]  # past the header
    return [(row.split("|")[2], row) for row in rows]


def modules() -> list[str]:
    """Every module of the package as a path below ``advpt/`` (``data/stream.py``), packages'
    ``__init__`` left out."""
    return sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    )


def named(module: str, rows: list[tuple[str, str]]) -> bool:
    """Whether a row of the map names ``module``: as its path in the module column, or by its
    name in a row whose module column is its folder (``advpt/data/`` ... ``stream``)."""
    folder, _, name = module.rpartition("/")
    stem = name.removesuffix(".py")
    for column, row in rows:
        if f"advpt/{module}" in column or (not folder and f"`{name}`" in column):
            return True
        if f"`{module}`" in column or f", {name}" in column:  # the entry points' list
            return True
        if folder and f"advpt/{folder}/" in column and re.search(rf"`{stem}`", row):
            return True
    return False


def test_the_code_map_names_every_module_where_it_lives():
    rows = code_map()
    missing = [module for module in modules() if not named(module, rows)]
    assert not missing, f"docs/how-it-works.md's code map does not name: {', '.join(missing)}"
