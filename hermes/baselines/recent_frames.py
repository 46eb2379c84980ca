"""`recent-frames`: the last N frames, re-encoded fresh for each question (SimpleStream, 2026).

No memory: frames are kept (RGB, host) instead of encoded, and each question gets a fresh cache of
the newest `recent_frames` at `recent_fps`, fed as SimpleStream feeds them (github.com/EvolvingLMMs-Lab/
SimpleStream at be227ee, `lib/`): separate images, no system turn, the question after a newline.
With Qwen2.5-VL-7B it scores 65.1 on OVO-Bench against HERMES's 59.2, so claims that memory helps
are made beside it. docs/ARCHITECTURE.md (Memory, Baselines) lists what still differs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch

from hermes.cache import KIND_VISUAL, HermesCache
from hermes.config import MemoryConfig
from hermes.baselines import NoLowerLevels
from hermes.model_protocol import CoreModel
from hermes.prompt import OPTION_LETTERS, check_option_count


def pick_recent(times_s: list[float], count: int, fps: float) -> list[int]:
    """Indices (ascending) of the last `count` frames at `fps`: walking back from the newest, each next one
    the newest at least 1/fps before the previous taken (a slower stream keeps every frame).

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

    def __init__(self, cfg: MemoryConfig, model: CoreModel) -> None:
        super().__init__(cfg, model)
        # enough frames to thin to `recent_frames` at `recent_fps` from any sampling rate up to 64x it
        self.frames: deque = deque(maxlen=64 * cfg.recent_frames)

    def keep_frames(self, frames) -> bool:
        """Take the frames of a chunk instead of encoding them (`Frame`s, in time order)."""
        self.frames.extend(frames)
        return True

    def answer_cache(self, model: CoreModel, cache: HermesCache, question: str) -> HermesCache:
        """A fresh cache: the user turn's opening, then the last frames as separate images."""
        cache = model.new_cache()
        model.encode_prefix(cache, model.images_prefix_text())
        frames = list(self.frames)
        picked = [frames[i] for i in pick_recent([f.t_s for f in frames], self.cfg.recent_frames, self.cfg.recent_fps)]
        if picked:
            chunk = model.encode_images([f.rgb for f in picked], [f.t_s for f in picked])
            positions = self.place(cache, chunk.layout)
            model.prefill(chunk.embeds, positions, cache, **chunk.model_kwargs)
            cache.record(positions, KIND_VISUAL, chunk.frame_index)
        return cache

    def question_embeds(self, model: CoreModel, question: str, options: Sequence[str] = ()) -> torch.Tensor:
        """(Q, hidden) embeddings of `question` after the images of `answer_cache`, worded by `simplestream_prompt`."""
        return model.images_question_embeds(simplestream_prompt(question, options))


def simplestream_prompt(question: str, options: Sequence[str] = ()) -> str:
    """The user text SimpleStream sends after the images: the question; with options, its OVO-Bench
    template (`ovo_constants.py` BR_PROMPT_TEMPLATE: options on one line, lettered and ';'-ended).

    Raises:
        UsageError: more options than letters (A-J).
    """
    if not options:
        return question
    check_option_count(options)
    lettered = "; ".join(f"{OPTION_LETTERS[i]}. {text}" for i, text in enumerate(options))
    return f"{question}\nOptions: {lettered};\nOnly give the best option's letter directly."
