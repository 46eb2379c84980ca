"""`rekv`: ReKV's retrieval (per layer, frame blocks, the question's own queries), on the tiny model."""

from __future__ import annotations

import pytest
import torch

from hermes.baselines.rekv import representative, top_blocks
from hermes.cache import KIND_PREFIX
from hermes.config import MemoryConfig, build_config
from hermes.pipelines.frames import Frame
from hermes.pipelines.session import StreamingSession
from hermes.pipelines.synthetic import make_frame
from hermes.rope import RotarySpec, rotate_keys


def frames(n, fps=1.0):
    return [Frame(index=i, t_s=i / fps, rgb=make_frame(i / fps, size=(64, 48), seed=5)) for i in range(n)]


def test_representative_key_and_top_blocks_by_hand():
    keys = torch.tensor([[[[1.0, 0.0], [3.0, 2.0]]]])  # (L=1, Hkv=1, n=2, D=2)
    assert representative(keys, groups=2).tolist() == [[2.0, 1.0, 2.0, 1.0]]  # mean, head repeated
    assert top_blocks(torch.tensor([0.1, 0.9, 0.5, 0.7]), 2).tolist() == [1, 3]  # best two, in time order
    assert top_blocks(torch.tensor([0.3, 0.1]), 4).tolist() == [0, 1]  # fewer blocks than k: all


def test_preset():
    cfg = build_config(memory="rekv")
    assert (cfg.memory.policy, cfg.memory.budget, cfg.memory.recall_top_k) == ("rekv", 15000, 64)


@pytest.mark.slow
def test_everything_retrieved_equals_full_attention(tiny_model):
    """Window and top-k large enough for every frame: ReKV answers as full attention does."""
    rekv = StreamingSession(tiny_model, MemoryConfig(policy="rekv", budget=10**6, recall_top_k=64), frames(6),
                            chunk_frames=2, max_new_tokens=3)
    full = StreamingSession(tiny_model, "full", frames(6), chunk_frames=2, max_new_tokens=3)
    a, b = rekv.ask("What is there?", at=5.5), full.ask("What is there?", at=5.5)
    assert a.answer == b.answer
    torch.testing.assert_close(a.first_token_logits, b.first_token_logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("asked", [{"question": "Where is the red circle?"},
                                   {"question": "Answer with a letter.\nQuestion: Where is the red circle?\n(A) left",
                                    "query": "Where is the red circle?"}], ids=["bare", "benchmark-prompt"])
def test_layer_zero_retrieves_the_blocks_its_question_queries_match(tiny_model, asked):
    """Layer 0's choice, recomputed independently: its input is the question's embeddings, so its
    queries before RoPE are q_proj(input_layernorm(embeds)); block keys are the mean un-rotated keys
    of each frame in a full cache. A benchmark's whole prompt retrieves with the bare question it
    passes as `query`, as ReKV retrieves."""
    per_frame = tiny_model.tokens_per_frame
    memory = MemoryConfig(policy="rekv", budget=3 * per_frame, recall_top_k=2)  # window of 3 frames, 2 retrieved
    session = StreamingSession(tiny_model, memory, frames(8), chunk_frames=2, max_new_tokens=2)
    session.ask(**asked, at=7.5)
    assert len(session.memory.blocks) == 5  # 8 frames, 3 in the window
    retrieved = session.memory.last_retrieved
    assert all(len(r) == 2 and r == sorted(r) for r in retrieved)  # every layer: 2 frames, time order

    full = StreamingSession(tiny_model, "full", frames(8), chunk_frames=2)
    full.advance(until_s=7.5)
    cache = full.cache
    spec = RotarySpec.from_text_config(tiny_model.text_config)
    keys = cache.layer_tensors()[0][0][0]  # (Hkv, T, D)
    pos = cache.positions[0][0].to(keys.device)
    raw = rotate_keys(keys, -pos, spec, positions=pos)
    prefix = int((cache.kinds[0] == KIND_PREFIX).sum())
    blocks = raw[:, prefix:].reshape(raw.shape[0], 8, per_frame, -1).permute(1, 0, 2, 3)  # (F, Hkv, n, D)
    text = tiny_model.text_config
    groups = text.num_attention_heads // text.num_key_value_heads
    reps = representative(blocks, groups)  # (F, Hq*D)
    layer0 = tiny_model.model.model.language_model.layers[0]
    with torch.no_grad():
        h = layer0.input_layernorm(tiny_model.embed_text("Where is the red circle?").to(keys.dtype))
        q = layer0.self_attn.q_proj(h).float().mean(0)  # (Hq*D), heads concatenated
    expected = top_blocks(reps.float() @ q, 2).tolist()
    assert retrieved[0] == expected


def test_retrieve_gathers_the_chosen_frames_from_host_blocks_and_window_alike(tiny_model):
    """Layer 0's retrieval, against the same frames cut from a full cache (layer 0's keys and values
    depend on each token alone, so the window does not change them): the chosen frames are the best
    k by representative key, in time order, and their keys and values (before RoPE) are those frames'
    own, whether the frame is a host block or still in the window."""
    per_frame = tiny_model.tokens_per_frame
    memory = MemoryConfig(policy="rekv", budget=3 * per_frame, recall_top_k=3)
    session = StreamingSession(tiny_model, memory, frames(8), chunk_frames=2)
    session.advance(until_s=7.5)
    policy = session.memory
    assert len(policy.blocks) == 5

    full = StreamingSession(tiny_model, "full", frames(8), chunk_frames=2)
    full.advance(until_s=7.5)
    spec = RotarySpec.from_text_config(tiny_model.text_config)
    text = tiny_model.text_config
    groups = text.num_attention_heads // text.num_key_value_heads
    gen = torch.Generator().manual_seed(0)
    mixed, layer = 0, 0
    keys, values = full.cache.layer_tensors()[layer]
    pos = full.cache.positions[layer][0].to(keys.device)
    raw = rotate_keys(keys[0], -pos, spec, positions=pos)
    prefix = int((full.cache.kinds[layer] == KIND_PREFIX).sum())
    k_blocks = raw[:, prefix:].reshape(raw.shape[0], 8, per_frame, -1)  # (Hkv, F, n, D)
    v_blocks = values[0][:, prefix:].reshape(raw.shape[0], 8, per_frame, -1)
    reps = representative(k_blocks.permute(1, 0, 2, 3), groups)  # (F, Hq * D)
    for _ in range(12):
        q_vec = torch.randn(reps.shape[1], generator=gen)
        want = top_blocks(reps @ q_vec, 3)
        got_k, got_v, got_frames = policy.retrieve(session.cache, layer, q_vec, keys.device)
        assert got_frames.tolist() == want.tolist()
        torch.testing.assert_close(got_k, k_blocks[:, want].flatten(1, 2), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got_v, v_blocks[:, want].flatten(1, 2))
        mixed += bool((want < 5).any() and (want >= 5).any())
    assert mixed  # some choices took frames from both the host blocks and the window
