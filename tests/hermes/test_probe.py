"""The attention probe is the model's real attention, and it leaves the cache as it was."""

import copy
import types

import pytest
import torch

import hermes.probe

from hermes.cache import METADATA
from hermes.pipelines.session import StreamingSession
from hermes.probe import probe_attention
from tests.conftest import random_frames


def test_probe_equals_eager_output_attentions(tiny_model):
    session = StreamingSession(tiny_model, "full", random_frames(3, size=(16, 16)), chunk_frames=2)
    session.advance()
    cache = session.cache
    pseudo = tiny_model.question_embeds("What is happening in the video?")
    reference_cache = copy.deepcopy(cache)
    before = [t.clone() for kv in cache.layer_tensors() for t in kv] + [getattr(cache, n).clone() for n in METADATA]

    probed = probe_attention(tiny_model, cache, pseudo)

    # reference: transformers' eager attention with output_attentions, same model, same cache
    config = tiny_model.text_config
    previous, config._attn_implementation = config._attn_implementation, "eager"
    try:
        positions = torch.arange(reference_cache.next_position, reference_cache.next_position + pseudo.shape[0])
        with torch.no_grad():
            out = tiny_model.language_model(inputs_embeds=pseudo[None], position_ids=positions[None],
                                            cache=reference_cache, use_cache=True, output_attentions=True)
    finally:
        config._attn_implementation = previous
    cached = cache.num_tokens
    assert len(probed) == len(out.attentions) == 4
    for layer, weights in enumerate(out.attentions):  # (1, H, Q, T + Q)
        torch.testing.assert_close(probed[layer], weights[0, :, :, :cached].mean(dim=0), atol=1e-6, rtol=1e-5)
    # the deeper layers see propagated hidden states: their attention differs from layer 0's
    assert not torch.allclose(probed[0], probed[3])

    after = [t for kv in cache.layer_tensors() for t in kv] + [getattr(cache, n) for n in METADATA]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert config._attn_implementation == previous


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups", [1, 7])
@pytest.mark.parametrize("block_heads", [None, 1, 2])
def test_grouped_probe_equals_repeat_interleave_in_float32(dtype, groups, block_heads, monkeypatch):
    """The grouped probe (no widened K/V) gives the scores of the straightforward computation: keys and
    values repeated over query groups, everything in float32, weights averaged over heads; in one batch
    of all heads, or (as on a CPU at long caches) in blocks of 1 or 2 of the 3 KV heads."""
    gen = torch.Generator().manual_seed(groups)
    kv_heads, q_len, cached, dim = 3, 5, 37, 16
    if block_heads is not None:
        monkeypatch.setattr(hermes.probe, "CPU_SCORE_BLOCK_BYTES", block_heads * 4 * groups * q_len * (cached + q_len))
        assert hermes.probe.kv_heads_per_block(kv_heads, groups * q_len, cached + q_len, torch.device("cpu")) == block_heads
    t_len = cached + q_len
    query = torch.randn(1, kv_heads * groups, q_len, dim, generator=gen).to(dtype)
    key = torch.randn(1, kv_heads, t_len, dim, generator=gen).to(dtype)
    value = torch.randn(1, kv_heads, t_len, dim, generator=gen).to(dtype)
    scaling = dim ** -0.5

    k32 = key.float().repeat_interleave(groups, dim=1)
    v32 = value.float().repeat_interleave(groups, dim=1)
    scores = query.float() @ k32.transpose(2, 3) * scaling  # (1, Hq, Q, T)
    scores[..., cached:] = scores[..., cached:].masked_fill(torch.ones(q_len, q_len, dtype=torch.bool).triu(1),
                                                             float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    expected_maps = weights[0, :, :, :cached].mean(dim=0)  # (Q, T)
    expected_out = (weights @ v32).transpose(1, 2)  # (1, Q, Hq, D)

    module = types.SimpleNamespace(layer_idx=0, num_key_value_groups=groups)
    recorder = hermes.probe._ProbeRecorder(num_layers=2, cached=cached)  # layer 0 is not the last
    out, _ = hermes.probe.probe_attention_forward(module, query, key, value, None, scaling, recorder=recorder)
    maps = recorder.maps[0]
    assert maps.dtype == torch.float32
    torch.testing.assert_close(maps, expected_maps, atol=1e-6, rtol=1e-5)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected_out, **tol)


# ---- prefill_chunk: the chunk's forward computes only what the cache keeps, and carries the probe ----


def _primed(model, frames):
    """A cache holding the prefix and two chunks of `frames`, and the next chunk placed after it."""
    session = StreamingSession(model, "full", frames[:4], chunk_frames=2)
    session.advance()
    chunk = model.encode_chunk([f.rgb for f in frames[4:6]], [f.t_s for f in frames[4:6]])
    return session.cache, chunk, session.cache.place(chunk.layout)


@pytest.mark.parametrize("name", ["tiny-llava-onevision", "tiny-qwen3-vl"])  # 1-D RoPE; M-RoPE with DeepStack inputs
def test_a_probe_riding_in_the_chunks_prefill_gives_the_maps_and_cache_of_a_separate_probe(name):
    from hermes.config import ModelConfig
    from hermes.models.loading import load_model
    from hermes.probe import prefill_chunk

    model = load_model(ModelConfig(name=name, max_new_tokens=2))
    frames = random_frames(6, size=(32, 32))
    pseudo = torch.cat([model.question_embeds("What is happening?"), model.question_embeds("Describe it.")])
    separate, chunk, positions = _primed(model, frames)
    model.prefill(chunk.embeds, positions, separate, **chunk.model_kwargs)
    expected_maps = probe_attention(model, separate, pseudo)

    fused, chunk, positions = _primed(model, frames)
    maps = prefill_chunk(model, fused, chunk.embeds, positions, pseudo, **chunk.model_kwargs)

    assert maps.shape == expected_maps.shape == (model.num_layers, pseudo.shape[0], separate.num_tokens)
    torch.testing.assert_close(maps, expected_maps, atol=1e-6, rtol=1e-5)
    # the pseudo-query's tokens are gone again; the chunk's keys and values are those of a plain prefill
    assert fused.num_tokens == separate.num_tokens and fused.next_position == separate.next_position
    for (k1, v1), (k2, v2) in zip(fused.layer_tensors(), separate.layer_tensors()):
        torch.testing.assert_close(k1, k2, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(v1, v2, atol=1e-6, rtol=1e-5)
    assert model.text_config._attn_implementation == "hermes_sdpa"  # a pass's attention is passed, not selected


def test_a_chunks_prefill_stops_inside_the_last_layer_once_its_keys_and_values_are_cached(tiny_model):
    from hermes.probe import prefill_chunk

    frames = random_frames(6, size=(32, 32))
    last_mlp = tiny_model.language_model.layers[-1].mlp
    runs = []
    hook = last_mlp.register_forward_hook(lambda *args: runs.append(1))
    try:
        plain, chunk, positions = _primed(tiny_model, frames)
        before = len(runs)
        tiny_model.prefill(chunk.embeds, positions, plain)
        assert len(runs) == before + 1  # the model's own prefill runs the last layer through
        lean, chunk, positions = _primed(tiny_model, frames)
        before = len(runs)
        assert prefill_chunk(tiny_model, lean, chunk.embeds, positions) is None
        assert len(runs) == before  # what only the last layer's output needs never runs
    finally:
        hook.remove()
    assert lean.num_tokens == plain.num_tokens
    for (k1, v1), (k2, v2) in zip(lean.layer_tensors(), plain.layer_tensors()):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)


def test_an_unrecorded_pseudo_query_rides_to_the_last_layer_and_leaves_the_chunk_as_a_plain_prefill(tiny_model):
    """`record=False` (`bench overhead --floor`): the pseudo-query's rows are computed through every layer,
    nothing is recorded, and the cache holds exactly what a plain prefill leaves."""
    from hermes.probe import prefill_chunk

    frames = random_frames(6, size=(32, 32))
    pseudo = tiny_model.question_embeds("What is happening?")
    rows_seen = []
    hook = tiny_model.language_model.layers[-1].self_attn.q_proj.register_forward_hook(
        lambda module, inputs, output: rows_seen.append(inputs[0].shape[-2]))
    try:
        plain, chunk, positions = _primed(tiny_model, frames)
        tiny_model.prefill(chunk.embeds, positions, plain)
        riding, chunk, positions = _primed(tiny_model, frames)
        rows_seen.clear()
        assert prefill_chunk(tiny_model, riding, chunk.embeds, positions, pseudo, record=False) is None
    finally:
        hook.remove()
    assert rows_seen == [chunk.embeds.shape[0] + pseudo.shape[0]]  # the last layer still computes the riding rows
    assert riding.num_tokens == plain.num_tokens and riding.next_position == plain.next_position
    for (k1, v1), (k2, v2) in zip(riding.layer_tensors(), plain.layer_tensors()):
        torch.testing.assert_close(k1, k2, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(v1, v2, atol=1e-6, rtol=1e-5)


def test_a_model_on_another_attention_kernel_is_prefilled_by_its_own_path_and_probed_apart(tiny_model):
    from hermes.probe import prefill_chunk

    frames = random_frames(6, size=(32, 32))
    pseudo = tiny_model.question_embeds("What is happening?")
    reference, chunk, positions = _primed(tiny_model, frames)
    expected = prefill_chunk(tiny_model, reference, chunk.embeds, positions, pseudo)
    tiny_model.set_attention("eager")
    try:
        cache, chunk, positions = _primed(tiny_model, frames)
        maps = prefill_chunk(tiny_model, cache, chunk.embeds, positions, pseudo)
        assert tiny_model.text_config._attn_implementation == "hermes_eager"
    finally:
        tiny_model.set_attention("sdpa")
    torch.testing.assert_close(maps, expected, atol=1e-5, rtol=1e-4)
    assert cache.num_tokens == reference.num_tokens


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-llava-onevision", "tiny-qwen2.5-vl", "tiny-smolvlm2"])
def test_hermes_streams_the_same_memory_with_the_probe_in_the_prefill_as_with_a_pass_of_its_own(name, monkeypatch):
    from hermes.config import MemoryConfig, ModelConfig
    from hermes.memory import HermesPolicy
    from hermes.models.loading import load_model

    model = load_model(ModelConfig(name=name, max_new_tokens=3))
    frames = random_frames(12, size=(32, 32))

    def stream():
        session = StreamingSession(model, MemoryConfig(policy="hermes", budget=60), frames, chunk_frames=2)
        session.advance()
        return session, session.ask("What colour is it?")

    fused, fused_answer = stream()
    with monkeypatch.context() as m:
        m.setattr(HermesPolicy, "probe_queries", lambda self, cache, n_new: None)  # the probe runs in maintain
        apart, apart_answer = stream()
    assert sum(s.maintain_ms > 0 for s in fused.chunk_stats) >= 3  # it evicted, so it probed
    assert torch.equal(fused.cache.token_ids, apart.cache.token_ids)
    torch.testing.assert_close(fused.memory.last_scores, apart.memory.last_scores, atol=1e-6, rtol=1e-5)
    for (k1, v1), (k2, v2) in zip(fused.cache.layer_tensors(), apart.cache.layer_tensors()):
        torch.testing.assert_close(k1, k2, atol=1e-6, rtol=1e-5)
    assert fused_answer.answer == apart_answer.answer


@pytest.mark.parametrize("probe_text", ["question", "bare"])
def test_the_pseudo_query_rides_as_a_question_or_as_its_bare_tokens(tiny_model, monkeypatch, probe_text):
    """`memory.probe_text`: "bare" probes with the texts' own tokens, as the reference tokenizes them, and
    nothing else; "question" (the default) wraps each text as a question is asked."""
    import hermes.pipelines.session as session_module
    from hermes.config import MemoryConfig

    cfg = MemoryConfig(policy="hermes", budget=2 * tiny_model.tokens_per_frame, probe_text=probe_text)
    local = tiny_model.tokenizer.encode(cfg.local_query, add_special_tokens=False)
    glob = tiny_model.tokenizer.encode(cfg.global_query, add_special_tokens=False)
    rides = []
    real = session_module.prefill_chunk

    def logged(model, cache, embeds, positions, probe_embeds=None, **kwargs):
        if probe_embeds is not None:
            rides.append(probe_embeds.clone())
        return real(model, cache, embeds, positions, probe_embeds, **kwargs)

    monkeypatch.setattr(session_module, "prefill_chunk", logged)
    session = StreamingSession(tiny_model, cfg, random_frames(8, size=(32, 32)), chunk_frames=2)
    session.advance()
    assert rides  # chunks past the budget carried the pseudo-query
    if probe_text == "bare":
        expected = tiny_model.embed_ids(local + glob).to(rides[0].dtype)
        assert rides[0].shape[0] == len(local) + len(glob) and torch.equal(rides[0], expected)
    else:
        assert rides[0].shape[0] > len(local) + len(glob) + 4  # each text framed as an asked question
        torch.testing.assert_close(rides[0], torch.cat([tiny_model.question_embeds(cfg.local_query),
                                                        tiny_model.question_embeds(cfg.global_query)]))
    assert session.cache.num_visual_tokens <= cfg.budget
    session.close()
