"""Recall's question vector, and recall's cost when there is nothing to recall.

The search vector is the question's last-layer queries as the model rotates them, placed after the
cache as it was before anything is spliced. Here it is computed by hand from transformers' own
forward (hidden states into the last layer, its norm, q_proj and rotary), independently of how
`hermes.lower` obtains it, and a recall-on answer is compared with one whose recall used that
hand-made vector.
"""

import copy

import torch
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

from hermes.cache import METADATA
from hermes.config import MemoryConfig
from hermes.lower import content_vector
from hermes.pipelines.session import StreamingSession, format_prompt
from tests.conftest import random_frames

TPF = 196
QUESTION = "What colour is the screen?"


def recall_session(tiny_model, frames: int, budget: int = TPF) -> StreamingSession:
    memory = MemoryConfig(policy="hermes", budget=budget, compress_threshold=0.0, recall_top_k=2, recall=True)
    session = StreamingSession(tiny_model, memory, random_frames(frames, size=(16, 16), seed=5), chunk_frames=4)
    session.advance()
    return session


def last_layer_queries_by_hand(model, cache, embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(queries (Hq, Q, D), positions (1, Q)) of the last decoder layer, from an eager forward on a copy."""
    copied = copy.deepcopy(cache)
    positions = torch.arange(copied.next_position, copied.next_position + embeds.shape[0])[None]
    lm = model.language_model
    config = model.text_config
    previous, config._attn_implementation = config._attn_implementation, "eager"
    try:
        with torch.no_grad():
            out = lm(inputs_embeds=embeds[None], position_ids=positions, cache=copied, use_cache=True,
                     output_hidden_states=True)
            layer = lm.layers[-1]
            x = layer.input_layernorm(out.hidden_states[-2])  # the last layer's input, normed
            head_dim = layer.self_attn.head_dim
            q = layer.self_attn.q_proj(x).view(1, embeds.shape[0], -1, head_dim).transpose(1, 2)
            cos, sin = lm.rotary_emb(x, positions)
            q, _ = apply_rotary_pos_emb(q, q, cos, sin)
    finally:
        config._attn_implementation = previous
    return q[0], positions


def test_question_vector_is_the_last_layers_queries_and_leaves_the_cache_as_it_was(tiny_model):
    session = recall_session(tiny_model, frames=6)
    cache = session.cache
    embeds = tiny_model.question_embeds(format_prompt(QUESTION))
    before = [t.clone() for kv in cache.layer_tensors() for t in kv] + [getattr(cache, n).clone() for n in METADATA]
    queries, positions = last_layer_queries_by_hand(tiny_model, cache, embeds)
    groups = queries.shape[0] // tiny_model.text_config.num_key_value_heads
    expected = content_vector(queries, positions, session.lower.spec, groups=groups)

    got = session.lower.question_vector(cache, embeds)

    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    after = [t for kv in cache.layer_tensors() for t in kv] + [getattr(cache, n) for n in METADATA]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    session.close()


def test_recall_answers_equal_those_of_a_recall_searching_with_the_hand_made_vector(tiny_model, monkeypatch):
    session = recall_session(tiny_model, frames=12)  # evicts: records exist in level 2
    assert session.lower.store.stats()["dram_records"] + session.lower.store.stats()["disk_records"] > 0
    answer = session.ask(QUESTION)
    assert answer.recall["records"] >= 1 and answer.recall["tokens"] > 0

    lower = session.lower

    def by_hand(cache, embeds):
        queries, positions = last_layer_queries_by_hand(tiny_model, cache, embeds)
        return content_vector(queries, positions, lower.spec,
                              groups=queries.shape[0] // tiny_model.text_config.num_key_value_heads)

    monkeypatch.setattr(lower, "question_vector", by_hand)
    reference = session.ask(QUESTION)
    assert answer.answer == reference.answer
    assert answer.recall["records"] == reference.recall["records"]
    assert answer.recall["tokens"] == reference.recall["tokens"]
    torch.testing.assert_close(answer.first_token_logits, reference.first_token_logits, atol=1e-4, rtol=1e-4)
    session.close()


def test_recall_with_empty_lower_levels_costs_no_forward_pass(tiny_model):
    """Nothing evicted yet: a recall-on question runs exactly the forwards of a recall-off one."""
    calls = []
    hook = tiny_model.language_model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        counts = {}
        for recall in (False, True):
            memory = MemoryConfig(policy="hermes", budget=50 * TPF, recall=recall)
            session = StreamingSession(tiny_model, memory, random_frames(4, size=(16, 16)), chunk_frames=4,
                                       max_new_tokens=3)
            session.advance()
            calls.clear()
            answer = session.ask(QUESTION)
            counts[recall] = len(calls)
            session.close()
        assert answer.recall == {"recall_ms": answer.recall["recall_ms"], "records": 0, "tokens": 0}
        assert counts[True] == counts[False] > 0
    finally:
        hook.remove()
