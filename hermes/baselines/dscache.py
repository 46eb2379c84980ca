"""`dscache`: DSCache's decoupled caches (Pang et al., ICML 2026; github.com/pangzhan27/DSCache at 06176b1).

What follows its code (`DSCache/OVOBench_last.py` and `StreamingBench_last.py`: `get_response`;
`llava_ov/long_function.py`: `visual_cache_encode_llava_spatial`, `sample_long_cache`):
- the past cache is cumulative: a frame joins it once it is older than the instant buffer, encoded
  after the past frames before it (never after the instant ones), and the oldest whole frame leaves it
  when it holds more than its size (`context_len + 1` frames; here `memory.budget` visual tokens in
  whole frames);
- each question builds a fresh instant cache of the newest `frame_len + 1` frames (`memory.recent_frames`
  + 1 at `memory.recent_fps`), encoded on the prefix alone (decoupled from the past), then answers from
  prefix + past + instant, every entry moved to consecutive positions in that order ("continuous" in
  its logs' names: keys re-rotated, values as encoded);
- the past joins the answer every `memory.past_stride` frames (`ls_N`), counting back from the newest
  past frame and leaving it out as `sample_long_cache` does ((B - s) mod s, ..., B - s); fewer than N
  past frames: none.
Its logs name the settings per benchmark: LLaVA-OV 24-4 / stride 1.0 / ls_1 (OVO-Bench), 16-4 / 1.0 /
ls_1 (StreamingBench); Qwen2.5-VL 12-4 / 2.0 / ls_2 and 4-12 / 2.0 / ls_2. The preset takes
LLaVA-OV's OVO-Bench row: 25 past frames of 196 tokens (`budget: 4900`), 4 + 1 instant frames, ls_1.

Ours: the past is level 1 of the session (the stream's chunks, `stream.fps`; DSCache feeds one frame at
a time at 1 fps), holding the instant frames as well until they age into the past; the newest frame is
encoded at the model's video resolution like the others (DSCache pools it finer, its `stride`, 729 +
1 tokens on LLaVA-OV at stride 1.0); the prompt is the adapter's template. docs/ARCHITECTURE.md
(Memory, Baselines).
"""

from __future__ import annotations

from collections import deque

import torch

from hermes.baselines import NoLowerLevels
from hermes.baselines.recent_frames import pick_recent
from hermes.cache import KIND_PREFIX, KIND_VISUAL, HermesCache
from hermes.config import MemoryConfig
from hermes.memory import BudgetPolicy, Choice, move_entries
from hermes.model_protocol import CoreModel


def sampled_past(frames: torch.Tensor, stride: int) -> torch.Tensor:
    """The past frames that join an answer (`sample_long_cache`): of B frames (ascending), those at
    (B - s) mod s, ..., B - s in steps of s; all for s = 1; none when B < s.

    Args:
        frames: (B,) frame indices, ascending.
        stride: s, `memory.past_stride`.

    Returns:
        The chosen frame indices, ascending.
    """
    count = frames.numel()
    if count < stride:
        return frames[:0]
    return frames[(count - stride) % stride::stride]


class DSCachePolicy(NoLowerLevels, BudgetPolicy):
    """A frame-level past cache in level 1 and a fresh instant cache per question."""

    name = "dscache"

    def __init__(self, cfg: MemoryConfig, model: CoreModel) -> None:
        super().__init__(cfg, model)
        # (stream frame index, Frame): enough to thin to the instant frames from any rate up to 64x recent_fps
        self.frames: deque = deque(maxlen=64 * (cfg.recent_frames + 1))
        self.seen = 0  # frames fed so far; the session numbers cached frames the same way

    def keep_frames(self, frames) -> bool:
        """Keep the chunk's frames for the instant cache; the session still encodes them (the past)."""
        self.frames.extend(zip(range(self.seen, self.seen + len(frames)), frames))
        self.seen += len(frames)
        return False

    def instant(self) -> list:
        """The (frame index, Frame) of the instant cache: the newest `recent_frames` + 1 at `recent_fps`."""
        kept = list(self.frames)
        picked = pick_recent([f.t_s for _, f in kept], self.cfg.recent_frames + 1, self.cfg.recent_fps)
        return [kept[i] for i in picked]

    def _past_frames(self, cache: HermesCache) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(frame of each visual entry (V,), the past frames ascending, visual tokens per frame) of level 1:
        the past is every cached frame older than the instant cache's oldest."""
        frames = cache.layers[0].frame_index[cache.prefix_len:]
        instant = self.instant()
        oldest_instant = instant[0][0] if instant else self.seen
        held, per_frame = torch.unique(frames, return_counts=True)
        return frames, held[held < oldest_instant], int(per_frame.max()) if per_frame.numel() else 1

    def evicts_after(self, cache: HermesCache, n_new: int) -> bool:
        """Whether the past holds more than `budget` visual tokens (checked after each chunk: `n_new` is 0)."""
        frames, past, per_frame = self._past_frames(cache)
        return past.numel() * per_frame > self.cfg.budget

    def choose(self, cache: HermesCache, prefix_len: int, probe: torch.Tensor | None = None) -> Choice:
        """Keep the instant frames and the newest whole past frames within `budget` (the oldest leave first)."""
        frames, past, per_frame = self._past_frames(cache)
        keep_past = past[past.numel() - max(1, self.keep_tokens // per_frame):]
        chosen = (frames > (past.max() if past.numel() else -1)) | torch.isin(frames, keep_past)
        keep = prefix_len + chosen.nonzero().squeeze(1)
        return Choice(keep=keep.expand(cache.num_layers, -1))

    def answer_cache(self, model: CoreModel, cache: HermesCache, question: str) -> HermesCache:
        """A fresh cache: the prefix, the sampled past (copied from level 1), then the instant frames
        encoded on the prefix alone; every entry after the prefix at consecutive positions."""
        answer = model.new_cache()
        model.encode_prefix(answer)
        instant = self.instant()
        if instant:
            chunk = model.encode_chunk([f.rgb for _, f in instant], [f.t_s for _, f in instant])
            positions = self.place(answer, chunk.layout)
            model.prefill(chunk.embeds, positions, answer, **chunk.model_kwargs)
            answer.record(positions, KIND_VISUAL, torch.tensor([i for i, _ in instant])[chunk.frame_index])
        frames, past, _ = self._past_frames(cache)
        chosen = torch.isin(frames, sampled_past(past, self.cfg.past_stride)).nonzero().squeeze(1) + cache.prefix_len
        if chosen.numel():
            parts = [layer.entries(chosen) for layer in cache.layers]
            # the instant block moves past the largest past position, so that packing puts the past first
            shift = max(int(p.positions.max()) for p in parts) + 1 - answer.prefix_len
            for layer in answer.layers:
                moved = layer.positions + shift * (layer.kinds != KIND_PREFIX)
                move_entries(layer, moved, self.spec)
            answer.append([p.keys for p in parts], [p.values for p in parts], [p.positions for p in parts],
                          KIND_VISUAL, [p.frame_index for p in parts])
            self.compact(answer)  # prefix, past, instant: back to back
        return answer
