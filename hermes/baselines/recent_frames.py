"""`recent-frames`: the last N frames, re-encoded fresh for each question (SimpleStream, 2026).

No memory at all: the stream's frames are not encoded as they arrive; the policy only keeps the
newest ones (RGB, in host memory). A question gets a fresh cache holding the system prefix and
the last `recent_frames` frames at `recent_fps`, counted back from the newest frame before the
question, and nothing of it is reused for the next question. With Qwen2.5-VL-7B this scores 65.1
on OVO-Bench against HERMES's 59.2, so any claim that memory helps must be made beside it.

Hooks: the session asks `reencodes` (hand frames to `keep_frames` instead of encoding them) and
`answer_cache(model, cache, question)` (the cache a question is answered from).
"""

from __future__ import annotations

from collections import deque

from hermes.cache import KIND_VISUAL, HermesCache
from hermes.config import MemoryConfig
from hermes.errors import ConfigError
from hermes.baselines import NoLowerLevels
from hermes.model_protocol import CoreModel


def pick_recent(times_s: list[float], count: int, fps: float) -> list[int]:
    """Indices (ascending) of the last `count` frames at `fps`, counted back from the newest.

    Walking back from the newest frame, the next one taken is the newest at least 1/fps
    seconds before the previous one taken (a stream sampled faster than `fps` is thinned; one
    sampled slower keeps every frame).

    Args:
        times_s: Frame times in seconds, ascending.
        count: Frames wanted.
        fps: Their rate.

    Returns:
        At most `count` indices into `times_s`, ascending.
    """
    step = 1.0 / fps
    picked: list[int] = []
    for i in range(len(times_s) - 1, -1, -1):
        if len(picked) == count:
            break
        if not picked or times_s[i] <= times_s[picked[-1]] - step + 1e-9:
            picked.append(i)
    return picked[::-1]


class RecentFramesPolicy(NoLowerLevels):
    """Keeps no KV memory; re-encodes the newest frames for every question."""

    name = "recent-frames"
    reencodes = True

    def __init__(self, cfg: MemoryConfig, model: CoreModel) -> None:
        super().__init__(cfg, model)
        if cfg.recent_frames < 1 or cfg.recent_fps <= 0:
            raise ConfigError(f"memory.recent_frames must be at least 1 and memory.recent_fps positive, found "
                              f"{cfg.recent_frames} and {cfg.recent_fps}")
        # enough frames to thin to `recent_frames` at `recent_fps` from any sampling rate up to 64x it
        self.frames: deque = deque(maxlen=64 * cfg.recent_frames)

    def keep_frames(self, frames) -> None:
        """Take the frames of a chunk instead of encoding them (`Frame`s, in time order)."""
        self.frames.extend(frames)

    def answer_cache(self, model: CoreModel, cache: HermesCache, question: str) -> HermesCache:
        """A fresh cache: the prefix, then the last frames encoded in one chunk (`cache`, the
        stream's, holds only the prefix; `question` is not needed)."""
        cache = model.new_cache()
        model.encode_prefix(cache)
        frames = list(self.frames)
        picked = [frames[i] for i in pick_recent([f.t_s for f in frames], self.cfg.recent_frames, self.cfg.recent_fps)]
        if picked:
            chunk = model.encode_chunk([f.rgb for f in picked], [f.t_s for f in picked])
            positions = self.place(cache, chunk.layout)
            model.prefill(chunk.embeds, positions, cache, **chunk.model_kwargs)
            cache.record(positions, KIND_VISUAL, chunk.frame_index)
        self.last_frame_t_s = picked[-1].t_s if picked else None
        return cache
