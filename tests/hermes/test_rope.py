"""Golden tests of hermes.rope against transformers' own rotary code (Qwen2, Qwen2-VL, Qwen3-VL).

The reference key at a position is always produced by transformers 5.24 (rotary embedding module +
``apply_rotary_pos_emb``); hermes only re-rotates it and must land where transformers would.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlavaOnevisionConfig, Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding, apply_rotary_pos_emb
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

from hermes.errors import ModelError
from hermes.rope import RotarySpec, freq_axes, inv_freq, rotate_at, rotate_between, rotate_keys, rotate_rows_between

HEADS, DIM = 2, 32
THETA = 1_000_000.0
SECTION_2VL = (4, 6, 6)  # sums to DIM / 2
SECTION_3VL = (6, 5, 5)


def _qwen2_config() -> Qwen2Config:
    return Qwen2Config(hidden_size=HEADS * DIM, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                       rope_parameters={"rope_type": "default", "rope_theta": THETA})


def _reference(layout: str):
    """(transformers rotary module, hermes spec) for '1d', 'mrope' (Qwen2-VL) or 'interleaved' (Qwen3-VL)."""
    if layout == "1d":
        cfg = _qwen2_config()
        return Qwen2RotaryEmbedding(cfg), RotarySpec.from_text_config(cfg)
    if layout == "mrope":
        cfg = Qwen2VLTextConfig(hidden_size=HEADS * DIM, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                                rope_parameters={"rope_type": "default", "rope_theta": THETA,
                                                 "mrope_section": list(SECTION_2VL)})
        return Qwen2VLRotaryEmbedding(cfg), RotarySpec.from_text_config(cfg)
    cfg = Qwen3VLTextConfig(hidden_size=HEADS * DIM, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                            head_dim=DIM, rope_parameters={"rope_type": "default", "rope_theta": THETA,
                                                           "mrope_section": list(SECTION_3VL),
                                                           "mrope_interleaved": True})
    return Qwen3VLTextRotaryEmbedding(cfg), RotarySpec.from_text_config(cfg)


def hf_rotate(module, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotate unrotated ``x (B, H, T, D)`` at ``positions`` ((T,) or (3, T)) with transformers."""
    pos_ids = positions.long().unsqueeze(-2)  # (1, T) or (3, 1, T): batch of one
    cos, sin = module(x, pos_ids)
    _, k = apply_rotary_pos_emb(x, x, cos, sin)
    return k


def _keys(dtype=torch.float32, tokens=12, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, HEADS, tokens, DIM, generator=gen).to(dtype)


def _positions(layout: str, tokens: int, high: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shape = (tokens,) if layout == "1d" else (3, tokens)
    return torch.randint(0, high, shape, generator=gen)


# --- spec --------------------------------------------------------------------------------------


def test_inv_freq_matches_transformers_bitwise():
    for layout in ("1d", "mrope", "interleaved"):
        module, spec = _reference(layout)
        assert torch.equal(inv_freq(spec), module.inv_freq)
        assert inv_freq(spec).dtype == torch.float32 and inv_freq(spec).shape == (DIM // 2,)


def test_from_text_config_reads_transformers_configs():
    spec = RotarySpec.from_text_config(_qwen2_config())
    assert (spec.kind, spec.head_dim, spec.theta, spec.max_position_embeddings) == ("1d", DIM, THETA, 32768)
    assert spec.attention_scaling == 1.0

    _, two = _reference("mrope")
    assert (two.kind, two.mrope_section, two.mrope_interleaved) == ("mrope", SECTION_2VL, False)
    _, three = _reference("interleaved")
    assert (three.kind, three.mrope_section, three.mrope_interleaved) == ("mrope", SECTION_3VL, True)

    # defaults of the real models when the config names no section
    q25 = RotarySpec.from_text_config(Qwen2VLTextConfig())
    assert (q25.kind, q25.head_dim, q25.mrope_section) == ("mrope", 128, (16, 24, 24))
    assert not q25.mrope_interleaved
    q3 = RotarySpec.from_text_config(Qwen3VLTextConfig())
    assert (q3.mrope_section, q3.mrope_interleaved, q3.theta) == ((24, 20, 20), True, 500000.0)

    # a composite VLM config resolves to its text config (LLaVA-OneVision -> Qwen2, 1-D)
    llava = RotarySpec.from_text_config(LlavaOnevisionConfig())
    assert llava.kind == "1d"


def test_from_text_config_rejects_scaled_rope():
    cfg = Qwen2Config(hidden_size=64, num_attention_heads=2,
                      rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(ModelError):
        RotarySpec.from_text_config(cfg)


def test_spec_validation():
    with pytest.raises(ValueError):
        RotarySpec(head_dim=7)
    with pytest.raises(ValueError):
        RotarySpec(head_dim=32, kind="mrope", mrope_section=(4, 4, 4))
    with pytest.raises(ValueError):
        RotarySpec(head_dim=32, kind="2d")


def test_freq_axes_layouts():
    _, two = _reference("mrope")
    assert freq_axes(two).tolist() == [0] * 4 + [1] * 6 + [2] * 6
    _, three = _reference("interleaved")
    assert freq_axes(three).tolist() == [0, 1, 2] * 5 + [0]


@pytest.mark.parametrize("layout", ["1d", "mrope", "interleaved"])
def test_rotate_at_matches_transformers(layout):
    module, spec = _reference(layout)
    x = _keys()
    pos = _positions(layout, x.shape[-2], 3000, seed=1)
    torch.testing.assert_close(rotate_at(x, pos, spec), hf_rotate(module, x, pos), atol=1e-5, rtol=0)


# --- re-rotation -------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["1d", "mrope", "interleaved"])
def test_rerotated_key_equals_key_rotated_at_target_fp32(layout):
    module, spec = _reference(layout)
    x = _keys()
    p = _positions(layout, x.shape[-2], 20000, seed=2)
    q = _positions(layout, x.shape[-2], 20000, seed=3)
    at_p, at_q = hf_rotate(module, x, p), hf_rotate(module, x, q)
    moved = rotate_keys(at_p, q - p, spec, positions=p)
    assert moved.dtype == torch.float32
    torch.testing.assert_close(moved, at_q, atol=1e-5, rtol=0)
    torch.testing.assert_close(rotate_between(at_p, p, q, spec), moved, atol=0, rtol=0)


@pytest.mark.parametrize("layout", ["1d", "mrope", "interleaved"])
def test_rows_turned_in_one_batch_equal_each_row_turned_alone_bit_for_bit(layout):
    """`rotate_rows_between` (every layer's keys at once) lands where transformers puts each row's keys, and
    bit for bit where `rotate_between` puts them row by row; a token that does not move is left as it was."""
    module, spec = _reference(layout)
    rows = [(_keys(tokens=7, seed=seed)[:1], _positions(layout, 7, 20000, seed=10 + seed),
             _positions(layout, 7, 20000, seed=20 + seed)) for seed in range(3)]
    rows[1][2][..., 2] = rows[1][1][..., 2]  # token 2 of row 1 stays
    at_p = torch.stack([hf_rotate(module, x, p)[0] for x, p, _ in rows])  # (3, H, 7, D)
    p, q = (torch.stack([r[i].reshape(-1, 7) for r in rows]) for i in (1, 2))
    turned = rotate_rows_between(at_p, p, q, spec)
    for row, (x, _, q_row) in enumerate(rows):
        assert torch.equal(turned[row], rotate_between(at_p[row], rows[row][1], q_row, spec))
        torch.testing.assert_close(turned[row], hf_rotate(module, x, q_row)[0], atol=1e-5, rtol=0)
    assert torch.equal(turned[1, :, 2], at_p[1, :, 2])


@pytest.mark.parametrize("layout", ["1d", "mrope", "interleaved"])
def test_delta_only_rotation_small_positions(layout):
    # Without the old positions the delta is exact but the model's own fp32 rounding at p cannot be
    # undone; at small positions that rounding is below 1e-5.
    module, spec = _reference(layout)
    x = _keys()
    p = _positions(layout, x.shape[-2], 40, seed=4)
    q = _positions(layout, x.shape[-2], 40, seed=5)
    moved = rotate_keys(hf_rotate(module, x, p), q - p, spec)
    torch.testing.assert_close(moved, hf_rotate(module, x, q), atol=1e-5, rtol=0)


def test_delta_only_rotation_is_exact_in_the_delta():
    # a huge delta is applied as the exact angle delta * inv_freq (float64 reference)
    _, spec = _reference("1d")
    x = _keys(tokens=4)
    delta = torch.tensor([-99995, 123457, 7, -1])
    moved = rotate_keys(x, delta, spec)
    ang = delta.double()[:, None] * inv_freq(spec).double()  # (T, D/2)
    x1, x2 = x.double()[..., : DIM // 2], x.double()[..., DIM // 2 :]
    expect = torch.cat((x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()), dim=-1)
    torch.testing.assert_close(moved.double(), expect, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", ["1d", "mrope", "interleaved"])
def test_rerotation_bf16(layout):
    module, spec = _reference(layout)
    x = _keys(torch.bfloat16)
    p = _positions(layout, x.shape[-2], 20000, seed=6)
    q = _positions(layout, x.shape[-2], 20000, seed=7)
    moved = rotate_keys(hf_rotate(module, x, p), q - p, spec, positions=p)
    at_q = hf_rotate(module, x, q)
    assert moved.dtype == torch.bfloat16
    # both sides carry bf16 rounding (transformers rounds cos/sin and products to bf16)
    torch.testing.assert_close(moved.float(), at_q.float(), atol=6e-2, rtol=2e-2)
    rel = (moved.float() - at_q.float()).norm() / at_q.float().norm()
    assert rel < 1e-2


def test_zero_delta_is_bit_identical():
    _, spec = _reference("1d")
    keys = _keys(torch.bfloat16)
    delta = torch.zeros(keys.shape[-2], dtype=torch.long)
    out = rotate_keys(keys, delta, spec)
    assert torch.equal(out, keys) and out is not keys
    delta[[1, 5]] = torch.tensor([3, -2])
    out = rotate_keys(keys, delta, spec, positions=torch.arange(keys.shape[-2]) + 10)
    still = [i for i in range(keys.shape[-2]) if i not in (1, 5)]
    assert torch.equal(out[..., still, :], keys[..., still, :])
    assert not torch.equal(out[..., 1, :], keys[..., 1, :])


def test_zero_delta_mrope_needs_all_axes_zero():
    _, spec = _reference("mrope")
    keys = _keys()
    delta = torch.zeros(3, keys.shape[-2], dtype=torch.long)
    delta[1, 2] = 1  # token 2 moves on the height axis only
    out = rotate_keys(keys, delta, spec)
    others = [i for i in range(keys.shape[-2]) if i != 2]
    assert torch.equal(out[..., others, :], keys[..., others, :])
    # only the height frequencies of token 2 changed
    axes = freq_axes(spec)
    changed = (out[..., 2, :] != keys[..., 2, :]).reshape(-1, 2, DIM // 2).any(dim=(0, 1))
    assert changed.tolist() == (axes == 1).tolist()


@pytest.mark.parametrize("layout", ["1d", "mrope", "interleaved"])
def test_large_positions_stay_accurate(layout):
    module, spec = _reference(layout)
    x = _keys(tokens=6)
    p = torch.full((x.shape[-2],), 100_000) if layout == "1d" else torch.full((3, x.shape[-2]), 100_000)
    p = p + torch.arange(x.shape[-2]) * 977  # up to ~105k, beyond a 32k context
    q = torch.full_like(p, 5) + torch.arange(x.shape[-2])
    moved = rotate_keys(hf_rotate(module, x, p), q - p, spec, positions=p)
    torch.testing.assert_close(moved, hf_rotate(module, x, q), atol=1e-5, rtol=0)
    # and back up again
    back = rotate_keys(moved, p - q, spec, positions=q)
    torch.testing.assert_close(back, hf_rotate(module, x, p), atol=1e-5, rtol=0)


def test_shape_errors():
    _, spec = _reference("1d")
    keys = _keys()
    with pytest.raises(ValueError):
        rotate_keys(keys, torch.zeros(3, keys.shape[-2], dtype=torch.long), spec)
    with pytest.raises(ValueError):
        rotate_keys(keys, torch.zeros(keys.shape[-2] + 1, dtype=torch.long), spec)
    _, mspec = _reference("mrope")
    with pytest.raises(ValueError):
        rotate_keys(keys, torch.zeros(keys.shape[-2], dtype=torch.long), mspec)
