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


# folder -> the dotted package its files are installed as (pyproject's package-dir); scripts/ is no
# package: its files run as scripts and import each other by bare name (`import eval_micro`).
PACKAGES = {"hermes": "hermes", "models": "hermes.models", "pipelines": "hermes.pipelines",
            "datasets": "hermes.datasets", "scripts": "scripts"}


def project_modules() -> dict[str, Path]:
    """Every project module's dotted name -> its file (a package's `__init__.py` under the package's name)."""
    modules = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


def import_edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that the file of module `name` imports, anywhere in it (module level, inside
    functions, under TYPE_CHECKING).

    Each import is resolved to the most specific project module it names: `import hermes.config` and
    `from hermes import config` are edges to `hermes.config`; `from hermes.models import micro` to
    `hermes.models.micro`; `from hermes.pipelines.facade import open_session` to `hermes.pipelines.facade`.
    A package's `__init__` is an edge only where the import names the package itself, or a name that
    its `__init__` defines (`from hermes import open`); that Python runs a parent package's `__init__`
    first is not counted (ours import nothing at module level). Relative imports resolve against the
    importing module's package; a bare `import eval_micro` in scripts/ is the sibling script.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                dotted = alias.name
                if name.startswith("scripts.") and f"scripts.{dotted}" in modules:
                    dotted = f"scripts.{dotted}"
                targets.add(dotted)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            elif name.startswith("scripts.") and f"scripts.{base}" in modules:
                base = f"scripts.{base}"
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    edges = set()
    for dotted in targets:
        # `import hermes.tiers.disk.X` (X an attribute) -> the longest prefix that is a module of ours
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        if dotted and dotted != name:
            edges.add(dotted)
    return edges


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_cycle_finder_names_a_circle_and_passes_a_tree():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_import_edges_resolve_relative_bare_and_from_imports(tmp_path):
    source = tmp_path / "x.py"
    source.write_text("from .common import f\nfrom . import records\ndef g():\n    import micro_suite\n"
                      "    from hermes import config\n    import hermes.tiers.disk\n", encoding="utf-8")
    modules = {m: source for m in ("hermes.datasets.common", "hermes.datasets.records", "hermes.config",
                                   "hermes.tiers.disk", "hermes.tiers", "hermes", "scripts.micro_suite")}
    assert import_edges("hermes.datasets.x", source, modules) == {
        "hermes.datasets.common", "hermes.datasets.records", "hermes.config", "hermes.tiers.disk"}
    assert import_edges("scripts.x", source, modules) >= {"scripts.micro_suite"}


def test_no_import_circle_among_project_modules():
    """No circle of imports among our modules, not even one broken by an import inside a function."""
    modules = project_modules()
    graph = {name: import_edges(name, path, modules) for name, path in modules.items()}
    cycles = find_cycles(graph)
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(cycle) for cycle in cycles)
