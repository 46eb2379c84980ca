"""The `hermes` policy against data produced once by HERMES' reference functions (tests/hermes/golden/PROVENANCE.md).

At the first eviction of a cache (a prefix plus visual tokens), given the same pseudo-query
attention maps, keys and values as the reference, our default policy must rank the same scores,
keep the same tokens in every layer, and write the same summary token (key, value, position) in
long-term layers; with offline re-indexing, compact positions as the reference does and re-rotate
kept keys to them. Two geometries: 1-D RoPE (LLaVA-OneVision-like) and M-RoPE (Qwen2.5-VL-like).

Where our fixes act, the inputs are chosen so they agree with the reference: smoothing by token
identity equals smoothing by index before anything was evicted, and the count-weighted summary
value equals the plain mean when every evicted entry stands for one token.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import Qwen2Config

import hermes.memory
from hermes.cache import KIND_PREFIX, KIND_SUMMARY, KIND_VISUAL, HermesCache
from hermes.config import MemoryConfig
from hermes.memory import HermesPolicy
from hermes.rope import RotarySpec

GOLDEN = Path(__file__).parent / "golden"
KINDS = {"sensory": 0, "working": 2, "longterm": 1}  # which pseudo-query the reference reads: local, mixed, global


def golden(name: str) -> tuple[dict[str, torch.Tensor], dict]:
    path = GOLDEN / f"{name}.safetensors"
    with safe_open(str(path), framework="pt") as f:
        settings = json.loads(f.metadata()["settings"])
    return load_file(str(path)), settings


def setup(name: str, monkeypatch, **memory) -> tuple[HermesPolicy, HermesCache, dict, dict]:
    """A cache holding the golden keys/values/positions, and a policy whose probe returns the golden maps."""
    data, s = golden(name)
    layers, prefix = s["layers"], s["prefix"]
    positions = data["positions"]
    positions = positions[None] if positions.dim() == 1 else positions  # (A, T)
    axes, total = positions.shape
    config = Qwen2Config(num_hidden_layers=layers, hidden_size=s["heads"] * s["head_dim"],
                         num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                         max_position_embeddings=32768)
    cache = HermesCache(config, num_axes=axes)
    for layer in range(layers):
        cache.update(data["keys"][layer].clone(), data["values"][layer].clone(), layer)
    tokens_per_frame = 16
    cache.record(positions[:, :prefix], KIND_PREFIX)
    cache.record(positions[:, prefix:], KIND_VISUAL, torch.arange(total - prefix) // tokens_per_frame)
    cache.next_position = int(positions.max()) + 1
    query = s["query"]
    model = types.SimpleNamespace(text_config=config, num_layers=layers, max_position_embeddings=32768,
                                  question_embeds=lambda text: torch.zeros(query, 1))
    policy = HermesPolicy(MemoryConfig(policy="hermes", budget=s["budget"], **memory), model)
    if axes == 3:
        policy.spec = RotarySpec(head_dim=s["head_dim"], theta=s["theta"], kind="mrope",
                                 mrope_section=tuple(s["mrope_section"]), max_position_embeddings=32768)
    else:
        assert policy.spec == RotarySpec(head_dim=s["head_dim"], theta=s["theta"], max_position_embeddings=32768)

    def golden_probe(model_, cache_, embeds):
        assert embeds.shape[0] == 2 * query  # local then global pseudo-query
        rows = []
        for layer, band in enumerate(policy.bands):
            maps = data["attention"][KINDS[band], layer, 0].mean(dim=0)[:, :total]  # (Q, T): head mean, cache columns
            rows.append(torch.cat([maps, maps]))  # working layers average local and global: both rows alike
        return rows

    monkeypatch.setattr(hermes.memory, "probe_attention", golden_probe)
    return policy, cache, data, s


def kept_ids(cache: HermesCache, layer: int) -> list[int]:
    return sorted(cache.token_ids[layer][cache.kinds[layer] == KIND_VISUAL].tolist())


def reference_ids(keep: torch.Tensor, layer: int, prefix: int) -> list[int]:
    row = keep[layer]
    return (row[row >= 0] + prefix).tolist()  # ids were given in cache order: id = cache index


@pytest.mark.parametrize("name", ["reference_1d", "reference_mrope"])
def test_scores_and_keep_sets_equal_the_reference(name, monkeypatch):
    policy, cache, data, s = setup(name, monkeypatch)
    policy.maintain(cache)
    torch.testing.assert_close(policy.last_scores, data["qwen_scores"], atol=1e-6, rtol=1e-5)
    for layer in range(s["layers"]):
        assert kept_ids(cache, layer) == reference_ids(data["qwen_keep"], layer, s["prefix"]), f"layer {layer}"


def test_llava_files_working_band_constants_are_reproduced_by_options(monkeypatch):
    """The reference's LLaVA file ramps w = 1 - 0.9 p and k = 20 - 19.5 p: memory.w0 / gamma / recency_k_fall."""
    policy, cache, data, s = setup("reference_1d", monkeypatch, w0=1.0, gamma=0.9, recency_k_fall=19.5)
    policy.maintain(cache)
    torch.testing.assert_close(policy.last_scores, data["llava_scores"], atol=1e-6, rtol=1e-5)
    for layer in range(s["layers"]):
        assert kept_ids(cache, layer) == reference_ids(data["llava_keep"], layer, s["prefix"]), f"layer {layer}"


@pytest.mark.parametrize("option", [dict(recency_unit="frame"), dict(recency_k_fall=0.0)])
def test_our_former_choices_disagree_with_the_reference(option, monkeypatch):
    """The golden data tells the options apart: with either former choice some working layer keeps other tokens."""
    policy, cache, data, s = setup("reference_1d", monkeypatch, **option)
    policy.maintain(cache)
    assert any(kept_ids(cache, layer) != reference_ids(data["qwen_keep"], layer, s["prefix"])
               for layer in range(s["layers"]))


def summary_entry(cache: HermesCache, layer: int):
    """(key (H, D), value (H, D), position (A,)) of the layer's summary token."""
    slot = int((cache.kinds[layer] == KIND_SUMMARY).nonzero()[0, 0])
    keys, values = cache.layer_tensors()[layer]
    return keys[0, :, slot], values[0, :, slot], cache.positions[layer, :, slot]


def visual_entries(cache: HermesCache, layer: int):
    """(keys (H, n, D), positions (A, n)) of the layer's prefix and kept visual tokens, in cache order."""
    rows = cache.kinds[layer] != KIND_SUMMARY
    keys, _ = cache.layer_tensors()[layer]
    return keys[0][:, rows.to(keys.device)], cache.positions[layer][:, rows]


def reference_positions(data: dict, mode: str) -> torch.Tensor:
    pos = data[f"{mode}_positions"]
    return pos[:, None] if pos.dim() == 2 else pos  # (L, A, T)


@pytest.mark.parametrize("name", ["reference_1d", "reference_mrope"])
def test_summary_token_equals_the_references_after_the_newest_kept_token(name, monkeypatch):
    """Streaming (no compaction): the reference appends the summary last; ours sits in the first visual slot."""
    policy, cache, data, s = setup(name, monkeypatch)
    policy.maintain(cache)
    ref_positions = reference_positions(data, "lazy")
    for layer in range(s["layers"]):
        keys, positions = visual_entries(cache, layer)
        if policy.bands[layer] != "longterm":
            assert torch.equal(positions, ref_positions[layer])
            assert torch.equal(keys, data["lazy_keys"][layer, 0])  # kept keys are untouched
            assert not (cache.kinds[layer] == KIND_SUMMARY).any()
            continue
        assert torch.equal(positions, ref_positions[layer][:, :-1])
        assert torch.equal(keys, data["lazy_keys"][layer, 0, :, :-1])
        key, value, position = summary_entry(cache, layer)
        assert position.tolist() == ref_positions[layer][:, -1].tolist()
        assert position.tolist() == [int(positions.max()) + 1] * positions.shape[0]  # max over the axes + 1, every axis
        torch.testing.assert_close(value, data["lazy_values"][layer, 0, :, -1], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(key, data["lazy_keys"][layer, 0, :, -1], atol=1e-5, rtol=1e-5)
        assert int(cache.counts[layer][cache.kinds[layer] == KIND_SUMMARY]) == data["keys"].shape[3] - positions.shape[1]
    assert cache.next_position > int(cache.positions.max())  # what comes next goes after every summary


@pytest.mark.parametrize("name", ["reference_1d", "reference_mrope"])
def test_offline_compaction_equals_the_reference(name, monkeypatch):
    """Offline re-indexing (the reference's `streaming=False`, our `reindex: eager`): 1-D positions become
    consecutive, M-RoPE axes are ranked separately among the kept coordinates; keys are re-rotated."""
    policy, cache, data, s = setup(name, monkeypatch, reindex="eager")
    policy.maintain(cache)
    ref_positions = reference_positions(data, "eager")
    for layer in range(s["layers"]):
        keys, positions = visual_entries(cache, layer)
        longterm = policy.bands[layer] == "longterm"
        ref_pos = ref_positions[layer][:, :-1] if longterm else ref_positions[layer]
        ref_keys = data["eager_keys"][layer, 0][:, :-1] if longterm else data["eager_keys"][layer, 0]
        assert torch.equal(positions, ref_pos), f"layer {layer}"
        torch.testing.assert_close(keys, ref_keys, atol=2e-5, rtol=1e-5)
        if longterm and name == "reference_1d":
            key, _, position = summary_entry(cache, layer)
            assert position.tolist() == ref_positions[layer][:, -1].tolist()
            torch.testing.assert_close(key, data["eager_keys"][layer, 0, :, -1], atol=2e-5, rtol=1e-5)
        # M-RoPE: the reference places the summary after compacting (max over the axes + 1); eager
        # re-indexing here places it first and then ranks it with the rest (README, fidelity note)

