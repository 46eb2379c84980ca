"""The paper presets (`--config paper-*`) carry the reference code's settings.

The expected values are read off the authors' reference code (haowei-freesky/HERMES at 8d699b1), not
off our presets: `load_model(..., sample_fps=0.5)` and `torch_dtype=torch.float16` in
inference/llavaov_hermes.py, `sample_fps=1` in inference/qwenvl_hermes.py, and in both
`question_answering(..., max_new_tokens=128, temperature=0, repetition_penalty=1.1)`. The budget is
the paper's 4K tokens per layer.
"""

import dataclasses

import pytest

from hermes.config import ConfigError, build_config, load_preset

REFERENCE = {
    "paper-llava-onevision-7b": {"family": "llava_onevision", "fps": 0.5},
    "paper-qwen2.5-vl-7b": {"family": "qwen2_5_vl", "fps": 1.0},
}


@pytest.mark.parametrize("preset", sorted(REFERENCE))
def test_paper_preset_is_the_reference_setting(preset):
    # eval's own default memory is `full`: the preset's memory section must win over it
    cfg = build_config(config_file=preset, memory="full")
    assert cfg.model.family == REFERENCE[preset]["family"]
    assert cfg.stream.fps == REFERENCE[preset]["fps"]
    assert cfg.model.dtype == "float16"
    assert cfg.model.max_new_tokens == 128
    assert cfg.model.repetition_penalty == 1.1
    assert (cfg.memory.policy, cfg.memory.budget) == ("hermes", 4096)


@pytest.mark.parametrize("preset", sorted(REFERENCE))
def test_paper_memory_is_the_default_hermes_4k(preset):
    """Beyond policy and budget, the paper presets keep the reference defaults of `hermes-4k`."""
    paper = build_config(config_file=preset)
    ours = build_config(model=paper.model.name, memory="hermes-4k")
    assert dataclasses.asdict(paper.memory) == dataclasses.asdict(ours.memory)
    assert set(load_preset("paper", preset)) == {"model", "memory", "stream"}


def test_an_override_still_wins_over_the_paper_preset():
    cfg = build_config(config_file="paper-llava-onevision-7b", overrides=["model.repetition_penalty=1.0"])
    assert cfg.model.repetition_penalty == 1.0


def test_a_misspelt_paper_preset_suggests_the_name():
    with pytest.raises(ConfigError, match="did you mean 'paper-llava-onevision-7b'"):
        build_config(config_file="paper-llava-onevison-7b")
