"""The policy interface is closed: one registry names every policy, the base module imports none of its
subclasses, and the session asks no policy what kind it is."""

import ast
import typing
from pathlib import Path

from hermes.config import MemoryConfig
from hermes.policies import POLICIES

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (function-level imports included), and the names it takes."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_registry_names_every_policy_the_config_accepts():
    accepted = typing.get_args(typing.get_type_hints(MemoryConfig)["policy"])
    assert set(POLICIES) == set(accepted)
    assert all(cls.name == name for name, cls in POLICIES.items())


def test_the_base_module_imports_no_baseline_and_not_the_registry():
    imports = imported_modules(ROOT / "hermes" / "memory.py")
    assert not [m for m in imports if m.startswith(("hermes.baselines", "hermes.policies"))]


def test_the_session_imports_no_concrete_policy_and_asks_no_policy_its_kind():
    import hermes.memory

    path = ROOT / "pipelines" / "session.py"
    concrete = {cls.__name__ for cls in POLICIES.values()} | {
        name for name, obj in vars(hermes.memory).items()
        if isinstance(obj, type) and issubclass(obj, hermes.memory.MemoryPolicy)}
    imports = imported_modules(path)
    assert not [m for m in imports if m.startswith("hermes.baselines") or m.rsplit(".", 1)[-1] in concrete]
    asks = [ast.unparse(node) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "isinstance") and ast.unparse(node.args[0]).startswith("self.memory")]
    assert asks == []
