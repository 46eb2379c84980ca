"""`recent-frames`: the last N frames, re-encoded fresh for each question (SimpleStream, 2026).

No memory at all: the stream's frames are not encoded as they arrive; the policy only keeps the
newest ones (RGB, in host memory). A question gets a fresh cache holding the last `recent_frames`
frames at `recent_fps`, counted back from the newest frame before the question, and nothing of it
is reused for the next question. With Qwen2.5-VL-7B this scores 65.1 on OVO-Bench against
HERMES's 59.2, so any claim that memory helps must be made beside it.

The input is SimpleStream's (github.com/EvolvingLMMs-Lab/SimpleStream at be227ee, `lib/`):
each frame is encoded as a separate image (on Qwen-VL one grid of h x w merged patches per frame,
not a video whose grid steps merge frames in pairs), after a user turn with no system turn, and
the question follows the images after a newline (`VLMAdapter.encode_images`,
`images_prefix_text`, `images_question_embeds`). A multiple-choice question asked with options is
written as SimpleStream writes OVO-Bench's (`simplestream_prompt`). ARCHITECTURE.md (Memory,
Baselines) lists what still differs.

Hooks: the session asks `reencodes` (hand frames to `keep_frames` instead of encoding them),
`answer_cache(model, cache, question)` (the cache a question is answered from) and
`question_embeds(model, question, options)` (the question in this framing).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from string import ascii_uppercase

import torch

from hermes.cache import KIND_VISUAL, HermesCache
from hermes.config import MemoryConfig
from hermes.errors import UsageError
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
        # enough frames to thin to `recent_frames` at `recent_fps` from any sampling rate up to 64x it
        self.frames: deque = deque(maxlen=64 * cfg.recent_frames)

    def keep_frames(self, frames) -> None:
        """Take the frames of a chunk instead of encoding them (`Frame`s, in time order)."""
        self.frames.extend(frames)

    def answer_cache(self, model: CoreModel, cache: HermesCache, question: str) -> HermesCache:
        """A fresh cache: the user turn's opening, then the last frames as separate images (`cache`,
        the stream's, holds only the prefix; `question` is not needed)."""
        cache = model.new_cache()
        model.encode_prefix(cache, model.images_prefix_text())
        frames = list(self.frames)
        picked = [frames[i] for i in pick_recent([f.t_s for f in frames], self.cfg.recent_frames, self.cfg.recent_fps)]
        if picked:
            chunk = model.encode_images([f.rgb for f in picked], [f.t_s for f in picked])
            positions = self.place(cache, chunk.layout)
            model.prefill(chunk.embeds, positions, cache, **chunk.model_kwargs)
            cache.record(positions, KIND_VISUAL, chunk.frame_index)
        self.last_frame_t_s = picked[-1].t_s if picked else None
        return cache

    def question_embeds(self, model: CoreModel, question: str, options: Sequence[str] = ()) -> torch.Tensor:
        """(Q, hidden) embeddings of `question` after the images of `answer_cache`, worded by `simplestream_prompt`."""
        return model.images_question_embeds(simplestream_prompt(question, options))


def simplestream_prompt(question: str, options: Sequence[str] = ()) -> str:
    """The user text SimpleStream sends: the question; with options, its OVO-Bench multiple-choice
    template (`ovo_constants.py` BR_PROMPT_TEMPLATE: options on one line, lettered and ';'-ended).

    Args:
        question: the question text.
        options: multiple-choice options, lettered A, B, ... (none: the question as it is).

    Returns:
        The text placed after the images.

    Raises:
        UsageError: more options than letters.
    """
    if not options:
        return question
    if len(options) > len(ascii_uppercase):
        raise UsageError(f"at most {len(ascii_uppercase)} options per question, found {len(options)}")
    lettered = "; ".join(f"{ascii_uppercase[i]}. {text}" for i, text in enumerate(options))
    return f"{question}\nOptions: {lettered};\nOnly give the best option's letter directly."
