"""Rotary position embeddings owned by hermes: re-rotating cached keys to new positions.

Cached keys are stored already rotated (docs/ARCHITECTURE.md, Memory, Positions). When positions are compacted, or
when evicted keys are folded into a summary token, a key rotated at position ``p`` must be moved to
position ``q`` without recomputing it from hidden states. RoPE rotates each frequency pair by an
angle proportional to the position, so moving a key means rotating every pair once more by the
angle difference ``theta(q) - theta(p)`` (paper, App. "Details of Position Re-Indexing":
``k_new = k_old * exp(i (p_new - p_old) theta)``, per M-RoPE section for 3-D positions).

Conventions follow Hugging Face transformers 5.24 exactly, so keys produced by the model and keys
moved here agree:

- 1-D RoPE (Qwen2 LM of LLaVA-OneVision, Llama LM of SmolVLM2): ``inv_freq[j] = theta^(-2j/D)``,
  angle ``= fp32(position) * inv_freq`` in fp32, and the "rotate_half" layout: the two halves of
  the head dimension hold the two coordinates of each pair (``x[j]`` pairs with ``x[j + D/2]``).
- M-RoPE (Qwen2-VL / Qwen2.5-VL, sectioned): positions are ``(3, T)`` (temporal, height, width);
  ``mrope_section`` splits the ``D/2`` frequencies into three contiguous runs, run ``i`` driven by
  axis ``i`` (``Qwen2VLRotaryEmbedding.recomposition_frequencies``).
- Interleaved M-RoPE (Qwen3-VL): frequency ``j`` is driven by height when ``j % 3 == 1`` and
  ``j < 3 * section[1]``, by width when ``j % 3 == 2`` and ``j < 3 * section[2]``, by time
  otherwise (``Qwen3VLTextRotaryEmbedding.recomposition_frequencies``).

Precision. A key at a large position was rotated by the model with the fp32-rounded angle
``fp32(p * inv_freq)``; at p = 100000 that rounding alone is about 4e-3 rad. Rotating by
``(q - p) * inv_freq`` can therefore never land exactly where the model would have put the key at
``q``. When the caller passes the key's current positions, `rotate_keys` instead builds the delta
rotation from the model's own fp32 cos/sin at ``p`` and at ``q`` with the angle-difference
identities (cos(a-b) = cos a cos b + sin a sin b, ...), which undoes the model's rounding and stays
fp32-accurate at any position. Without positions the delta angle is formed in float64 (where the
device has it) so at least the delta itself is exact.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from hermes.errors import ModelError

# Model types whose text model uses M-RoPE, with the section default their rotary module falls back
# to when the config does not name one (transformers 5.24), and whether the layout is interleaved.
_MROPE_DEFAULTS: dict[str, tuple[tuple[int, int, int], bool]] = {
    "qwen2_vl": ((16, 24, 24), False),
    "qwen2_vl_text": ((16, 24, 24), False),
    "qwen2_5_vl": ((16, 24, 24), False),
    "qwen2_5_vl_text": ((16, 24, 24), False),
    "qwen3_vl": ((24, 20, 20), True),
    "qwen3_vl_text": ((24, 20, 20), True),
    "qwen3_vl_moe": ((24, 20, 20), True),
    "qwen3_vl_moe_text": ((24, 20, 20), True),
}


@dataclass(frozen=True)
class RotarySpec:
    """Which rotary scheme a model's text decoder uses.

    Attributes:
        head_dim: Size D of one attention head (even).
        theta: RoPE base (``rope_theta``).
        kind: ``"1d"`` (one position per token) or ``"mrope"`` (temporal/height/width positions).
        mrope_section: For ``"mrope"``: frequency pairs per axis (t, h, w), summing to ``D / 2``,
            as in the config's ``rope_parameters["mrope_section"]``.
        max_position_embeddings: The model's position limit; compaction triggers near it.
        attention_scaling: Factor the model multiplies cos/sin by (1.0 for default RoPE). It scales
            a key once, when first rotated; re-rotation never applies it again.
        mrope_interleaved: For ``"mrope"``: Qwen3-VL interleaved layout instead of Qwen2-VL runs.
    """

    head_dim: int
    theta: float = 10000.0
    kind: str = "1d"
    mrope_section: tuple[int, int, int] | None = None
    max_position_embeddings: int = 32768
    attention_scaling: float = 1.0
    mrope_interleaved: bool = False

    def __post_init__(self) -> None:
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"RotarySpec.head_dim must be a positive even number, got {self.head_dim}")
        if self.kind not in ("1d", "mrope"):
            raise ValueError(f"RotarySpec.kind must be '1d' or 'mrope', got {self.kind!r}")
        if self.kind == "mrope":
            section = tuple(int(s) for s in (self.mrope_section or ()))
            if len(section) != 3 or sum(section) != self.head_dim // 2 or min(section) < 0:
                raise ValueError(
                    f"mrope_section must be 3 non-negative ints summing to head_dim/2 = "
                    f"{self.head_dim // 2}, got {self.mrope_section!r}"
                )
            object.__setattr__(self, "mrope_section", section)

    @property
    def num_axes(self) -> int:
        """Number of position coordinates per token: 1 for 1-D RoPE, 3 for M-RoPE."""
        return 3 if self.kind == "mrope" else 1

    @classmethod
    def from_text_config(cls, cfg: Any) -> RotarySpec:
        """Read the rotary scheme from a transformers text config (or a VLM config holding one).

        transformers 5.24 keeps RoPE settings in ``cfg.rope_parameters`` (``rope_theta``,
        ``rope_type``, and for Qwen-VL ``mrope_section`` / ``mrope_interleaved``); older configs
        had ``rope_theta`` / ``rope_scaling`` attributes, which are read as a fallback.

        Args:
            cfg: e.g. ``Qwen2Config``, ``Qwen2VLTextConfig``, ``Qwen3VLTextConfig``, or a composite
                config whose ``get_text_config()`` returns one of those.

        Returns:
            The matching `RotarySpec`.

        Raises:
            ModelError: The config uses a RoPE variant hermes cannot re-rotate (scaled, dynamic or
                partial rotary), or names no head size.
        """
        if hasattr(cfg, "get_text_config"):
            cfg = cfg.get_text_config()
        params = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
        if params and all(isinstance(v, dict) for v in params.values()):
            raise ModelError(
                "expected one RoPE setting for all layers; found per-layer-type rope_parameters "
                f"{sorted(params)}; such models are not supported"
            )
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in ("default", "mrope"):
            raise ModelError(
                f"expected default RoPE; found rope_type={rope_type!r}, whose angles depend on more "
                "than the position, so cached keys cannot be re-rotated; use a model with default RoPE"
            )
        partial = getattr(cfg, "partial_rotary_factor", None) or params.get("partial_rotary_factor") or 1.0
        if float(partial) != 1.0:
            raise ModelError("expected RoPE over the whole head; found partial_rotary_factor != 1")
        theta = params.get("rope_theta", getattr(cfg, "rope_theta", None)) or 10000.0
        head_dim = getattr(cfg, "head_dim", None)
        if not head_dim:
            hidden, heads = getattr(cfg, "hidden_size", None), getattr(cfg, "num_attention_heads", None)
            if not hidden or not heads:
                raise ModelError("expected head_dim or hidden_size/num_attention_heads in the text config")
            head_dim = hidden // heads
        model_type = getattr(cfg, "model_type", "")
        default_section, default_interleaved = _MROPE_DEFAULTS.get(model_type, (None, False))
        section = params.get("mrope_section", default_section)
        kind = "mrope" if section is not None else "1d"
        return cls(
            head_dim=int(head_dim),
            theta=float(theta),
            kind=kind,
            mrope_section=tuple(section) if section is not None else None,
            max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 32768) or 32768),
            attention_scaling=1.0,
            mrope_interleaved=bool(section and params.get("mrope_interleaved", default_interleaved)),
        )


def inv_freq(spec: RotarySpec, device: torch.device | str | None = None) -> torch.Tensor:
    """Inverse frequencies of the rotary pairs, computed exactly as transformers does.

    Args:
        spec: The rotary scheme.
        device: Where to put the result.

    Returns:
        ``(D/2,)`` float32 tensor ``theta ** (-2j / D)``.
    """
    dim = spec.head_dim
    return 1.0 / (spec.theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))


def freq_axes(spec: RotarySpec, device: torch.device | str | None = None) -> torch.Tensor:
    """Which position axis drives each frequency pair.

    Args:
        spec: The rotary scheme.
        device: Where to put the result.

    Returns:
        ``(D/2,)`` int64 tensor of axis indices (0 = temporal / 1-D, 1 = height, 2 = width).
    """
    half = spec.head_dim // 2
    if spec.kind == "1d":
        return torch.zeros(half, dtype=torch.long, device=device)
    sec = spec.mrope_section
    if not spec.mrope_interleaved:
        # Qwen2-VL: contiguous runs t..t h..h w..w
        return torch.repeat_interleave(torch.arange(3, device=device), torch.tensor(sec, device=device))
    # Qwen3-VL: t h w t h w ... while each of h and w still has pairs left, then t for the rest
    axes = torch.zeros(half, dtype=torch.long, device=device)
    axes[1 : 3 * sec[1] : 3] = 1
    axes[2 : 3 * sec[2] : 3] = 2
    return axes


def _check_positions(positions: torch.Tensor, spec: RotarySpec, name: str) -> torch.Tensor:
    """Return positions as ``(A, T)`` (A = number of axes), validating the shape."""
    if spec.kind == "1d":
        if positions.dim() != 1:
            raise ValueError(f"{name} for 1-D RoPE must have shape (T,), got {tuple(positions.shape)}")
        return positions.unsqueeze(0)
    if positions.dim() != 2 or positions.shape[0] != 3:
        raise ValueError(f"{name} for M-RoPE must have shape (3, T), got {tuple(positions.shape)}")
    return positions


def rotary_angles(
    positions: torch.Tensor, spec: RotarySpec, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Rotation angle of every frequency pair at the given positions.

    In float32 this reproduces the model's own angles bit for bit (fp32 position times fp32
    inverse frequency).

    Args:
        positions: ``(T,)`` for 1-D RoPE or ``(3, T)`` for M-RoPE, integer or float.
        spec: The rotary scheme.
        dtype: Arithmetic dtype (float32 to match the model; float64 for exact deltas).

    Returns:
        ``(T, D/2)`` angles in ``dtype``.
    """
    return _angles(_check_positions(positions, spec, "positions"), spec, dtype)


@functools.lru_cache(maxsize=32)
def _frequencies(spec: RotarySpec, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`inv_freq` in `dtype` and `freq_axes`, made once per scheme and device (every re-rotation asks); read-only."""
    return inv_freq(spec, device).to(dtype), freq_axes(spec, device)


def _angles(positions: torch.Tensor, spec: RotarySpec, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`rotary_angles` of ``(..., A, T)`` positions (any leading dims): ``(..., T, D/2)``."""
    freqs, axes = _frequencies(spec, positions.device, dtype)  # (D/2,) each
    # gather each pair's driving axis: (..., A, T) -> (..., D/2, T) -> (..., T, D/2)
    return positions.to(dtype).index_select(-2, axes).transpose(-2, -1) * freqs


def _delta_cos_sin(old: torch.Tensor, new: torch.Tensor, spec: RotarySpec) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the turn from positions ``old`` to ``new`` (``(..., A, T)`` each), ``(..., T, D/2)`` fp32,
    from the model's own fp32 cos/sin at both (the exact compensation, module docstring)."""
    before, after = _angles(old, spec), _angles(new, spec)
    cos_o, sin_o, cos_n, sin_n = before.cos(), before.sin(), after.cos(), after.sin()
    return cos_n * cos_o + sin_n * sin_o, sin_n * cos_o - cos_n * sin_o  # cos(new - old), sin(new - old)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x (..., T, D)`` pairwise (rotate_half layout) by ``cos/sin (T, D/2)``, in x's dtype."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rotate_at(x: torch.Tensor, positions: torch.Tensor, spec: RotarySpec) -> torch.Tensor:
    """Rotate unrotated vectors to positions, as the model does to fresh keys and queries.

    Useful for tests and for building keys at a chosen position; computed in fp32 and cast back.

    Args:
        x: ``(..., T, D)`` unrotated keys or queries.
        positions: ``(T,)`` or ``(3, T)`` positions.
        spec: The rotary scheme; its ``attention_scaling`` is applied (as the model does).

    Returns:
        ``(..., T, D)`` rotated vectors in ``x.dtype``.
    """
    angles = rotary_angles(positions, spec)  # (T, D/2) fp32
    cos, sin = angles.cos() * spec.attention_scaling, angles.sin() * spec.attention_scaling
    return _rotate(x.float(), cos, sin).to(x.dtype)


def _float64_ok(device: torch.device) -> bool:
    # Apple MPS has no float64; everything else hermes runs on does.
    return device.type != "mps"


def rotate_keys(
    keys: torch.Tensor,
    delta: torch.Tensor,
    spec: RotarySpec,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Move keys stored rotated at position p to position q = p + delta.

    Only tokens with a non-zero delta (on any axis) are touched; the others are copied bit for bit.
    The rotation is applied in fp32 and cast back to ``keys.dtype``.

    Args:
        keys: ``(..., T, D)`` cached keys (e.g. ``(B, H, T, D)``), already rotated at p.
        delta: ``q - p`` per token, integer: ``(T,)`` for 1-D RoPE, ``(3, T)`` for M-RoPE.
        spec: The rotary scheme.
        positions: Optional current positions p (same shape as ``delta``). When given, the delta
            rotation is derived from the model's fp32 cos/sin at p and q, so the result matches a
            key rotated directly at q to fp32 accuracy even for very large p (see module docstring).

    Returns:
        A new ``(..., T, D)`` tensor of keys rotated to q, in ``keys.dtype``.

    Raises:
        ValueError: Shapes of ``keys``, ``delta`` and ``positions`` disagree.
    """
    if keys.shape[-1] != spec.head_dim:
        raise ValueError(f"keys have head size {keys.shape[-1]}, spec says {spec.head_dim}")
    d = _check_positions(delta, spec, "delta")  # (A, T)
    if d.shape[1] != keys.shape[-2]:
        raise ValueError(f"delta covers {d.shape[1]} tokens, keys hold {keys.shape[-2]}")
    if positions is not None and positions.shape != delta.shape:
        raise ValueError(f"positions shape {tuple(positions.shape)} != delta shape {tuple(delta.shape)}")
    out = keys.clone()
    moving = (d != 0).any(dim=0).nonzero().squeeze(1)  # (M,) indices of tokens that move
    if moving.numel() == 0:
        return out
    delta_m = delta.index_select(-1, moving.to(delta.device))
    if positions is not None:
        # exact compensation: angle differences from the model's own fp32 cos/sin at p and at q
        pos_m = _check_positions(positions.index_select(-1, moving.to(positions.device)), spec, "positions")
        cos, sin = _delta_cos_sin(pos_m, pos_m + _check_positions(delta_m, spec, "delta"), spec)  # (M, D/2)
    else:
        wide = torch.float64 if _float64_ok(delta.device) else torch.float32
        ang = rotary_angles(delta_m, spec, dtype=wide)  # (M, D/2), delta angle formed exactly
        cos, sin = ang.cos().float(), ang.sin().float()
    idx = moving.to(keys.device)
    sel = keys.index_select(-2, idx).float()  # (..., M, D)
    rotated = _rotate(sel, cos.to(keys.device), sin.to(keys.device)).to(keys.dtype)
    out.index_copy_(-2, idx, rotated)
    return out


def rotate_between(
    keys: torch.Tensor, old_positions: torch.Tensor, new_positions: torch.Tensor, spec: RotarySpec
) -> torch.Tensor:
    """Move keys from their current positions to new ones (exact-compensation path of `rotate_keys`).

    Args:
        keys: ``(..., T, D)`` keys rotated at ``old_positions``.
        old_positions: ``(T,)`` or ``(3, T)`` current positions.
        new_positions: Target positions, same shape.
        spec: The rotary scheme.

    Returns:
        ``(..., T, D)`` keys rotated at ``new_positions``.
    """
    old = old_positions.long()
    return rotate_keys(keys, new_positions.long().to(old.device) - old, spec, positions=old)


def rotate_rows_between(keys: torch.Tensor, old_positions: torch.Tensor, new_positions: torch.Tensor,
                        spec: RotarySpec) -> torch.Tensor:
    """`rotate_between` for N rows of keys at once (e.g. one per layer), each with its own positions.

    The same arithmetic, element for element, as `rotate_between` row by row: a token whose position
    does not change is kept bit for bit, the others turn by the exact fp32 compensation.

    Args:
        keys: ``(N, H, T, D)`` keys rotated at ``old_positions``.
        old_positions: ``(N, A, T)`` integer positions (A = 1 for 1-D RoPE, 3 for M-RoPE).
        new_positions: ``(N, A, T)`` target positions.
        spec: The rotary scheme.

    Returns:
        ``(N, H, T, D)`` keys at ``new_positions``, in ``keys.dtype``.
    """
    old, new = old_positions.long(), new_positions.long().to(old_positions.device)
    cos, sin = _delta_cos_sin(old, new, spec)  # (N, T, D/2)
    turned = _rotate(keys.float(), cos[:, None].to(keys.device), sin[:, None].to(keys.device)).to(keys.dtype)
    still = (old == new).all(dim=1)[:, None, :, None].to(keys.device)  # (N, 1, T, 1)
    return torch.where(still, keys, turned)
