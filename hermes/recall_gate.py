"""Whether, and how much, a question recalls: `memory.recall_gate` and `memory.recall_max_ratio` between
the index's hits and the splice (docs/ARCHITECTURE.md, Memory, "Recall")."""

from __future__ import annotations

import torch

from hermes.cache import KIND_VISUAL, HermesCache
from hermes.config import MemoryConfig
from hermes.rope import RotarySpec, rotate_between


def frame_directions(rows: torch.Tensor, frame_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each frame's content as a direction: the L2-normalised sum of its tokens' rows (a mean's direction).

    Args:
        rows: (V, C) one row per token (keys rotated back to position 0, or values).
        frame_index: (V,) the frame of each token.

    Returns:
        ((F,) the frames, ascending; (V,) each token's slot among them; (F, C) float32 directions).
    """
    frames, slot = torch.unique(frame_index, return_inverse=True)
    sums = torch.zeros(frames.numel(), rows.shape[1]).index_add_(0, slot, rows.float())
    return frames, slot, torch.nn.functional.normalize(sums, dim=1)


def frame_similarity(keys: torch.Tensor, positions: torch.Tensor, frame_index: torch.Tensor,
                     question_vector: torch.Tensor, spec: RotarySpec, per_frame: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine similarity of the question's vector with the content of some tokens of the last layer, per frame.

    Args:
        keys: (H, V, D) the tokens' keys as cached (rotated at `positions` (A, V)).
        frame_index: (V,) the frame of each token.
        question_vector: (H * D,) the question's search vector (L2-normalised, on the host).
        per_frame: one content vector per frame; else one over every token.

    Returns:
        ((F,) the frames, in ascending order (only the first without `per_frame`), (F,) float32 similarity).
    """
    if keys.shape[-2] == 0:
        return torch.empty(0, dtype=torch.long), torch.empty(0)
    pos = (positions[0] if spec.kind == "1d" else positions).to(keys.device)
    at_zero = rotate_between(keys.float(), pos, torch.zeros_like(pos), spec).to("cpu")  # (H, V, D)
    flat = at_zero.permute(1, 0, 2).reshape(keys.shape[-2], -1)  # (V, H * D)
    # without `per_frame`, every token is counted as the first frame's
    frames, _, directions = frame_directions(flat, frame_index if per_frame else
                                             torch.full_like(frame_index, int(frame_index.min())))
    return frames, directions @ question_vector.float()


def level1_similarity(cache: HermesCache, question_vector: torch.Tensor, spec: RotarySpec,
                      per_frame: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`frame_similarity` over the visual tokens level 1 holds in its last layer (summaries and recalled
    tokens excluded): (frames, similarity), per frame or, without `per_frame`, (1,) (empty if none)."""
    layer = cache.layers[-1]
    visual = (layer.kinds == KIND_VISUAL).nonzero().squeeze(1)  # (V,)
    keys = layer.keys[0].index_select(-2, visual.to(layer.keys.device))  # (H, V, D)
    return frame_similarity(keys, layer.positions[:, visual], layer.frame_index[visual], question_vector, spec,
                            per_frame)


def gate_hits(hits: list[tuple[int, float]], cache: HermesCache, question_vector: torch.Tensor, spec: RotarySpec,
              cfg: MemoryConfig) -> list[tuple[int, float]]:
    """The hits worth splicing under `memory.recall_gate` (all of them when it is off).

    Args:
        hits: (record id, cosine similarity to the question) from the index, best first.
        cache: the working cache (level 1), before anything is spliced.
        question_vector: (H * D,) the question's search vector.

    Returns:
        The kept hits, in their order.
    """
    if cfg.recall_gate == "off" or not hits:
        return hits
    # `question` gates a question that names no time as `above_frames` does
    _, in_cache = level1_similarity(cache, question_vector, spec, per_frame=cfg.recall_gate != "above_level1")
    if in_cache.numel() == 0:
        return hits
    floor = float(in_cache.max()) + cfg.recall_gate_margin
    return [(rid, score) for rid, score in hits if score > floor]


def recall_cap(cache: HermesCache, n_tokens: int, cfg: MemoryConfig) -> int:
    """Recalled tokens per layer after `memory.recall_max_ratio` (`n_tokens` when it is 0).

    Args:
        cache: the working cache (level 1), before anything is spliced.
        n_tokens: tokens per layer the recalled records hold.
    """
    if cfg.recall_share > 0:  # level 1 left this much of the budget to recall
        n_tokens = min(n_tokens, int(round(cfg.recall_share * cfg.budget)))
    if cfg.recall_max_ratio <= 0:
        return n_tokens
    visual = int((cache.layers[0].kinds == KIND_VISUAL).sum())
    return min(n_tokens, int(cfg.recall_max_ratio * visual))
