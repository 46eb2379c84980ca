"""Golden tests of hermes.scoring on constructed inputs; expected numbers are worked out from the formulas."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding, apply_rotary_pos_emb
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

from hermes.rope import RotarySpec
from hermes.scoring import (
    BANDS,
    MINMAX_EPS,
    accumulate,
    combine_layer_scores,
    fold_summary,
    layer_bands,
    minmax,
    recency_rates,
    recency_scores,
    select_keep,
    smooth_deep_to_shallow,
    working_mix_weights,
)

# --- bands and mixing weights -------------------------------------------------------------------


@pytest.mark.parametrize(
    "layers, first_working, first_long",
    [(24, 2, 16), (28, 2, 19), (32, 3, 22), (30, 3, 21), (10, 1, 7), (3, 1, 2), (4, 1, 2)],
)
def test_band_boundaries(layers, first_working, first_long):
    bands = layer_bands(layers)
    expect = ["sensory"] * first_working + ["working"] * (first_long - first_working)
    expect += ["longterm"] * (layers - first_long)
    assert bands == expect
    assert set(bands) == set(BANDS)  # every band present when L >= 3


def test_band_edge_cases():
    assert layer_bands(0) == []
    assert layer_bands(1) == ["longterm"]
    assert layer_bands(2) == ["working", "longterm"]
    assert layer_bands(10, (0.2, 0.5, 0.3)) == ["sensory"] * 2 + ["working"] * 5 + ["longterm"] * 3
    with pytest.raises(ValueError):
        layer_bands(10, (0.5, 0.6, 0.3))
    with pytest.raises(ValueError):
        layer_bands(10, (0.5, 0.5))


def test_working_mix_weights_fall_linearly():
    bands = layer_bands(28)  # sensory 0-1, working 2-18, long-term 19-27
    w = working_mix_weights(bands)
    assert w.shape == (28,) and w.dtype == torch.float32
    assert w[:2].tolist() == [1.0, 1.0]
    assert w[19:].tolist() == [0.0] * 9
    for layer in range(2, 19):
        assert w[layer].item() == pytest.approx(0.75 - 0.6 * (layer - 2) / (19 - 2))
    assert w[18].item() == pytest.approx(0.75 - 0.6 * 16 / 17)


# --- recency and normalisation ------------------------------------------------------------------


def test_recency_scores_normalised_distance():
    r = recency_scores(torch.arange(5), k=20.0)
    expect = [math.exp(-20.0 * (4 - i) / 4) for i in range(5)]
    assert r.tolist() == pytest.approx(expect)
    # explicit newest and span: d = (10 - t) / 5
    r = recency_scores(torch.tensor([0, 5, 10]), newest=10, k=2.0, span=5.0)
    assert r.tolist() == pytest.approx([math.exp(-4.0), math.exp(-2.0), 1.0])
    # rows are normalised independently
    rows = recency_scores(torch.tensor([[0, 1, 2], [10, 20, 30]]), k=1.0)
    assert torch.allclose(rows[0], rows[1])
    # frames: all tokens of a frame share one score
    frames = recency_scores(torch.tensor([0, 0, 1, 1, 2, 2]))
    assert frames[0] == frames[1] and frames[4] == frames[5] == 1.0


def test_minmax_edge_cases():
    x = torch.tensor([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0], [-2.0, 0.0, 2.0]])
    out = minmax(x)
    assert out.tolist() == [[0.0, 0.5, 1.0], [0.0, 0.0, 0.0], [0.0, 0.5, 1.0]]
    assert minmax(torch.tensor([7.0])).tolist() == [0.0]
    assert minmax(torch.zeros(0)).shape == (0,)
    assert not torch.isnan(minmax(torch.full((4, 4), 1e-30))).any()
    # along another dim
    assert minmax(x.t(), dim=0).tolist() == out.t().tolist()
    # masked entries neither count for min/max nor get a score
    mask = torch.tensor([True, True, False, True])
    assert minmax(torch.tensor([1.0, 3.0, 100.0, 2.0]), mask=mask).tolist() == [0.0, 1.0, 0.0, 0.5]
    assert minmax(torch.tensor([1.0, 9.0]), mask=torch.tensor([True, False])).tolist() == [0.0, 0.0]


def test_combine_layer_scores_by_hand():
    bands = ["sensory", "working", "longterm"]  # w = 1, 0.75, 0
    recency = torch.tensor([[0.0, 0.5, 1.0]] * 3)
    attention = torch.tensor([[4.0, 2.0, 0.0], [0.0, 1.0, 4.0], [3.0, 1.0, 2.0]])
    s = combine_layer_scores(recency, attention, bands)
    a = [[1.0, 0.5, 0.0], [0.0, 0.25, 1.0], [1.0, 0.0, 0.5]]  # min-max normalised attention
    r = [0.0, 0.5, 1.0]
    expect = [
        r,
        [0.25 * a[1][i] + 0.75 * r[i] for i in range(3)],
        a[2],
    ]
    assert torch.allclose(s, torch.tensor(expect))
    with pytest.raises(ValueError):
        combine_layer_scores(recency, attention[:2], bands)


def test_sensory_layers_keep_exactly_the_newest_tokens():
    layers, tokens, budget = 10, 40, 12
    bands = layer_bands(layers)
    gen = torch.Generator().manual_seed(0)
    attention = torch.rand(layers, tokens, generator=gen)
    recency = recency_scores(torch.arange(tokens).expand(layers, tokens))
    scores = combine_layer_scores(recency, attention, bands)
    sensory = [i for i, b in enumerate(bands) if b == "sensory"]
    assert sensory == [0]
    assert torch.equal(scores[0], minmax(recency[0], eps=MINMAX_EPS))  # attention has no say at all
    assert select_keep(scores[0], budget).tolist() == list(range(tokens - budget, tokens))
    # with frame indices as time, whole newest frames survive; the tie inside the oldest kept
    # frame goes to its newer tokens
    per_frame = 4
    frames = torch.arange(tokens) // per_frame
    scores = combine_layer_scores(recency_scores(frames).expand(layers, tokens), attention, bands)
    assert select_keep(scores[0], 8).tolist() == list(range(tokens - 8, tokens))
    assert select_keep(scores[0], 6).tolist() == list(range(tokens - 6, tokens))


# --- smoothing, accumulation, selection ---------------------------------------------------------


def test_smoothing_moves_scores_exactly_as_the_formula():
    bands = ["sensory", "working", "longterm"]  # lambda 0.1, 0.3, 0.4
    ids = [torch.tensor([13, 11, 10]), torch.tensor([12, 10, 13]), torch.tensor([10, 11, 12])]
    scores = [torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.2, 0.4, 0.6]), torch.tensor([1.0, 0.5, 0.0])]
    out = smooth_deep_to_shallow(scores, ids, bands)
    # deepest layer is unchanged
    assert out[2].tolist() == pytest.approx([1.0, 0.5, 0.0])
    # working layer: id 12 -> 0.7*0.2 + 0.3*0.0; id 10 -> 0.7*0.4 + 0.3*1.0; id 13 absent below -> 0.7*0.6
    assert out[1].tolist() == pytest.approx([0.14, 0.58, 0.42])
    # sensory layer uses the *smoothed* working scores: id 13 -> 0.9*1 + 0.1*0.42; id 11 absent -> 0;
    # id 10 -> 0.9*0.5 + 0.1*0.58
    assert out[0].tolist() == pytest.approx([0.942, 0.0, 0.508])
    # custom lambdas
    out = smooth_deep_to_shallow(scores, ids, bands, lambdas=(0.0, 0.0, 0.0))
    assert all(torch.equal(o, s) for o, s in zip(out, scores))
    with pytest.raises(ValueError):
        smooth_deep_to_shallow(scores[:2], ids, bands)


def test_smoothing_by_index_pairs_entries_at_the_same_index_whatever_their_ids():
    """The reference's convention (`memory.smoothing_match: index`): the same scores and ids as above."""
    bands = ["sensory", "working", "longterm"]
    ids = [torch.tensor([13, 11, 10]), torch.tensor([12, 10, 13]), torch.tensor([10, 11, 12])]
    scores = [torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.2, 0.4, 0.6]), torch.tensor([1.0, 0.5, 0.0])]
    out = smooth_deep_to_shallow(scores, ids, bands, match="index")
    assert out[1].tolist() == pytest.approx([0.44, 0.43, 0.42])  # 0.7 * [0.2, 0.4, 0.6] + 0.3 * [1.0, 0.5, 0.0]
    assert out[0].tolist() == pytest.approx([0.944, 0.043, 0.492])  # 0.9 * [1, 0, 0.5] + 0.1 * out[1]
    with pytest.raises(ValueError, match="equal length"):
        smooth_deep_to_shallow([scores[0], scores[1][:2], scores[2]], [ids[0], ids[1][:2], ids[2]], bands, match="index")


def test_deep_attention_rescues_a_token_in_a_working_layer():
    layers, tokens, budget = 10, 8, 3
    bands = layer_bands(layers)  # sensory 0, working 1-6, long-term 7-9
    recency = recency_scores(torch.arange(tokens).expand(layers, tokens))
    attention = torch.full((layers, tokens), 0.3)
    attention[:, 0] = 0.0  # token 0: no attention in the shallow and middle layers ...
    attention[:, -1] = 1.0
    attention[7:] = 0.0
    attention[7:, 0] = 1.0  # ... but the anchor of every long-term layer
    scores = combine_layer_scores(recency, attention, bands)
    assert 0 not in select_keep(scores[6], budget).tolist()  # alone, layer 6 would evict it

    ids = [torch.arange(tokens)] * layers
    smoothed = smooth_deep_to_shallow(list(scores), ids, bands)
    # long-term: token 0 scores 1 in layers 9, 8, 7 (1 mixed with 1); layer 6: 0.7*0 + 0.3*1
    assert smoothed[7][0].item() == pytest.approx(1.0)
    assert smoothed[6][0].item() == pytest.approx(0.3)
    assert smoothed[6][0] > smoothed[6][1:7].max()
    assert select_keep(smoothed[6], budget).tolist() == [0, 6, 7]


def test_smoothing_layers_of_equal_length_matches_tokens_by_id_as_token_by_token():
    """Layers holding equally many tokens (a cache's) take the batched lookup; the result must be what
    the recurrence gives token by token: a deeper layer's smoothed score of the same id, 0 where absent."""
    gen = torch.Generator().manual_seed(3)
    layers, tokens = 5, 12
    bands = layer_bands(layers)
    # each layer holds 12 of ids 0..19 in its own order (evictions differ by layer)
    ids = [torch.randperm(20, generator=gen)[:tokens] for _ in range(layers)]
    scores = [torch.rand(tokens, generator=gen) for _ in range(layers)]
    lambdas = (0.1, 0.3, 0.4)
    expected = [None] * layers
    expected[-1] = {int(i): float(s) for i, s in zip(ids[-1], scores[-1])}
    for layer in range(layers - 2, -1, -1):
        lam = lambdas[("sensory", "working", "longterm").index(bands[layer])]
        expected[layer] = {int(i): (1 - lam) * float(s) + lam * expected[layer + 1].get(int(i), 0.0)
                           for i, s in zip(ids[layer], scores[layer])}
    out = smooth_deep_to_shallow(scores, ids, bands, lambdas)
    for layer in range(layers):
        assert out[layer].tolist() == pytest.approx([expected[layer][int(i)] for i in ids[layer]], abs=1e-6)


def test_a_summary_scored_minus_infinity_leaves_the_selection_among_the_others_as_it_was():
    """Long-term layers select budget - 1 tokens among those that are not the summary: in one batch, with the
    summary scored -inf, the kept tokens must be those a selection among the others alone keeps, ties included."""
    gen = torch.Generator().manual_seed(5)
    layers, tokens, keep = 3, 40, 17
    scores = (torch.rand(layers, tokens, generator=gen) * 4).round() / 4  # few distinct values: many ties
    summary_at = [0, 23, 39]
    is_summary = torch.zeros(layers, tokens, dtype=torch.bool)
    is_summary[torch.arange(layers), summary_at] = True
    batched = select_keep(scores.masked_fill(is_summary, -math.inf), keep)
    for layer in range(layers):
        candidates = (~is_summary[layer]).nonzero().squeeze(1)
        assert batched[layer].tolist() == candidates[select_keep(scores[layer, candidates], keep)].tolist()


def test_accumulate_by_id():
    prev = (torch.tensor([5, 6, 7]), torch.tensor([1.0, 2.0, 3.0]))
    new, ids = torch.tensor([10.0, 10.0, 10.0]), torch.tensor([6, 7, 8])  # id 5 left the cache, id 8 is new
    assert accumulate(prev, new, ids, "none").tolist() == [10.0, 10.0, 10.0]  # the fresh probe alone
    assert accumulate(prev, new, ids, "sum").tolist() == [12.0, 13.0, 10.0]
    # ema: 0.5 * old + 0.5 * new for tokens seen before; a new token starts at its first value
    assert accumulate(prev, new, ids, "ema", decay=0.5).tolist() == [6.0, 6.5, 10.0]
    assert accumulate(None, torch.tensor([1.0, 2.0]), torch.tensor([0, 1]), "sum").tolist() == [1.0, 2.0]
    # rows that share the ids (e.g. several probes) accumulate together
    prev = (torch.tensor([3, 1]), torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    acc = accumulate(prev, torch.ones(2, 3), torch.tensor([1, 2, 3]), "sum")
    assert acc.tolist() == [[3.0, 1.0, 2.0], [5.0, 1.0, 4.0]]
    with pytest.raises(ValueError, match="accumulation must be one of"):
        accumulate(prev, torch.ones(2, 3), torch.tensor([1, 2, 3]), "max")


def test_steady_attention_keeps_old_and_new_tokens_level_under_ema_but_not_under_a_sum():
    """Every probe gives every token the same attention: a sum ranks tokens by age, an EMA does not."""
    running = {"sum": None, "ema": None}
    ids = torch.arange(0)
    for chunk in range(10):
        ids = torch.cat([ids, torch.arange(chunk * 4, chunk * 4 + 4)])
        for mode in running:
            acc = accumulate(running[mode], torch.full((ids.numel(),), 0.25), ids, mode, decay=0.8)
            running[mode] = (ids, acc)
    assert running["sum"][1][0] == pytest.approx(2.5) and running["sum"][1][-1] == pytest.approx(0.25)
    assert torch.allclose(running["ema"][1], torch.full((40,), 0.25))


def test_forgetting_rate_ramps_across_the_working_band():
    bands = layer_bands(10)  # sensory 0, working 1-6, long-term 7-9: p = (l - 1) / 6
    rates = recency_rates(bands)
    expect = [20.0] + [20.0 - 12.0 * (l - 1) / 6 for l in range(1, 7)] + [20.0] * 3
    assert rates.tolist() == pytest.approx(expect)
    assert recency_rates(bands, k=20.0, fall=0.0).tolist() == [20.0] * 10  # one rate everywhere
    # per-layer rates broadcast over rows: a deeper working layer forgets more slowly
    rec = recency_scores(torch.arange(5).expand(10, 5), k=rates.unsqueeze(1))
    assert rec[6, 0] > rec[1, 0] and rec[1, 0] == pytest.approx(math.exp(-20.0))
    assert rec[6, 0].item() == pytest.approx(math.exp(-(20.0 - 12.0 * 5 / 6)))


def test_select_keep_is_top_budget_in_time_order():
    scores = torch.tensor([0.5, 0.9, 0.5, 0.1, 0.5])
    assert select_keep(scores, 2).tolist() == [1, 4]  # tie among 0, 2, 4 goes to the newest
    assert select_keep(scores, 3).tolist() == [1, 2, 4]
    assert select_keep(scores, 9).tolist() == [0, 1, 2, 3, 4]
    assert select_keep(scores, 0).tolist() == []
    assert select_keep(torch.zeros(6), 2).tolist() == [4, 5]  # constant row -> sliding window
    rows = torch.tensor([[3.0, 1.0, 2.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
    assert select_keep(rows, 2).tolist() == [[0, 2], [2, 3]]
    with pytest.raises(ValueError):
        select_keep(scores, -1)


def test_select_keep_equals_a_stable_ranking_on_rows_full_of_ties():
    """On rows like a cache's (many ties, -inf for excluded entries), every budget keeps exactly the tokens a
    stable ranking by score, the newer first among equals, puts first."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 6, (4, 40), generator=gen).float() / 5
    rows[1, :7] = -math.inf
    rows[2] = 0.5
    for budget in (1, 7, 20, 33, 39):
        expected = [sorted(sorted(range(40), key=lambda i: (-row[i].item(), -i))[:budget]) for row in rows]
        assert select_keep(rows, budget).tolist() == expected


# --- summary token ------------------------------------------------------------------------------

HEADS, DIM = 2, 32


def _reference(layout: str):
    """transformers rotary module + matching hermes spec for 1-D, Qwen2-VL or Qwen3-VL RoPE."""
    base = {"hidden_size": HEADS * DIM, "num_attention_heads": HEADS, "num_key_value_heads": HEADS}
    if layout == "1d":
        cfg = Qwen2Config(**base, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        return Qwen2RotaryEmbedding(cfg), RotarySpec.from_text_config(cfg)
    if layout == "mrope":
        cfg = Qwen2VLTextConfig(**base, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                         "mrope_section": [4, 6, 6]})
        return Qwen2VLRotaryEmbedding(cfg), RotarySpec.from_text_config(cfg)
    cfg = Qwen3VLTextConfig(**base, head_dim=DIM, rope_parameters={
        "rope_type": "default", "rope_theta": 5e5, "mrope_section": [6, 5, 5], "mrope_interleaved": True})
    return Qwen3VLTextRotaryEmbedding(cfg), RotarySpec.from_text_config(cfg)


def _hf_rotate(module, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``x (H, T, D)`` rotated at ``positions`` by transformers."""
    cos, sin = module(x, positions.long().unsqueeze(-2))
    _, k = apply_rotary_pos_emb(x.unsqueeze(0), x.unsqueeze(0), cos, sin)
    return k.squeeze(0)


@pytest.mark.parametrize("layout", ["1d", "mrope", "interleaved"])
def test_fold_summary_matches_keys_rotated_at_the_target(layout):
    module, spec = _reference(layout)
    gen = torch.Generator().manual_seed(3)
    tokens = 5
    raw = torch.randn(HEADS, tokens, DIM, generator=gen)
    values = torch.randn(HEADS, tokens, DIM, generator=gen)
    counts = torch.tensor([1, 1, 1, 1, 4])  # the last one is an earlier summary standing for 4 tokens
    if layout == "1d":
        positions = torch.tensor([3, 10, 50, 51, 200])
        target = torch.tensor(60)
    else:
        positions = torch.tensor([[3, 10, 50, 51, 200], [4, 12, 50, 52, 200], [5, 11, 53, 51, 200]])
        target = torch.tensor([60, 61, 62])
    keys = _hf_rotate(module, raw, positions)  # stored keys, rotated where they were
    summary = fold_summary(keys, values, counts, positions, target, spec)

    weight = counts.float() / counts.sum()
    at_target = target.expand(tokens) if layout == "1d" else target[:, None].expand(3, tokens)
    expect_key = (_hf_rotate(module, raw, at_target) * weight[:, None]).sum(dim=1, keepdim=True)
    expect_value = (values * weight[:, None]).sum(dim=1, keepdim=True)
    assert summary.key.shape == (HEADS, 1, DIM) and summary.value.shape == (HEADS, 1, DIM)
    torch.testing.assert_close(summary.key, expect_key, atol=1e-5, rtol=0)
    torch.testing.assert_close(summary.value, expect_value, atol=1e-6, rtol=0)
    assert int(summary.count) == 8


def test_fold_summary_values_weighted_by_counts_and_dtype_kept():
    _, spec = _reference("1d")
    values = torch.tensor([[[0.0, 0.0], [4.0, 8.0]]]).repeat(1, 1, DIM // 2).to(torch.bfloat16)  # (1, 2, D)
    keys = torch.zeros(1, 2, DIM, dtype=torch.bfloat16)
    summary = fold_summary(keys, values, torch.tensor([3, 1]), torch.tensor([0, 7]), 7, spec)
    assert summary.value.dtype == torch.bfloat16 and summary.key.dtype == torch.bfloat16
    assert summary.value[0, 0, :2].tolist() == [1.0, 2.0]  # (3*0 + 1*4) / 4, (3*0 + 1*8) / 4
    assert int(summary.count) == 4
    plain = fold_summary(keys, values, torch.tensor([3, 1]), torch.tensor([0, 7]), 7, spec, weighted=False)
    assert plain.value[0, 0, :2].tolist() == [2.0, 4.0]  # the reference's plain mean: (0 + 4) / 2, (0 + 8) / 2
    assert int(plain.count) == 4  # it still stands for every token folded


def test_fold_summary_rejects_bad_input():
    _, spec = _reference("1d")
    keys = torch.zeros(1, 2, DIM)
    with pytest.raises(ValueError):
        fold_summary(keys, keys, torch.tensor([1, 0]), torch.tensor([0, 1]), 2, spec)
    with pytest.raises(ValueError):
        fold_summary(keys[:, :0], keys[:, :0], torch.zeros(0, dtype=torch.long), torch.zeros(0), 2, spec)
    with pytest.raises(ValueError):
        fold_summary(keys, keys, torch.tensor([1, 1, 1]), torch.tensor([0, 1]), 2, spec)
