"""Tiny models of every family, built once per test session and shared (each builds in well under a second)."""

from functools import lru_cache

from hermes.config import ModelConfig

TINY_FAMILIES = ["tiny-llava-onevision", "tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl", "tiny-smolvlm2"]


@lru_cache(maxsize=None)
def tiny(name: str):
    """The builtin tiny model `name` (seed 0), shared: tests must not mutate it."""
    from hermes.models.loading import load_model

    return load_model(ModelConfig(name=name, max_new_tokens=6))
