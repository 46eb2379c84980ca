"""`model.preprocess_on` (resize and normalise on the model's device) and `model.compile_decode`."""

import logging

import numpy as np
import pytest
import torch

from hermes.config import ConfigError, ModelConfig, build_config
from hermes.models.compiled_decode import compile_unavailable_reason, compiled_decode_step
from hermes.models.loading import load_model
from hermes.models.preprocess import (DEVICE_TOLERANCE_LEVELS, device_resize_error_levels, resize_frames,
                                      resolve_preprocess_device)

CPU = torch.device("cpu")


def frames(n=3, height=90, width=160, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(n)]


@pytest.mark.parametrize("name", ["tiny-llava-onevision", "tiny-qwen2-vl", "tiny-qwen3-vl", "tiny-smolvlm2"])
def test_device_path_gives_the_host_paths_pixels(name):
    """The upload-then-resize path on CPU tensors equals the host path exactly (same kernels, one device);
    the stated tolerance on another device is DEVICE_TOLERANCE_LEVELS (unrounded) / one 8-bit level."""
    host = load_model(ModelConfig(name=name, preprocess_on="host"))
    on_device = load_model(ModelConfig(name=name, preprocess_on="device"))
    assert host.preprocess_device is None and on_device.preprocess_device == CPU
    a, b = host.preprocess(frames()), on_device.preprocess(frames())
    a, b = (a[0], b[0]) if isinstance(a, tuple) else (a, b)  # Qwen-VL: (patches, grid)
    assert a.shape == b.shape and a.abs().sum() > 0
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_resize_runs_where_it_is_told_and_matches_within_tolerance():
    assert resize_frames(frames(1), 24, 32, device=CPU).shape == (1, 3, 24, 32)
    assert device_resize_error_levels(CPU, quantize=False) <= DEVICE_TOLERANCE_LEVELS
    assert device_resize_error_levels(CPU, quantize=True) == 0.0


def test_auto_resizes_on_the_host_without_cuda():
    assert resolve_preprocess_device("auto", CPU) is None
    assert resolve_preprocess_device("host", CPU) is None
    assert resolve_preprocess_device("device", CPU) == CPU


def test_options_are_validated():
    with pytest.raises(ConfigError):
        build_config(overrides=["model.preprocess_on=gpu"])
    with pytest.raises(ConfigError):
        build_config(overrides=["model.compile_decode=true"])
    assert build_config(overrides=["model.compile_decode=default"]).model.compile_decode == "default"


def test_compile_decode_falls_back_to_eager_with_one_line(caplog, monkeypatch):
    model = load_model(ModelConfig(name="tiny-llava-onevision"))
    assert compiled_decode_step(model, "off") is None
    with caplog.at_level(logging.WARNING):
        assert compiled_decode_step(model, "reduce-overhead") is None  # CUDA graphs need CUDA
    assert "decoding eagerly" in caplog.text and "CUDA" in caplog.text
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert "C++ compiler" in compile_unavailable_reason("default", CPU)


@pytest.mark.slow
def test_compiled_decode_steps_give_eagers_logits_with_one_graph():
    """Inductor on the CPU (needs g++, tens of seconds): per-step logits within float tolerance of eager's,
    one graph for a growing cache (no recompile per length). Tokens may differ where logits nearly tie."""
    if compile_unavailable_reason("default", CPU):
        pytest.skip("no C++ compiler")
    from torch._dynamo.utils import counters

    model = load_model(ModelConfig(name="tiny-llava-onevision"))
    compiled = compiled_decode_step(model, "default")
    counters.clear()
    with torch.inference_mode():
        logits = {}
        for label, step in (("eager", model.decode_logits), ("compiled", compiled)):
            cache = model.new_cache()
            model.encode_prefix(cache)
            token, out = torch.tensor([5]), []
            for _ in range(6):
                position = model.positions_for(cache.allocate_positions(1))
                out.append(step(token, position, cache))
            logits[label] = torch.stack(out)
    torch.testing.assert_close(logits["compiled"], logits["eager"], rtol=1e-4, atol=1e-4)
    assert counters["stats"]["unique_graphs"] == 1
