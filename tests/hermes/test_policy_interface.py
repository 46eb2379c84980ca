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


def test_no_pass_writes_a_models_config_or_keeps_a_module_global():
    """The probe's passes and rekv's retrieval hand their attention down as a forward kwarg."""
    for path in [ROOT / "hermes" / "probe.py", *(ROOT / "hermes" / "baselines").glob("*.py")]:
        tree = ast.parse(path.read_text())
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Global)], path
        written = [ast.unparse(t) for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AugAssign))
                   for t in (n.targets if isinstance(n, ast.Assign) else [n.target])]
        assert not [w for w in written if "_attn_implementation" in w], path


def test_a_model_whose_attention_takes_no_pass_is_refused_with_a_clear_error(tiny_model):
    import pytest

    from hermes.errors import ModelError
    from hermes.pipelines.session import StreamingSession
    from hermes.probe import probe_attention
    from tests.conftest import random_frames

    session = StreamingSession(tiny_model, "full", random_frames(2, size=(16, 16)), chunk_frames=2)
    session.advance()
    tiny_model.language_model.set_attn_implementation("sdpa")  # transformers' own: nothing would run the probe
    try:
        with pytest.raises(ModelError, match="does not take hermes's passes"):
            probe_attention(tiny_model, session.cache, tiny_model.question_embeds("What?"))
    finally:
        tiny_model.set_attention("sdpa")
    assert tiny_model.text_config._attn_implementation == "hermes_sdpa"
    assert probe_attention(tiny_model, session.cache, tiny_model.question_embeds("What?")).shape[-1] == \
        session.cache.num_tokens


def test_only_the_cache_writes_its_position_counters():
    """`next_position`, `block` and `compactions` change through `HermesCache`'s methods, nowhere else."""
    writers = []
    for path in [*(ROOT / "hermes").rglob("*.py"), *(ROOT / "pipelines").rglob("*.py"), *(ROOT / "models").rglob("*.py")]:
        if path == ROOT / "hermes" / "cache.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AugAssign) else []
            for target in targets:
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if isinstance(t, ast.Attribute) and t.attr in ("next_position", "block", "compactions"):
                        writers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert writers == []
