"""The model registry: one table of names (configs/models/*.yaml) that every resolution goes through."""

import typing

import pytest

from hermes.config import ModelConfig, build_config
from hermes.errors import ModelError
from hermes.model_registry import auto_model_name, entries, entry_by_arch, hub_id_of, model_entry, resolve_source


def test_every_entry_is_a_checkpoint_or_a_builder_of_a_supported_family():
    from hermes.models.loading import supported_families

    families = set(typing.get_args(typing.get_type_hints(ModelConfig)["family"])) - {""}
    assert families == set(supported_families())  # the config's Literal and the adapters agree
    for entry in entries():
        assert entry.family in families, entry.name
        assert bool(entry.hub_id) != bool(entry.builder), entry.name  # exactly one way to get the weights
        if entry.adapter:
            assert entry.builtin, entry.name


def test_builders_and_random_architectures_exist():
    import importlib

    from hermes.models.micro import MICRO_NAME
    from hermes.models.realsize import ARCH_CONFIGS, CPU_SMALL, arch_names

    for entry in entries():
        if entry.builder:
            module, _, function = entry.builder.partition(":")
            assert callable(getattr(importlib.import_module(module), function)), entry.name
    assert model_entry(MICRO_NAME).builtin
    assert set(arch_names()) == set(ARCH_CONFIGS) | {CPU_SMALL} and arch_names()[-1] == CPU_SMALL
    for arch in ARCH_CONFIGS:
        assert entry_by_arch(arch) is not None, arch


def test_auto_is_one_entry_per_device():
    assert sorted(e.auto for e in entries() if e.auto) == ["cpu", "cuda"]
    assert auto_model_name("cpu") == "smolvlm2-500m" and auto_model_name("cuda:1") == "llava-onevision-7b"
    assert build_config(overrides=["model.device=cpu"]).model.name == "smolvlm2-500m"


def test_names_resolve_to_an_entry_a_directory_or_a_hub_id(tmp_path):
    assert resolve_source("tiny-qwen2-vl") == ("entry", "tiny-qwen2-vl")
    assert resolve_source("qwen2-vl-2b", "Qwen/Qwen2-VL-2B-Instruct") == ("hub", "Qwen/Qwen2-VL-2B-Instruct")
    assert resolve_source(str(tmp_path)) == ("dir", str(tmp_path))
    assert resolve_source("org/model") == ("hub", "org/model")
    with pytest.raises(ModelError, match="unknown model 'qwen2-vl-2c' \\(did you mean 'qwen2-vl-2b'\\?\\)"):
        resolve_source("qwen2-vl-2c")
    with pytest.raises(ModelError, match="local directory not found"):
        resolve_source("./no/such/dir")
    with pytest.raises(ModelError, match="local directory not found"):
        resolve_source("~/no-such-folder-here")  # never read as a hub id
    assert hub_id_of("smolvlm2-500m") == "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"
    with pytest.raises(ModelError, match="is builtin"):
        hub_id_of("tiny-smolvlm2")


def test_load_model_takes_a_name_and_applies_the_entry():
    from hermes.models.loading import load_model

    adapter = load_model("tiny-qwen3-vl")
    assert adapter.name == "tiny-qwen3-vl" and adapter.family == "qwen3_vl"
    options = model_entry("tiny-qwen3-vl").adapter
    assert (adapter.min_pixels, adapter.max_pixels) == (options["min_pixels"], options["max_pixels"])
    assert adapter.dtype.is_floating_point and str(adapter.device) == "cpu"


def test_a_model_preset_file_given_to_config_reads_through_the_registry(tmp_path):
    from importlib import resources

    text = resources.files("hermes.configs").joinpath("models", "tiny-qwen2-vl.yaml").read_text()
    (tmp_path / "my-tiny.yaml").write_text(text)
    cfg = build_config(config_file=tmp_path / "my-tiny.yaml")
    assert cfg.model.name == "my-tiny" and cfg.model.family == "qwen2_vl" and cfg.model.max_new_tokens == 8


def test_the_registry_and_the_presets_import_no_configuration_at_any_level():
    """config.py imports the registry; the registry reads presets from hermes.presets, not back from config.py
    (an import circle, even inside a function)."""
    import ast
    from pathlib import Path

    import hermes

    for module in ("model_registry.py", "presets.py"):
        tree = ast.parse((Path(hermes.__file__).parent / module).read_text(encoding="utf-8"))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert "hermes.config" not in imported, module
