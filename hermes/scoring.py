"""HERMES token-importance scoring as pure batched tensor functions (docs/ARCHITECTURE.md "Memory").

HERMES (arXiv 2601.14724, §3.1-3.2 and its appendix), with what the paper leaves open pinned to the
reference code (haowei-freesky/HERMES at 8d699b1, ``inference/qwenvl_hermes.py``; held by
``tests/hermes/test_golden.py``): band boundaries ``int(0.1 L)``, ``int(0.7 L)``; recency
``exp(-k d)``, ``d = (T-1-i)/(T-1)``, ``k = 20 - 12 p`` across the working band; mix ``w = 0.75 -
0.6 p``; min-max with denominator ``max - min + 1e-6``; smoothing deep to shallow in place with
lambda by band (0.1, 0.3, 0.4); summaries as plain means of values and of keys re-rotated to the
summary position. Deviations: tokens are matched across layers by id (the reference's cache indices
stop lining up after the first eviction; ``match="index"`` is its rule), and accumulation and
count-weighted summaries are options.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Sequence

import torch

from hermes.rope import RotarySpec, rotate_rows_between

BANDS = ("sensory", "working", "longterm")
DEFAULT_FRACTIONS = (0.1, 0.6, 0.3)
DEFAULT_K = 20.0
DEFAULT_K_FALL = 12.0  # k = 20 - 12 p across the working band (reference, Qwen file)
MINMAX_EPS = 1e-6  # the reference's min-max denominator guard, (x - min) / (max - min + 1e-6)
DEFAULT_W0 = 0.75
DEFAULT_GAMMA = 0.6
DEFAULT_LAMBDAS = (0.1, 0.3, 0.4)  # sensory, working, long-term

_EPS = 1e-9  # guards floor(L * fraction) against 0.7 * 30 = 20.999...


def layer_bands(num_layers: int, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> list[str]:
    """Each decoder layer's band by depth: boundaries are floors of the cumulative fractions (as the reference);
    with ``L >= 3`` an empty band takes one layer from its neighbour.

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


def working_progress(bands: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each layer's band index and ``p = (l - l_short) / (l_long - l_short)``, the reference's ``progress``
    (0 at the first working layer, just below 1 at the last; ``l_long`` = L without a long-term band).

    Returns:
        ``(band (L,) int64, p (L,) float32)``; p is meaningful for working layers only.
    """
    idx = _band_index(bands)
    num = len(idx)
    working = [i for i, b in enumerate(idx) if b == 1]
    l_short = working[0] if working else 0
    l_long = next((i for i, b in enumerate(idx) if b == 2), num)
    layers = torch.arange(num, dtype=torch.float32)
    return torch.tensor(idx, dtype=torch.long), (layers - l_short) / max(l_long - l_short, 1)


def working_mix_weights(
    bands: Sequence[str], w0: float = DEFAULT_W0, gamma: float = DEFAULT_GAMMA
) -> torch.Tensor:
    """Recency weight w_l of every layer: 1 in sensory, 0 in long-term, ``w0 - gamma * p`` in the working band.

    Args:
        bands: Band name per layer (from `layer_bands`).
        w0: Weight of the first working layer.
        gamma: Total fall of the weight across the working band.

    Returns:
        ``(L,)`` float32 recency weights.
    """
    band, p = working_progress(bands)
    num = len(band)
    return torch.where(band == 0, torch.ones(num), torch.where(band == 2, torch.zeros(num), w0 - gamma * p))


@functools.lru_cache(maxsize=16)
def _mix_weights_memo(bands: tuple[str, ...], w0: float, gamma: float) -> torch.Tensor:
    """`working_mix_weights`, computed once per setting (every eviction asks again); read-only."""
    return working_mix_weights(bands, w0, gamma)


def recency_rates(bands: Sequence[str], k: float = DEFAULT_K, fall: float = DEFAULT_K_FALL) -> torch.Tensor:
    """Forgetting rate per layer: ``k - fall * p`` in the working band (the reference's ``20 - 12 p``), else ``k``.

    Returns:
        ``(L,)`` float32 rates.
    """
    band, p = working_progress(bands)
    return torch.where(band == 1, k - fall * p, torch.full_like(p, k))


def recency_scores(
    time: torch.Tensor,
    newest: torch.Tensor | float | None = None,
    k: float | torch.Tensor = DEFAULT_K,
    span: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Forgetting curve ``exp(-k * (newest - time) / span)``; ``time = arange(T)`` is the reference's
    ``d = (T-1-i)/(T-1)``, frame indices give one frame's tokens one recency.

    Args:
        time: ``(..., T)`` time coordinate of each token (cache index, position or frame index).
        newest: Time of the newest token, broadcastable to ``(..., 1)``; default: row maximum.
        k: Forgetting rate, a float or a tensor broadcastable to ``(..., 1)`` (one rate per row).
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
    return torch.exp(-torch.as_tensor(k, dtype=torch.float32, device=t.device) * d)


def minmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """Min-max normalise to [0, 1] along ``dim``; a constant (or empty) slice becomes zeros, never NaN.

    Args:
        x: Scores of any shape.
        mask: Optional bool tensor like ``x``; only True entries count for min/max, False ones are 0.
        eps: Added to the range in the denominator (the reference adds 1e-6), so the maximum maps
            to just below 1 and a tiny range is damped rather than blown up.

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
    out = torch.where(ok, (x - lo) / (torch.where(ok, rng, torch.ones_like(rng)) + eps), torch.zeros_like(x))
    return out if mask is None else torch.where(mask, out, torch.zeros_like(out))


def combine_layer_scores(
    recency: torch.Tensor,
    attention: torch.Tensor,
    bands: Sequence[str],
    w0: float = DEFAULT_W0,
    gamma: float = DEFAULT_GAMMA,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-layer importance ``(1 - w_l) * minmax(A_l) + w_l * minmax(R_l)`` (min-max with the reference's 1e-6).

    Args:
        recency: ``(L, T)`` recency scores (from `recency_scores`).
        attention: ``(L, T)`` pseudo-query attention (possibly accumulated), any scale.
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
    w = _mix_weights_memo(tuple(bands), w0, gamma).to(recency.device).unsqueeze(1)  # (L, 1)
    return (1.0 - w) * minmax(attention, mask=mask, eps=MINMAX_EPS) + w * minmax(recency, mask=mask, eps=MINMAX_EPS)


def _slots_by_id(ids: torch.Tensor, ref_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(slot, found) of each of ``ids (..., T)`` in ``ref_ids (..., N > 0)``, row by row; slot is arbitrary where not found."""
    sorted_ids, order = torch.sort(ref_ids, dim=-1)
    at = torch.searchsorted(sorted_ids, ids).clamp(max=ref_ids.shape[-1] - 1)
    return order.gather(-1, at), sorted_ids.gather(-1, at) == ids


def _lookup(ids: torch.Tensor, ref_ids: torch.Tensor, ref_vals: torch.Tensor) -> torch.Tensor:
    """Values of ``ref_vals (..., N)`` at the tokens ``ids (T,)`` by id; 0 where an id is absent."""
    out_shape = ref_vals.shape[:-1] + ids.shape
    if ref_ids.numel() == 0 or ids.numel() == 0:
        return torch.zeros(out_shape, dtype=ref_vals.dtype, device=ref_vals.device)
    slot, found = _slots_by_id(ids, ref_ids)  # (T,)
    vals = ref_vals.index_select(-1, slot)  # (..., T)
    return torch.where(found, vals, torch.zeros_like(vals))


def smooth_deep_to_shallow(
    scores: Sequence[torch.Tensor],
    token_ids: Sequence[torch.Tensor],
    bands: Sequence[str],
    lambdas: Sequence[float] = DEFAULT_LAMBDAS,
    match: str = "token",
) -> list[torch.Tensor]:
    """Cross-layer smoothing ``S~_l = (1 - lam) S_l + lam S~_{l+1}[same id]`` from the deepest layer up,
    ``lam`` by the band of l; 0 for a token layer l+1 no longer holds. ``match="index"`` pairs equal
    cache indices instead (the reference's rule; layers of equal length).

    Args:
        scores: Per layer, ``(T_l,)`` scores (layers may hold different tokens).
        token_ids: Per layer, ``(T_l,)`` int64 token ids, unique within a layer.
        lambdas: Smoothing strength for (sensory, working, long-term) layers.
        match: "token" (by id) or "index" (by cache index).

    Returns:
        Per layer, the smoothed ``(T_l,)`` scores (float32).

    Raises:
        ValueError: Lengths of ``scores``, ``token_ids`` and ``bands`` differ, a layer's scores
            and ids differ in length, an unknown ``match``, or layers of different lengths with
            ``match="index"``.
    """
    if match not in ("token", "index"):
        raise ValueError(f"match must be 'token' or 'index', got {match!r}")
    if match == "index" and len({s.shape for s in scores}) > 1:
        raise ValueError(f"smoothing by index needs layers of equal length, got {sorted({s.numel() for s in scores})}")
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
    # equal lengths (a cache's always are): one batched sort and search for all layers
    same_length = len({ids.shape[0] for ids in token_ids}) == 1
    deeper_slots = _deeper_slots_batched(token_ids) if match == "token" and same_length else None
    for layer in range(len(scores) - 2, -1, -1):
        lam = float(lambdas[band_idx[layer]])
        if match == "index":  # the reference's rule: the entry at the same cache index in the deeper layer
            deeper = out[layer + 1]
        elif deeper_slots is None:
            deeper = _lookup(token_ids[layer], token_ids[layer + 1], out[layer + 1])
        else:
            slot, found = deeper_slots[0][layer], deeper_slots[1][layer]
            vals = out[layer + 1].index_select(-1, slot)
            deeper = torch.where(found, vals, torch.zeros_like(vals))
        out[layer] = (1.0 - lam) * scores[layer].float() + lam * deeper
    return out


def _deeper_slots_batched(token_ids: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`_slots_by_id` of every layer's tokens in the next deeper layer: ((L-1, T), (L-1, T)), or None if T = 0 or L < 2."""
    if len(token_ids) < 2 or token_ids[0].numel() == 0:
        return None
    ids = torch.stack(list(token_ids))  # (L, T)
    return _slots_by_id(ids[:-1], ids[1:])


ACCUMULATIONS = ("none", "sum", "ema")


def accumulate(
    prev: tuple[torch.Tensor, torch.Tensor] | None,
    new_scores: torch.Tensor,
    ids: torch.Tensor,
    mode: str = "sum",
    decay: float = 0.5,
) -> torch.Tensor:
    """Importance carried across probes by token id: ``none`` (the reference's fresh probe), ``sum``
    (old tokens' sums only grow) or ``ema`` (``decay * prev + (1 - decay) * new``, new tokens start at ``new``).

    Args:
        prev: ``(prev_ids (N,), prev_scores (..., N))`` from the last call, or None at the start.
        new_scores: ``(..., T)`` this probe's scores for the tokens ``ids``.
        ids: ``(T,)`` int64 ids of the currently cached tokens (unique).
        decay: ``ema`` only: weight of the previous value.

    Returns:
        ``(..., T)`` float32 scores aligned with ``ids``; tokens no longer cached drop out.

    Raises:
        ValueError: Unknown mode.
    """
    if mode not in ACCUMULATIONS:
        raise ValueError(f"accumulation must be one of {ACCUMULATIONS}, got {mode!r}")
    new = new_scores.float()
    if prev is None or mode == "none":
        return new.clone()
    prev_ids, prev_scores = prev
    if mode == "sum":
        return _lookup(ids, prev_ids, prev_scores.float()) + new
    seen = torch.isin(ids, prev_ids)
    old = _lookup(ids, prev_ids, prev_scores.float())
    return torch.where(seen, decay * old + (1.0 - decay) * new, new)


def select_keep(scores: torch.Tensor, budget: int) -> torch.Tensor:
    """Indices of the ``budget`` highest scores in time order; ties go to the newer token, NaN counts as +inf.

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
    if budget >= num or budget == 0:
        return torch.arange(min(budget, num), device=scores.device).expand(scores.shape[:-1] + (min(budget, num),)).clone()
    # no sort: the budget-th largest score t (a selection, O(T)); every score above t is kept, and of those
    # equal to t the newest, as many as are still wanted. The mask's nonzero entries come in time order.
    scores = torch.nan_to_num(scores, nan=math.inf)
    t = scores.kthvalue(num - budget + 1, dim=-1, keepdim=True).values
    above, tied = scores > t, scores == t
    wanted = budget - above.sum(dim=-1, keepdim=True)
    tied_from_newest = tied.flip(-1).cumsum(dim=-1).flip(-1)  # a tied token's rank counted from the newest
    keep = above | (tied & (tied_from_newest <= wanted))
    return keep.nonzero()[:, -1].view(*scores.shape[:-1], budget)


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
    weighted: bool = True,
) -> Summary:
    """Fold tokens into one summary: fp32 means of values and of keys rotated to the target position,
    weighted by the tokens each entry stands for (``weighted=False``: the reference's plain mean).

    Args:
        keys: ``(..., T, D)`` keys rotated at ``positions`` (e.g. ``(H, T, D)``).
        values: ``(..., T, Dv)`` values.
        counts: ``(T,)`` positive token counts.
        positions: ``(T,)`` (1-D RoPE) or ``(3, T)`` (M-RoPE) current positions of the keys.
        target_position: Summary position: an int (1-D) or 3 ints (M-RoPE).
        weighted: Weight each entry by its count (else every entry alike).

    Returns:
        `Summary` with key ``(..., 1, D)``, value ``(..., 1, Dv)`` and the total count.

    Raises:
        ValueError: No tokens, non-positive counts or mismatched shapes.
    """
    num = keys.shape[-2]
    if num == 0 or values.shape[-2] != num or counts.shape != (num,):
        raise ValueError(f"need T > 0 tokens with matching keys/values/counts; got keys {tuple(keys.shape)}, "
                         f"values {tuple(values.shape)}, counts {tuple(counts.shape)}")
    target = torch.as_tensor(target_position, dtype=torch.long, device=positions.device).reshape(1, -1)
    folded = fold_summaries(keys.reshape(1, -1, num, keys.shape[-1]), values.reshape(1, -1, num, values.shape[-1]),
                            counts[None], positions.reshape(1, -1, num), target, spec, weighted)
    return Summary(key=folded.key.reshape(*keys.shape[:-2], 1, keys.shape[-1]),
                   value=folded.value.reshape(*values.shape[:-2], 1, values.shape[-1]), count=folded.count[0])


def fold_summaries(
    keys: torch.Tensor,
    values: torch.Tensor,
    counts: torch.Tensor,
    positions: torch.Tensor,
    targets: torch.Tensor,
    spec: RotarySpec,
    weighted: bool = True,
) -> Summary:
    """`fold_summary` of N groups of T tokens at once (one per long-term layer), the same arithmetic per group.

    Args:
        keys, values, counts, positions: as `fold_summary`'s with a leading group dim N: ``(N, H, T, D)``,
            ``(N, H, T, Dv)``, ``(N, T)``, ``(N, A, T)``.
        targets: ``(N, A)`` each group's summary position.

    Returns:
        `Summary` with key ``(N, H, 1, D)``, value ``(N, H, 1, Dv)`` and count ``(N,)``.

    Raises:
        ValueError: No tokens, non-positive counts or mismatched shapes.
    """
    num = keys.shape[-2]
    if num == 0 or values.shape[-2] != num or counts.shape != (keys.shape[0], num) or positions.shape[-1] != num:
        raise ValueError(f"need T > 0 tokens with matching keys/values/counts/positions; got keys "
                         f"{tuple(keys.shape)}, values {tuple(values.shape)}, counts {tuple(counts.shape)}, "
                         f"positions {tuple(positions.shape)}")
    if bool((counts <= 0).any()):
        raise ValueError("counts must be positive")
    old = positions.long()
    moved = rotate_rows_between(keys.float(), old, targets.long().to(old.device)[:, :, None].expand(old.shape),
                                spec)  # (N, H, T, D) fp32, all at their target
    mass = counts.float() if weighted else torch.ones(counts.shape)
    weight = (mass / mass.sum(dim=-1, keepdim=True)).to(keys.device)[:, None, :, None]  # (N, 1, T, 1)
    key = (moved * weight).sum(dim=-2, keepdim=True).to(keys.dtype)
    value = (values.float() * weight.to(values.device)).sum(dim=-2, keepdim=True).to(values.dtype)
    return Summary(key=key, value=value, count=counts.sum(dim=-1))


def mean_position(positions: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Count-weighted mean position per axis, rounded: where a token standing for others is placed.

    Args:
        positions: ``(..., A, n)`` integer positions.
        counts: ``(..., n)`` tokens each entry stands for.

    Returns:
        ``(..., A)`` int64: the float64 mean of the positions under weights ``counts / counts.sum()``,
        rounded half to even (level 3's mean token and level 1's ``summary_position: mean_evicted``).
    """
    weights = counts.double() / counts.sum(dim=-1, keepdim=True)
    return torch.round((positions.double() * weights.unsqueeze(-2)).sum(dim=-1)).long()
