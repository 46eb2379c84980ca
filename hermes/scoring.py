"""HERMES token-importance scoring: pure, batched tensor functions (no model, no Python loops over tokens).

The method is that of HERMES (arXiv 2601.14724, §3.1-3.2 and App. "Configuration of Cross-Layer
Memory Smoothing" / "Algorithm of Summary Tokens"), with the details the paper leaves open pinned
to its reference code (haowei-freesky/HERMES, ``inference/llavaov_online_official.py``):

- Layer bands (§4.1, "10% shallow, 60% middle and 30% deep"): the first working layer is
  ``floor(0.1 L)`` and the first long-term layer ``floor(0.7 L)`` (reference code, ``int(...)``).
- Recency (§3.1 Eq. 1): ``R_i = exp(-k * d_i)``. The paper sets ``d_i = T - 1 - i`` on the cache
  index and leaves k open; the reference code divides by ``T - 1`` (so ``d`` is in [0, 1]) and uses
  ``k = 20``. `recency_scores` does that normalisation over whatever time axis it is given.
- Working-band mix (§3.1 Eqs. 3-4): ``w_l = w0 - gamma * (l - l_short) / (l_long - l_short)`` with
  ``w0 = 0.75, gamma = 0.6``, ``l_short`` = first working layer, ``l_long`` = first long-term
  layer (so the weight runs from 0.75 down to just above 0.15); score ``(1 - w) A + w R`` with A,
  R min-max normalised. Sensory layers are the case ``w = 1`` (recency only), long-term ``w = 0``
  (attention only).
- Cross-layer smoothing (§3.2 Eq. 5, App. config): ``S~_l = (1 - lambda_l) S_l + lambda_l S~_{l+1}``,
  applied from the deepest layer up, with lambda chosen by the band of the layer being updated
  (sensory 0.1, working 0.3, long-term 0.4). The deeper term is the already smoothed score (the
  reference code updates in place from deep to shallow, so signals propagate over several layers).
  Tokens are matched by id, not by cache index; a token absent from the deeper layer (evicted
  there) contributes 0 from that layer.
- Accumulation: the paper scores one probe; DESIGN §3 makes importance a running quantity. The
  reference code keeps a running sum of raw attention per cached token; `accumulate` does that,
  with an optional decay.
- Summary token (App. Algorithm "Summary Tokens"): evicted values are averaged; evicted keys are
  first re-rotated to the summary position, then averaged. Here both means are weighted by how many
  original tokens each entry stands for, so an existing summary folds in with its count.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import torch

from hermes.rope import RotarySpec, rotate_between

BANDS = ("sensory", "working", "longterm")
DEFAULT_FRACTIONS = (0.1, 0.6, 0.3)
DEFAULT_K = 20.0
DEFAULT_W0 = 0.75
DEFAULT_GAMMA = 0.6
DEFAULT_LAMBDAS = (0.1, 0.3, 0.4)  # sensory, working, long-term

_EPS = 1e-9  # guards floor(L * fraction) against 0.7 * 30 = 20.999...


def layer_bands(num_layers: int, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> list[str]:
    """Assign each decoder layer to the sensory, working or long-term band by depth.

    Boundaries are floors of the cumulative fractions: the first working layer is
    ``floor(f_sensory * L)`` and the first long-term layer ``floor((f_sensory + f_working) * L)``
    (as the reference code). With ``L >= 3`` every band then gets at least one layer: an empty band
    takes one layer from its neighbour. With fewer layers the plain floors are used.

    Args:
        num_layers: Number of decoder layers L.
        fractions: Shares of (sensory, working, long-term); non-negative, summing to 1.

    Returns:
        A list of L band names from `BANDS`, shallow to deep.

    Raises:
        ValueError: Negative layer count, or fractions that are not three shares summing to 1.
    """
    if num_layers < 0:
        raise ValueError(f"num_layers must be >= 0, got {num_layers}")
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"fractions must be 3 non-negative shares summing to 1, got {tuple(fractions)}")
    first_working = math.floor(fractions[0] * num_layers + _EPS)
    first_long = math.floor((fractions[0] + fractions[1]) * num_layers + _EPS)
    if num_layers >= 3:
        first_working = min(max(first_working, 1), num_layers - 2)
        first_long = min(max(first_long, first_working + 1), num_layers - 1)
    return [
        BANDS[0] if layer < first_working else BANDS[1] if layer < first_long else BANDS[2]
        for layer in range(num_layers)
    ]


def _band_index(bands: Sequence[str]) -> list[int]:
    try:
        return [BANDS.index(b) for b in bands]
    except ValueError as exc:
        raise ValueError(f"unknown band in {list(bands)}; expected names from {BANDS}") from exc


def working_mix_weights(
    bands: Sequence[str], w0: float = DEFAULT_W0, gamma: float = DEFAULT_GAMMA
) -> torch.Tensor:
    """Recency weight w_l of every layer: 1 in sensory, 0 in long-term, linear in the working band.

    ``w_l = w0 - gamma * (l - l_short) / (l_long - l_short)`` for working layers, where ``l_short``
    is the first working layer and ``l_long`` the first long-term layer (L if there is none).

    Args:
        bands: Band name per layer (from `layer_bands`).
        w0: Weight of the first working layer.
        gamma: Total fall of the weight across the working band.

    Returns:
        ``(L,)`` float32 recency weights.
    """
    idx = _band_index(bands)
    num = len(idx)
    working = [i for i, b in enumerate(idx) if b == 1]
    l_short = working[0] if working else 0
    l_long = next((i for i, b in enumerate(idx) if b == 2), num)
    layers = torch.arange(num, dtype=torch.float32)
    ramp = w0 - gamma * (layers - l_short) / max(l_long - l_short, 1)
    band = torch.tensor(idx, dtype=torch.long)
    return torch.where(band == 0, torch.ones(num), torch.where(band == 2, torch.zeros(num), ramp))


def recency_scores(
    time: torch.Tensor,
    newest: torch.Tensor | float | None = None,
    k: float = DEFAULT_K,
    span: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Exponential forgetting curve ``exp(-k * d)`` with d the normalised distance from the newest.

    ``d = (newest - time) / span``; by default ``newest`` is the row maximum and ``span`` the row's
    time range (at least 1), so ``d`` runs from 0 (newest) to 1 (oldest). Passing the cache index
    ``arange(T)`` as ``time`` reproduces the paper/reference (``d = (T-1-i)/(T-1)``, ``k = 20``);
    passing frame indices gives all tokens of one frame the same recency (ties are settled towards
    newer tokens by `select_keep`).

    Args:
        time: ``(..., T)`` time coordinate of each token (cache index, position or frame index).
        newest: Time of the newest token, broadcastable to ``(..., 1)``; default: row maximum.
        k: Forgetting rate.
        span: Distance that maps to ``d = 1``; default: ``newest - row minimum`` (at least 1).

    Returns:
        ``(..., T)`` float32 scores in (0, 1].
    """
    t = time.float()
    if t.shape[-1] == 0:
        return t
    if newest is None:
        new = t.amax(dim=-1, keepdim=True)
    else:
        new = torch.as_tensor(newest, dtype=torch.float32, device=t.device)
    if span is None:
        span = (new - t.amin(dim=-1, keepdim=True)).clamp(min=1.0)
    d = ((new - t) / span).clamp(min=0.0)
    return torch.exp(-k * d)


def minmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Min-max normalise to [0, 1] along ``dim``; a constant (or empty) slice becomes zeros, never NaN.

    Args:
        x: Scores of any shape.
        dim: Dimension to normalise over.
        mask: Optional bool tensor like ``x``; only True entries count for min/max, False ones are 0.

    Returns:
        Float32 tensor like ``x``.
    """
    x = x.float()
    if x.numel() == 0:
        return x
    if mask is None:
        lo, hi = x.amin(dim=dim, keepdim=True), x.amax(dim=dim, keepdim=True)
    else:
        lo = torch.where(mask, x, torch.full_like(x, math.inf)).amin(dim=dim, keepdim=True)
        hi = torch.where(mask, x, torch.full_like(x, -math.inf)).amax(dim=dim, keepdim=True)
    rng = hi - lo
    ok = torch.isfinite(rng) & (rng > 0)
    out = torch.where(ok, (x - lo) / torch.where(ok, rng, torch.ones_like(rng)), torch.zeros_like(x))
    return out if mask is None else torch.where(mask, out, torch.zeros_like(out))


def combine_layer_scores(
    recency: torch.Tensor,
    attention: torch.Tensor,
    bands: Sequence[str],
    w0: float = DEFAULT_W0,
    gamma: float = DEFAULT_GAMMA,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-layer importance ``(1 - w_l) * minmax(A_l) + w_l * minmax(R_l)``.

    Args:
        recency: ``(L, T)`` recency scores (from `recency_scores`).
        attention: ``(L, T)`` pseudo-query attention (possibly accumulated), any scale.
        bands: Band name per layer.
        w0: See `working_mix_weights`.
        gamma: See `working_mix_weights`.
        mask: Optional ``(L, T)`` bool; False marks padding, scored 0.

    Returns:
        ``(L, T)`` float32 scores in [0, 1].

    Raises:
        ValueError: Shapes disagree with each other or with ``bands``.
    """
    if recency.shape != attention.shape or recency.dim() != 2 or recency.shape[0] != len(bands):
        raise ValueError(
            f"recency {tuple(recency.shape)} and attention {tuple(attention.shape)} must both be "
            f"(L, T) with L = {len(bands)}"
        )
    w = working_mix_weights(bands, w0, gamma).to(recency.device).unsqueeze(1)  # (L, 1)
    return (1.0 - w) * minmax(attention, mask=mask) + w * minmax(recency, mask=mask)


def _lookup(ids: torch.Tensor, ref_ids: torch.Tensor, ref_vals: torch.Tensor) -> torch.Tensor:
    """Values of ``ref_vals (..., N)`` at the tokens ``ids (T,)`` by id; 0 where an id is absent."""
    out_shape = ref_vals.shape[:-1] + ids.shape
    if ref_ids.numel() == 0 or ids.numel() == 0:
        return torch.zeros(out_shape, dtype=ref_vals.dtype, device=ref_vals.device)
    sorted_ids, order = torch.sort(ref_ids)
    slot = torch.searchsorted(sorted_ids, ids).clamp(max=sorted_ids.numel() - 1)  # (T,)
    found = sorted_ids[slot] == ids
    vals = ref_vals.index_select(-1, order[slot])  # (..., T)
    return torch.where(found, vals, torch.zeros_like(vals))


def smooth_deep_to_shallow(
    scores: Sequence[torch.Tensor],
    token_ids: Sequence[torch.Tensor],
    bands: Sequence[str],
    lambdas: Sequence[float] = DEFAULT_LAMBDAS,
) -> list[torch.Tensor]:
    """Cross-layer memory smoothing, deep to shallow, matching tokens by id.

    ``S~_{L-1} = S_{L-1}``; for l = L-2 .. 0: ``S~_l = (1 - lam) * S_l + lam * S~_{l+1}[same id]``,
    ``lam = lambdas[band of l]``; the deeper term is 0 for a token that layer l+1 no longer holds.

    Args:
        scores: Per layer, ``(T_l,)`` scores (layers may hold different tokens).
        token_ids: Per layer, ``(T_l,)`` int64 token ids, unique within a layer.
        bands: Band name per layer.
        lambdas: Smoothing strength for (sensory, working, long-term) layers.

    Returns:
        Per layer, the smoothed ``(T_l,)`` scores (float32).

    Raises:
        ValueError: Lengths of ``scores``, ``token_ids`` and ``bands`` differ, or a layer's scores
            and ids differ in length.
    """
    if not len(scores) == len(token_ids) == len(bands):
        raise ValueError(f"got {len(scores)} score rows, {len(token_ids)} id rows, {len(bands)} bands")
    for layer, (s, ids) in enumerate(zip(scores, token_ids)):
        if s.shape != ids.shape or s.dim() != 1:
            raise ValueError(
                f"layer {layer}: scores {tuple(s.shape)} and ids {tuple(ids.shape)} must both be (T,)"
            )
    band_idx = _band_index(bands)
    out: list[torch.Tensor] = [torch.empty(0)] * len(scores)
    if not scores:
        return out
    out[-1] = scores[-1].float().clone()
    for layer in range(len(scores) - 2, -1, -1):
        lam = float(lambdas[band_idx[layer]])
        deeper = _lookup(token_ids[layer], token_ids[layer + 1], out[layer + 1])
        out[layer] = (1.0 - lam) * scores[layer].float() + lam * deeper
    return out


def accumulate(
    prev: tuple[torch.Tensor, torch.Tensor] | None,
    new_scores: torch.Tensor,
    ids: torch.Tensor,
    decay: float = 1.0,
) -> torch.Tensor:
    """Running importance: ``acc = decay * acc_prev[same id] + new`` (0 for tokens seen first now).

    Intended for the raw pseudo-query attention of each layer, before min-max normalisation (the
    reference code sums raw attention per cached token). ``decay = 1`` is that plain sum; ``decay <
    1`` forgets old probes geometrically.

    Args:
        prev: ``(prev_ids (N,), prev_scores (..., N))`` from the last call, or None at the start.
        new_scores: ``(..., T)`` this probe's scores for the tokens ``ids``.
        ids: ``(T,)`` int64 ids of the currently cached tokens (unique).
        decay: Factor applied to the previous running value.

    Returns:
        ``(..., T)`` float32 running scores aligned with ``ids``; tokens no longer cached drop out.
    """
    new = new_scores.float()
    if prev is None:
        return new.clone()
    prev_ids, prev_scores = prev
    return decay * _lookup(ids, prev_ids, prev_scores.float()) + new


def select_keep(scores: torch.Tensor, budget: int) -> torch.Tensor:
    """Indices of the ``budget`` highest scores, in increasing (time) order.

    Deterministic: among equal scores the later (newer) token wins, so an all-equal row keeps the
    newest tokens (a sliding window).

    Args:
        scores: ``(..., T)`` scores.
        budget: How many to keep (all when ``budget >= T``).

    Returns:
        ``(..., min(budget, T))`` int64 indices, sorted ascending.

    Raises:
        ValueError: ``budget`` is negative.
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    num = scores.shape[-1]
    if budget >= num:
        return torch.arange(num, device=scores.device).expand(scores.shape[:-1] + (num,)).clone()
    # stable sort of the reversed row: ties keep reversed order, i.e. newer tokens first
    order = torch.sort(scores.flip(-1), dim=-1, descending=True, stable=True).indices[..., :budget]
    return torch.sort(num - 1 - order, dim=-1).values


class Summary(NamedTuple):
    """One summary token: key ``(..., 1, D)``, value ``(..., 1, Dv)``, and how many tokens it holds."""

    key: torch.Tensor
    value: torch.Tensor
    count: torch.Tensor


def fold_summary(
    keys: torch.Tensor,
    values: torch.Tensor,
    counts: torch.Tensor,
    positions: torch.Tensor,
    target_position: torch.Tensor | int | Sequence[int],
    spec: RotarySpec,
) -> Summary:
    """Fold tokens (evicted ones, and possibly the previous summary) into one summary token.

    value = sum_i c_i v_i / sum_i c_i; key = sum_i c_i rot(k_i, p_i -> t) / sum_i c_i, where c_i is
    the number of original tokens entry i stands for (1 for a plain token, n for a summary) and
    rot moves a stored key from its position to the summary position t (hermes.rope, exact fp32
    compensation). Means are taken in fp32 and cast back.

    Args:
        keys: ``(..., T, D)`` keys rotated at ``positions`` (e.g. ``(H, T, D)``).
        values: ``(..., T, Dv)`` values.
        counts: ``(T,)`` positive token counts.
        positions: ``(T,)`` (1-D RoPE) or ``(3, T)`` (M-RoPE) current positions of the keys.
        target_position: Summary position: an int (1-D) or 3 ints (M-RoPE).
        spec: The rotary scheme.

    Returns:
        `Summary` with key ``(..., 1, D)``, value ``(..., 1, Dv)`` and the total count.

    Raises:
        ValueError: No tokens, non-positive counts or mismatched shapes.
    """
    num = keys.shape[-2]
    if num == 0 or values.shape[-2] != num or counts.shape != (num,):
        raise ValueError(f"need T > 0 tokens with matching keys/values/counts; got keys {tuple(keys.shape)}, "
                         f"values {tuple(values.shape)}, counts {tuple(counts.shape)}")
    if bool((counts <= 0).any()):
        raise ValueError("counts must be positive")
    target = torch.as_tensor(target_position, dtype=torch.long, device=positions.device)
    old = positions.long()
    new = target.reshape(-1, 1).expand(old.shape) if old.dim() == 2 else target.reshape(()).expand(old.shape)
    moved = rotate_between(keys.float(), old, new, spec)  # (..., T, D) fp32, all at the target
    weight = (counts.float() / counts.float().sum()).to(keys.device).unsqueeze(-1)  # (T, 1)
    key = (moved * weight).sum(dim=-2, keepdim=True).to(keys.dtype)
    value = (values.float() * weight.to(values.device)).sum(dim=-2, keepdim=True).to(values.dtype)
    return Summary(key=key, value=value, count=counts.sum())
