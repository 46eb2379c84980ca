"""The import graph keeps its layering: core `hermes/` <- `models/` <- `pipelines/` <- `datasets/`;
only `hermes/cli.py` (the command line, on top) reaches every package."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# folder -> the packages of ours its modules must not import (the layers above it)
ABOVE = {
    "hermes": ("hermes.models", "hermes.pipelines", "hermes.datasets"),
    "models": ("hermes.pipelines", "hermes.datasets"),
    "pipelines": ("hermes.datasets",),
    "datasets": (),
}
# the command line, and the package's `hermes.open` (looked up lazily, so `import hermes` stays light)
ON_TOP = {ROOT / "hermes" / "cli.py", ROOT / "hermes" / "__init__.py"}


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("folder", list(ABOVE))
def test_no_module_imports_a_layer_above_its_own(folder):
    wrong = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        if path in ON_TOP:
            continue
        for name in imported_modules(path):
            if any(name == up or name.startswith(up + ".") for up in ABOVE[folder]):
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, wrong


def test_code_and_docs_cite_the_design_of_record_in_the_repository():
    """Comments cite docs/ARCHITECTURE.md (in the repository), never the design brief outside it."""
    root = Path(__file__).resolve().parents[1]
    citing = [str(path.relative_to(root)) for folder in ("hermes", "models", "pipelines", "datasets", "scripts",
                                                          "tests", "docs", "configs")
              for path in (root / folder).rglob("*") if path.suffix in (".py", ".md", ".yaml", ".sh")
              and "DESIGN " + "§" in path.read_text(encoding="utf-8", errors="replace")]
    assert citing == []
