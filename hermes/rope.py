"""Rotary position embeddings owned by hermes: re-rotating cached keys to new positions.

Cached keys are stored rotated (docs/ARCHITECTURE.md, Positions); compaction and summary folding
move a key from position p to q by turning every frequency pair by ``theta(q) - theta(p)`` (paper,
App. "Details of Position Re-Indexing"). Conventions follow transformers 5.24 exactly: 1-D RoPE
``inv_freq[j] = theta^(-2j/D)``, fp32 angles, rotate_half layout (``x[j]`` pairs with ``x[j + D/2]``);
M-RoPE (Qwen2/2.5-VL) positions (3, T), ``mrope_section`` splitting the D/2 pairs into t, h, w runs;
interleaved M-RoPE (Qwen3-VL) pair j driven by h if ``j % 3 == 1 and j < 3 s_h``, by w if ``j % 3 ==
2 and j < 3 s_w``, else t.

Precision: the model rotated a key by the fp32-rounded ``fp32(p * inv_freq)`` (about 4e-3 rad off at
p = 100000), so turning by ``(q - p) * inv_freq`` cannot land where the model puts q. Given p, the
turn is built from the model's own fp32 cos/sin at p and q by the angle-difference identities, which
undoes that rounding at any position; without p the delta angle is formed in float64.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from hermes.errors import ModelError

# M-RoPE model types: the section their rotary module falls back to (transformers 5.24), interleaved or not
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
        """Read the rotary scheme from a transformers text config (``rope_parameters``, or the older
        ``rope_theta`` / ``rope_scaling``) or a VLM config holding one.

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
    """``(D/2,)`` float32 ``theta ** (-2j / D)``, exactly as transformers computes it."""
    dim = spec.head_dim
    return 1.0 / (spec.theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))


def freq_axes(spec: RotarySpec, device: torch.device | str | None = None) -> torch.Tensor:
    """``(D/2,)`` int64 axis driving each frequency pair (0 = temporal / 1-D, 1 = height, 2 = width)."""
    half = spec.head_dim // 2
    if spec.kind == "1d":
        return torch.zeros(half, dtype=torch.long, device=device)
    sec = spec.mrope_section
    if not spec.mrope_interleaved:
        return torch.repeat_interleave(torch.arange(3, device=device), torch.tensor(sec, device=device))
    # Qwen3-VL: t h w t h w ... while each of h and w still has pairs left, then t for the rest
    axes = torch.zeros(half, dtype=torch.long, device=device)
    axes[1 : 3 * sec[1] : 3] = 1
    axes[2 : 3 * sec[2] : 3] = 2
    return axes


def _check_positions(positions: torch.Tensor, spec: RotarySpec, name: str) -> torch.Tensor:
    """Positions as ``(A, T)``, the shape validated."""
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
    """Rotation angle of every frequency pair at the given positions (in float32 the model's, bit for bit).

    Args:
        positions: ``(T,)`` for 1-D RoPE or ``(3, T)`` for M-RoPE, integer or float.
        dtype: Arithmetic dtype (float32 to match the model; float64 for exact deltas).

    Returns:
        ``(T, D/2)`` angles in ``dtype``.
    """
    return _angles(_check_positions(positions, spec, "positions"), spec, dtype)


@functools.lru_cache(maxsize=32)
def _frequencies(spec: RotarySpec, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`inv_freq` in `dtype` and `freq_axes`, memoised per scheme and device; read-only."""
    return inv_freq(spec, device).to(dtype), freq_axes(spec, device)


def _angles(positions: torch.Tensor, spec: RotarySpec, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`rotary_angles` of ``(..., A, T)`` positions (any leading dims): ``(..., T, D/2)``."""
    freqs, axes = _frequencies(spec, positions.device, dtype)  # (D/2,) each
    # gather each pair's driving axis: (..., A, T) -> (..., D/2, T) -> (..., T, D/2)
    return positions.to(dtype).index_select(-2, axes).transpose(-2, -1) * freqs


def _delta_cos_sin(old: torch.Tensor, new: torch.Tensor, spec: RotarySpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) ``(..., T, D/2)`` fp32 of the turn from ``old`` to ``new`` ``(..., A, T)`` (module docstring)."""
    before, after = _angles(old, spec), _angles(new, spec)
    cos_o, sin_o, cos_n, sin_n = before.cos(), before.sin(), after.cos(), after.sin()
    return cos_n * cos_o + sin_n * sin_o, sin_n * cos_o - cos_n * sin_o  # cos(new - old), sin(new - old)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x (..., T, D)`` pairwise (rotate_half layout) by ``cos/sin (T, D/2)``, in x's dtype."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rotate_at(x: torch.Tensor, positions: torch.Tensor, spec: RotarySpec) -> torch.Tensor:
    """Rotate unrotated vectors to positions as the model does (fp32, cast back).

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


def rotate_keys(
    keys: torch.Tensor,
    delta: torch.Tensor,
    spec: RotarySpec,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Move keys rotated at p to q = p + delta in fp32; tokens with a zero delta are copied bit for bit.

    Args:
        keys: ``(..., T, D)`` cached keys (e.g. ``(B, H, T, D)``), already rotated at p.
        delta: ``q - p`` per token, integer: ``(T,)`` for 1-D RoPE, ``(3, T)`` for M-RoPE.
        positions: Current positions p (shape of ``delta``), for the exact compensation (module docstring).

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
        pos_m = _check_positions(positions.index_select(-1, moving.to(positions.device)), spec, "positions")
        cos, sin = _delta_cos_sin(pos_m, pos_m + _check_positions(delta_m, spec, "delta"), spec)  # (M, D/2)
    else:
        wide = torch.float32 if delta.device.type == "mps" else torch.float64  # MPS has no float64
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
    """Move ``(..., T, D)`` keys from ``(T,)`` or ``(3, T)`` positions to new ones (`rotate_keys`' exact path)."""
    old = old_positions.long()
    return rotate_keys(keys, new_positions.long().to(old.device) - old, spec, positions=old)


def rotate_rows_between(keys: torch.Tensor, old_positions: torch.Tensor, new_positions: torch.Tensor,
                        spec: RotarySpec) -> torch.Tensor:
    """`rotate_between` for N rows of keys (one per layer), the same arithmetic element for element.

    Args:
        keys: ``(N, H, T, D)`` keys rotated at ``old_positions``.
        old_positions: ``(N, A, T)`` integer positions (A = 1 for 1-D RoPE, 3 for M-RoPE).
        new_positions: ``(N, A, T)`` target positions.

    Returns:
        ``(N, H, T, D)`` keys at ``new_positions``, in ``keys.dtype``.
    """
    old, new = old_positions.long(), new_positions.long().to(old_positions.device)
    cos, sin = _delta_cos_sin(old, new, spec)  # (N, T, D/2)
    turned = _rotate(keys.float(), cos[:, None].to(keys.device), sin[:, None].to(keys.device)).to(keys.dtype)
    still = (old == new).all(dim=1)[:, None, :, None].to(keys.device)  # (N, 1, T, 1)
    return torch.where(still, keys, turned)
