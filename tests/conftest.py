"""Shared test setup: never touch the network; a seeded tiny model built once per session."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HERMES_GC_FREEZE", "0")  # tests share a process: no test freezes what the next one frees

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from hermes.config import ModelConfig  # noqa: E402
from hermes.pipelines.frames import Frame  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model():
    """The builtin tiny LLaVA-OneVision (random, seed 0), loaded once: tests must not mutate it."""
    from hermes.models.loading import load_model

    return load_model(ModelConfig(name="tiny-llava-onevision", max_new_tokens=6))


def random_frames(n: int, *, interval_s: float = 0.5, size=(48, 64), seed: int = 0) -> list[Frame]:
    """`n` random RGB frames at `interval_s` spacing starting at t=0."""
    rng = np.random.default_rng(seed)
    return [Frame(i * interval_s, rng.integers(0, 256, (*size, 3), dtype=np.uint8), i) for i in range(n)]
