"""Configuration: presets, files and overrides resolve in order; mistakes are errors, never defaults."""

import dataclasses
import re
import typing

import pytest

from hermes.config import SECTIONS, HermesConfig, MemoryConfig, ModelConfig, build_config, parse_set, preset_names
from hermes.errors import ConfigError


@pytest.mark.parametrize("cuda, expected, hub_id, family", [
    (False, "smolvlm2-500m", "HuggingFaceTB/SmolVLM2-500M-Video-Instruct", "smolvlm"),
    (True, "llava-onevision-7b", "llava-hf/llava-onevision-qwen2-7b-ov-hf", "llava_onevision"),
])
def test_defaults_take_the_default_model_preset(monkeypatch, cuda, expected, hub_id, family):
    """`model.name: auto`: a 7B-class preset with CUDA, the smallest sensible one without; resolved in the config."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    cfg = build_config()
    assert cfg.model.name == expected
    assert cfg.model.hub_id == hub_id
    assert cfg.model.family == family
    assert cfg.memory.policy == "full"
    assert cfg.model.trust_remote_code is False


def test_auto_model_follows_the_configured_device(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert build_config(overrides=["model.device=cpu"]).model.name == "smolvlm2-500m"
    assert build_config(overrides=["model.device=cuda:1", "model.name=auto"]).model.name == "llava-onevision-7b"


def test_a_model_preset_sets_its_frame_rate_below_the_user():
    assert build_config(model="qwen3-vl-8b").stream.fps == 2.0  # the paper's rate for Qwen3-VL
    assert build_config(model="qwen2.5-vl-7b").stream.fps == 1.0
    assert build_config(model="qwen3-vl-8b", overrides=["stream.fps=0.5"]).stream.fps == 0.5


def test_presets_are_listed():
    assert {"llava-onevision-0.5b", "llava-onevision-7b", "tiny-llava-onevision"} <= set(preset_names("models"))
    assert {"qwen2-vl-2b", "qwen2-vl-7b", "qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen3-vl-2b", "qwen3-vl-4b",
            "qwen3-vl-8b", "smolvlm2-256m", "smolvlm2-500m", "smolvlm2-2.2b", "tiny-qwen2-vl", "tiny-qwen2.5-vl",
            "tiny-qwen3-vl", "tiny-smolvlm2"} <= set(preset_names("models"))
    assert "full" in preset_names("memory")


def test_file_then_overrides_apply_in_order(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model:\n  max_new_tokens: 10\nstream:\n  fps: 2\n  chunk_frames: 8\n")
    cfg = build_config(model="tiny-llava-onevision", config_file=f, overrides=["stream.chunk_frames=4"])
    assert cfg.model.max_new_tokens == 10
    assert cfg.stream.fps == 2.0 and isinstance(cfg.stream.fps, float)
    assert cfg.stream.chunk_frames == 4


def test_a_non_preset_model_name_is_kept_for_the_loader():
    assert build_config(model="org/some-model").model.name == "org/some-model"


@pytest.mark.parametrize("override, message", [
    ("model.max_new_token=3", "unknown config key 'model.max_new_token' (did you mean 'model.max_new_tokens'?)"),
    ("strem.fps=1", "unknown config key 'strem' (did you mean 'stream'?)"),
    ("memory.budgt=4", "unknown config key 'memory.budgt' (did you mean 'memory.budget'?)"),  # the key to type
    ("stream.fps=fast", "stream.fps: expected float, found 'fast'"),
    ("model.trust_remote_code=3", "expected bool"),
    ("model=3", "model: expected a mapping"),
    ("novalue", "--set expects key=value"),
])
def test_mistakes_are_config_errors_with_suggestions(override, message):
    with pytest.raises(ConfigError) as err:
        build_config(overrides=[override])
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_memory_preset_suggests():
    with pytest.raises(ConfigError, match="unknown memory preset 'ful' \\(did you mean 'full'\\?\\)"):
        build_config(memory="ful")


def test_bad_yaml_file_is_a_config_error(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        build_config(config_file=f)
    f.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        build_config(config_file=f)


def test_parse_set_reads_yaml_scalars():
    assert parse_set("a.b=3") == {"a": {"b": 3}}
    assert parse_set("a=true") == {"a": True}
    assert parse_set("a=hello world") == {"a": "hello world"}


def test_a_word_yaml_1_1_reads_as_a_boolean_is_taken_as_typed_by_a_string_key(tmp_path):
    """`--set memory.recall_gate=off` was refused (YAML read `off` as false); a bool key still takes on/off."""
    cfg = build_config(overrides=["memory.recall_gate=above_frames", "memory.recall_gate=off", "memory.summary=off",
                                  "memory.recall=yes"]).memory
    assert (cfg.recall_gate, cfg.summary, cfg.recall) == ("off", False, True)
    f = tmp_path / "gate.yaml"
    f.write_text("memory:\n  recall_gate: off\n")  # a file is YAML 1.1: the boolean maps back to the word allowed
    assert build_config(config_file=f).memory.recall_gate == "off"
    with pytest.raises(ConfigError, match="memory.recall_gate: expected one of off, above_frames, above_level1, question, "
                                          "found 'on'"):
        build_config(overrides=["memory.recall_gate=on"])


def test_memory_options_default_to_the_reference_and_take_only_their_choices():
    cfg = build_config(memory="hermes-4k").memory
    assert (cfg.recency_unit, cfg.recency_k_fall, cfg.accumulation, cfg.summary_position, cfg.mrope_compaction) == \
        ("token", 12.0, "none", "after_kept", "per_axis")
    cfg = build_config(overrides=["memory.recency_unit=frame", "memory.accumulation=ema",
                                  "memory.summary_position=mean_evicted", "memory.mrope_compaction=frame_blocks"])
    assert (cfg.memory.recency_unit, cfg.memory.accumulation) == ("frame", "ema")
    with pytest.raises(ConfigError, match="memory.accumulation: expected one of none, sum, ema, found 'max'"):
        build_config(overrides=["memory.accumulation=max"])
    assert build_config(memory="hermes-plus").memory.policy == "hermes"
    gated = build_config(memory="hermes-recall").memory  # hermes-4k, recall on, gated (measured better)
    assert (gated.policy, gated.budget, gated.recall, gated.recall_gate) == ("hermes", 4096, True, "above_frames")
    assert (gated.recency_unit, gated.accumulation) == ("token", "none")  # the reference's scoring


@pytest.mark.parametrize("key, value, message", [
    ("budget", -1, "memory.budget: expected a positive whole number, found -1"),
    ("evict_headroom", -0.1, "memory.evict_headroom: expected at least 0 and below 1, found -0.1"),
    ("evict_headroom", 1.0, "memory.evict_headroom: expected at least 0 and below 1, found 1.0"),
    ("reindex", "sometimes", "memory.reindex: expected one of lazy, eager, found 'sometimes'"),
    ("policy", "lru", "memory.policy: expected one of full, hermes, sliding, uniform, recent-frames, rekv, dscache, "
                      "found 'lru'"),
    ("policy", "recall-only", "(recall-only is a memory preset, not a policy: use --memory recall-only)"),
    ("smoothing", [0.1, 0.3], "memory.smoothing: expected three values (sensory, working, long-term), found [0.1, 0.3]"),
])
def test_a_memory_section_built_directly_fails_as_set_does(key, value, message):
    """`MemoryConfig(budget=-1)` is refused on construction with the one line `--set memory.budget=-1` gives."""
    with pytest.raises(ConfigError) as built:
        MemoryConfig(**{key: value})
    with pytest.raises(ConfigError) as overridden:
        build_config(model="tiny-llava-onevision", overrides=[f"memory.{key}={value}"])
    assert message in str(built.value)
    assert str(built.value) == str(overridden.value)


def _fields_by_kind():
    """(key, annotation, field) of every field of every section, found by introspection (a new one included)."""
    return [(f"{section}.{f.name}", typing.get_type_hints(cls)[f.name], f) for section, cls in SECTIONS.items()
            for f in dataclasses.fields(cls)]


def _numeric(hint) -> bool:
    item = typing.get_args(hint)[0] if typing.get_origin(hint) is tuple else hint
    return item in (int, float)


def test_every_numeric_field_has_a_range():
    numeric = [key for key, hint, _ in _fields_by_kind() if _numeric(hint)]
    assert {"memory.budget", "memory.evict_headroom", "memory.bands", "stream.fps"} <= set(numeric)
    assert [key for key, hint, f in _fields_by_kind() if _numeric(hint) and "range" not in f.metadata] == []
    assert [key for key, hint, f in _fields_by_kind() if not _numeric(hint) and "range" in f.metadata] == []


def _build(key: str, value):
    section, name = key.split(".")
    return SECTIONS[section](**{name: value})


@pytest.mark.parametrize("key, hint, f", [pytest.param(*row, id=row[0]) for row in _fields_by_kind()
                                           if "range" in row[2].metadata])
def test_direct_construction_refuses_every_out_of_range_value(key, hint, f):
    low, high, _ = f.metadata["range"]
    for bad in [low - 1 if low is not None else None, high + 1 if high is not None else None]:
        if bad is None:
            continue
        value = (bad, 0.5, 0.5) if typing.get_origin(hint) is tuple else bad
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: expected .*, found {re.escape(repr(bad))}$"):
            _build(key, value)


@pytest.mark.parametrize("key, hint", [row[:2] for row in _fields_by_kind()])
def test_direct_construction_refuses_a_wrong_type_in_every_field(key, hint):
    value = "x" if typing.get_origin(hint) is tuple else [1]
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: expected "):
        _build(key, value)


@pytest.mark.parametrize("build, message", [
    (lambda: MemoryConfig(bands=(0.2, 0.2, 0.2)), "memory.bands: expected three fractions summing to 1"),
    (lambda: MemoryConfig(accumulation="ema", accumulate_decay=1.0), "memory.accumulate_decay: expected below 1"),
    (lambda: ModelConfig(device="gpu"), "model.device: expected auto, cpu, cuda or cuda:N, found 'gpu'"),
    (lambda: ModelConfig(max_new_tokens=True), "model.max_new_tokens: expected int, found True"),
    (lambda: HermesConfig(memory="hermes"), "memory: expected a MemoryConfig, found 'hermes'"),
])
def test_direct_construction_checks_what_spans_fields(build, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build()


def test_direct_construction_coerces_as_yaml_does():
    memory = MemoryConfig(bands=[0.1, 0.6, 0.3], recency_k=20, budget="64")
    assert memory.bands == (0.1, 0.6, 0.3) and isinstance(memory.recency_k, float) and memory.budget == 64
