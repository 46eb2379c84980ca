"""Every family with every memory policy: bounded, equal layers, positions in range, questions leave no trace."""

import json

import pytest
import torch

from hermes.cache import KIND_PREFIX, KIND_SUMMARY, METADATA
from hermes.config import MemoryConfig, ModelConfig
from hermes.errors import ModelError
from hermes.models.loading import load_model, supported_families
from hermes.model_registry import model_entry
from hermes.pipelines.session import StreamingSession
from tests.conftest import random_frames
from tests.models.tiny_models import TINY_FAMILIES, tiny

SMALL = (16, 16)  # input frames; each family resizes them to its own (tiny) input size
POLICIES = {
    "full": MemoryConfig(policy="full"),
    "sliding": MemoryConfig(policy="sliding", budget=70),
    "uniform": MemoryConfig(policy="uniform", budget=70),
    "hermes": MemoryConfig(policy="hermes", budget=70),
    "hermes-eager": MemoryConfig(policy="hermes", budget=70, reindex="eager"),
}


def prefix_len(session) -> int:
    return int((session.cache.kinds[0] == KIND_PREFIX).sum())


def snapshot(cache) -> list[torch.Tensor]:
    tensors = [t.clone() for kv in cache.layer_tensors() for t in kv]
    return tensors + [getattr(cache, name).clone() for name in METADATA] + [torch.tensor(cache.next_position)]


def test_every_family_is_supported_and_has_a_tiny_model():
    assert supported_families() == ["llava_onevision", "qwen2_5_vl", "qwen2_vl", "qwen3_vl", "smolvlm"]
    assert {model_entry(name).family for name in TINY_FAMILIES} == set(supported_families())


@pytest.mark.parametrize("name", TINY_FAMILIES)
def test_tiny_models_stay_tiny(name):
    # What keeps every test that builds one cheap is its size, not a stopwatch (no wall-clock bounds on a
    # shared CI machine): each tiny model has about 0.3 M parameters.
    model = load_model(ModelConfig(name=name, seed=1, device="cpu")).model
    assert sum(p.numel() for p in model.parameters()) < 1_000_000


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("name", TINY_FAMILIES)
def test_every_policy_works_with_every_family(name, policy):
    model = tiny(name)
    memory = POLICIES[policy]
    session = StreamingSession(model, memory, random_frames(10, size=SMALL), chunk_frames=4, max_new_tokens=3)
    for at in (2.0, 5.0):  # frames 0-3, then 4-9
        before = snapshot(session.cache)
        answer = session.ask("What happened?", at=at)
        assert torch.isfinite(answer.first_token_logits).all()
        lengths = {k.shape[-2] for k, _ in session.cache.layer_tensors()}
        assert lengths == {session.cache.num_tokens}  # every layer holds the same number of tokens
        assert session.cache.positions.shape == (model.num_layers, model.rotary.num_axes, session.cache.num_tokens)
        if policy != "full":
            assert session.cache.num_tokens <= prefix_len(session) + memory.budget
        again = snapshot(session.cache)
        session.ask("And now?")
        assert all(torch.equal(a, b) for a, b in zip(again, snapshot(session.cache)))  # questions leave no trace
        assert len(before) == len(again)
    if policy == "hermes-eager":  # packed: nothing after the prefix is left unused
        p = prefix_len(session)
        assert int(session.cache.positions[:, :, p:].min()) == p


@pytest.mark.parametrize("name", TINY_FAMILIES)
def test_hermes_stays_bounded_over_a_long_stream(name):
    model = tiny(name)
    budget = 150
    session = StreamingSession(model, MemoryConfig(policy="hermes", budget=budget), [], chunk_frames=8)
    p = prefix_len(session)
    streamed = []  # tokens each chunk added (frames, and timestamps or delimiters where the family has them)
    record = session.cache.record
    session.cache.record = lambda positions, kind, frames=None: (streamed.append(positions.shape[-1]),
                                                                 record(positions, kind, frames))
    # 6 chunks; LLaVA-OneVision (196 tokens per frame, the costliest tiny model) passes the budget at once
    frames = random_frames(24 if name == "tiny-llava-onevision" else 48, size=SMALL)
    sizes = []
    for start in range(0, len(frames), 8):
        session.ingest(frames[start:start + 8])
        lengths = {k.shape[-2] for k, _ in session.cache.layer_tensors()}
        assert lengths == {p + min(budget, sum(streamed))}
        sizes.append(session.cache.nbytes())
    assert len(set(sizes[-2:])) == 1  # bytes constant once eviction has started
    kinds = session.cache.kinds[:, p:]
    summaries = (kinds == KIND_SUMMARY).sum(dim=1).tolist()  # a previous summary competes like any token
    assert summaries[:-2] == [0] * (model.num_layers - 2) and min(summaries[-2:]) >= 1
    # long-term layers fold everything they evict into their summary: their counts add up to the stream
    assert session.cache.counts[-2:, p:].sum(dim=1).tolist() == [sum(streamed)] * 2
    assert torch.isfinite(session.ask("What happened?").first_token_logits).all()


@pytest.mark.parametrize("name", TINY_FAMILIES)
def test_hermes_with_a_budget_larger_than_the_stream_equals_full(name):
    """Without eviction hermes is full: with one position sequence for all layers on every family, and with the
    reference's per-layer positions where they coincide (1-D RoPE; on M-RoPE each chunk opens a new video block,
    as the reference's chunks do, so it departs from one pass: docs/ARCHITECTURE.md, Memory)."""
    model = tiny(name)
    frames = random_frames(6, size=SMALL)
    full = StreamingSession(model, "full", frames, chunk_frames=2).ask("q", at=10.0)
    layouts = ["shared"] + (["per_layer"] if model.rotary.num_axes == 1 else [])
    for chunk_positions in layouts:
        memory = MemoryConfig(policy="hermes", budget=10_000, chunk_positions=chunk_positions)
        hermes = StreamingSession(model, memory, frames, chunk_frames=2).ask("q", at=10.0)
        assert torch.equal(full.first_token_logits, hermes.first_token_logits), chunk_positions


# The limit each family passes many times over: a chunk of one frame advances positions by ~200 (LLaVA-OV),
# ~75 (SmolVLM2), ~11 (Qwen3-VL: timestamp, delimiters, a 4-wide grid) or 1 (Qwen2-VL, Qwen2.5-VL: one
# temporal step); the limit must still hold the prefix, the budget, one chunk and the answer reserve.
LIMITS = {"tiny-llava-onevision": (400, 40), "tiny-smolvlm2": (400, 40), "tiny-qwen3-vl": (150, 60),
          "tiny-qwen2-vl": (100, 160), "tiny-qwen2.5-vl": (100, 160)}


@pytest.mark.parametrize("name", TINY_FAMILIES)
@pytest.mark.slow
def test_positions_stay_in_range_far_beyond_max_position_embeddings(name):
    limit, n_frames = LIMITS[name]
    model = load_model(ModelConfig(name=name, max_new_tokens=3))  # its own copy: the limit is changed below
    model.text_config.max_position_embeddings = limit
    cfg = MemoryConfig(policy="hermes", budget=60, position_reserve=20)
    session = StreamingSession(model, cfg, random_frames(n_frames, size=SMALL), chunk_frames=1, max_new_tokens=3)
    for at in [n_frames * 0.5 * k / 4 for k in (1, 2, 3, 4)]:
        answer = session.ask("What is it?", at=at)
        assert torch.isfinite(answer.first_token_logits).all()
        assert int(session.cache.positions.max()) < limit and session.cache.next_position < limit
    assert len(session.encoded_t_s) == n_frames  # uncompacted, they would reach far past the limit
    assert n_frames * (1 if "qwen2" in name else 11) > limit


def test_unsupported_architecture_lists_every_family(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ModelError) as err:
        load_model(ModelConfig(name=str(tmp_path)))
    message = str(err.value)
    assert "unsupported model architecture 'bert'" in message
    for family in ("llava_onevision", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "smolvlm"):
        assert family in message


@pytest.mark.parametrize("name", TINY_FAMILIES)
def test_loads_from_a_local_directory(name, tmp_path):
    """A saved checkpoint loads through transformers' auto classes into the right adapter."""
    builtin = tiny(name)
    builtin.model.save_pretrained(tmp_path)
    builtin.tokenizer.save_pretrained(tmp_path)
    local = load_model(ModelConfig(name=str(tmp_path), device="cpu", dtype="float32"))
    assert type(local) is type(builtin) and local.family == builtin.family
    frames = random_frames(4, size=(112, 112))
    a = StreamingSession(builtin, "full", frames).ask("Q?", at=5.0)
    b = StreamingSession(local, "full", frames).ask("Q?", at=5.0)
    if not model_entry(name).adapter:  # same preprocessing (the tiny Qwen models use smaller frames than a checkpoint)
        torch.testing.assert_close(a.first_token_logits, b.first_token_logits, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(b.first_token_logits).all()
