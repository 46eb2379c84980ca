"""Summaries: anchors are the top-scoring tokens, the mean token is the hand-computed weighted mean."""

from __future__ import annotations

import pytest
import torch

from hermes.rope import RotarySpec, rotate_at, rotate_between
from hermes.tiers.records import Record
from hermes.tiers.summarise import summarise

SPEC_1D = RotarySpec(head_dim=8, theta=10000.0)
SPEC_M = RotarySpec(head_dim=8, kind="mrope", mrope_section=(2, 1, 1))


def _record(spec: RotarySpec, ns=(9, 3, 6), seed=0):
    """Keys built by rotating known raw vectors at known positions, so re-rotation can be checked by hand."""
    g = torch.Generator().manual_seed(seed)
    raw, keys, values, pos, scores, counts = [], [], [], [], [], []
    for n in ns:
        r = torch.randn(2, n, 8, generator=g, dtype=torch.float64).float()
        p = torch.randint(0, 500, (spec.num_axes, n), generator=g)
        pos_arg = p[0] if spec.kind == "1d" else p
        raw.append(r)
        keys.append(rotate_at(r, pos_arg, spec))
        values.append(torch.randn(2, n, 8, generator=g))
        pos.append(p)
        scores.append(torch.randperm(n, generator=g).float() / n)  # distinct scores: a unique top-k
        counts.append(torch.randint(1, 5, (n,), generator=g))
    rec = Record.build(5, keys, values, pos, [100 + torch.arange(n) for n in ns],
                       [torch.arange(n) // 2 for n in ns], scores, counts, t_start_s=0.0, t_end_s=4.0,
                       frame_start=0, frame_end=8)
    return rec, raw


@pytest.mark.parametrize("spec", [SPEC_1D, SPEC_M], ids=["1d", "mrope"])
def test_anchors_are_top_scores_and_mean_is_the_weighted_mean(spec):
    rec, raw = _record(spec)
    out = summarise(rec, anchors_per_layer=2, spec=spec)
    assert out.kind == "summary" and out.record_id == rec.record_id and out.value == rec.value
    assert torch.equal(out.embedding, rec.embedding)
    for layer, src, r in zip(out.layers, rec.layers, raw):
        n = src.num_tokens
        top = torch.topk(src.scores, 2).indices.sort().values  # the two best, in time order
        rest = torch.tensor([i for i in range(n) if i not in top.tolist()])
        assert layer.num_tokens == 3  # mean token + 2 anchors
        assert layer.token_ids.tolist() == [-1] + src.token_ids[top].tolist()
        assert layer.frame_index[0] == -1
        # anchors: untouched
        assert torch.equal(layer.keys[:, 1:], src.keys[:, top]) and torch.equal(layer.values[:, 1:], src.values[:, top])
        assert torch.equal(layer.positions[:, 1:], src.positions[:, top])
        # the mean token, by hand: weights c_i / sum c over the folded tokens
        c = src.counts[rest].double()
        w = c / c.sum()
        target = torch.round((src.positions[:, rest].double() * w).sum(dim=1)).long()  # (A,)
        assert torch.equal(layer.positions[:, 0], target)
        expect_v = (src.values[:, rest].double() * w[None, :, None]).sum(dim=1)
        assert torch.allclose(layer.values[:, 0].double(), expect_v, atol=1e-6)
        # keys: each raw key rotated directly to the target, then averaged
        at_target = target[:, None].expand(-1, len(rest))
        direct = rotate_at(r[:, rest], at_target[0] if spec.kind == "1d" else at_target, spec).double()
        expect_k = (direct * w[None, :, None]).sum(dim=1)
        assert torch.allclose(layer.keys[:, 0].double(), expect_k, atol=1e-4)
        assert layer.counts[0] == src.counts[rest].sum()
        assert layer.counts.sum() == src.counts.sum()  # the record stands for as many tokens as before
        assert layer.scores[0].item() == pytest.approx(float((src.scores[rest].double() * w).sum()), abs=1e-6)


def test_short_layers_are_kept_whole_and_rotate_function_matches_spec():
    rec, _ = _record(SPEC_1D, ns=(2, 7))
    via_spec = summarise(rec, anchors_per_layer=3, spec=SPEC_1D)
    assert via_spec.layers[0].num_tokens == 2 and torch.equal(via_spec.layers[0].keys, rec.layers[0].keys)
    assert via_spec.layers[1].num_tokens == 4
    via_fn = summarise(rec, anchors_per_layer=3, rotate=lambda k, old, new: rotate_between(k, old[0], new[0], SPEC_1D))
    for a, b in zip(via_spec.layers, via_fn.layers):
        assert torch.allclose(a.keys, b.keys, atol=1e-6) and torch.equal(a.values, b.values)


def test_int8_records_are_summarised_after_dequantising_and_zero_anchors_fold_everything():
    rec, _ = _record(SPEC_1D)
    out = summarise(rec.compress("int8"), anchors_per_layer=0, spec=SPEC_1D)
    assert out.storage == "fp32" and out.num_tokens() == [1, 1, 1]
    assert [l.counts.item() for l in out.layers] == [int(l.counts.sum()) for l in rec.layers]
    with pytest.raises(ValueError, match="exactly one"):
        summarise(rec, anchors_per_layer=2)
