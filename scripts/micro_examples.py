"""Training examples for the micro model: synthetic streams, the memory a policy would keep of them, a
question, and what the auxiliary losses read (per-frame labels, the frames the answer is read from).

`scripts/train_micro.py` trains on them in stages (`RECIPES`); an example is drawn from one
`numpy.random.Generator`, so a seeded run draws the same examples every time (a test pins the shipped
recipe's draws). Only the random generator's calls decide a draw: changing what an example carries
without drawing anything more keeps every recipe's draws.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import cv2
import numpy as np

from hermes.datasets import synthetic_bench as sb
from hermes.datasets.records import KIND_COUNT, KIND_MC, BenchmarkQuestion
from hermes.datasets.registry import build_prompt
from hermes.datasets.runner import sent_text
from hermes.pipelines.session import OPTION_LETTERS, format_prompt

KINDS = sb.KINDS_V1  # the shipped weights' kinds (a new kind in a v1 stage would change its draw)
LAYOUTS = ("full", "window", "uniform", "sparse")
STYLES = ("ovo", "session", "open")
GRID = 4  # pooled tokens per frame side (16 per frame)
COVERED = 0.1  # a kept token "shows" the object when this fraction of its cell is object pixels
NAMED_KINDS = ("episodic_before", "episodic_after", "ordering_pair")  # questions that name objects
RELATION_KINDS = ("episodic_before", "episodic_after")  # "just before / after X": a neighbour of X


@dataclass(frozen=True)
class Stage:
    """What one training stage draws: question kinds, memory layouts and prompt styles (with weights)."""

    kinds: tuple[str, ...]
    layout_weights: tuple[float, ...]  # over `layouts`
    style_weights: tuple[float, ...]  # over STYLES
    max_frames: int  # most frames in memory in one example
    batch_size: int  # examples per step (cheap early stages take bigger batches: steadier, same wall time)
    layouts: tuple[str, ...] = LAYOUTS  # what `layout_weights` weighs
    # name X uniquely as the suite does (`sb.name_subjects`), at a random depth of the memory: in long memories
    # names repeat, and the only unique ones would be the rare colour's
    unique_subjects: bool = False
    # ask each memory of "just before / after X" two or three times (`make_examples`): about X, about another object,
    # about X's other neighbour, answers that differ, so that an answer that does not read the question is wrong
    contrast: bool = False


# A curriculum, each stage cheaper per step than the next and teaching what it builds on: what a frame
# shows; remembering, ordering and counting; every layout and prompt style (fewer long OVO prompts).
STAGES = {
    "bootstrap": Stage(("realtime_colour",), (1.0, 0.0, 0.0, 0.0), (0.2, 0.5, 0.3), 6, 32),
    "broaden": Stage(KINDS, (0.7, 0.1, 0.1, 0.1), (0.3, 0.4, 0.3), 12, 16),
    "main": Stage(KINDS, (0.4, 0.2, 0.2, 0.2), (0.35, 0.4, 0.25), 20, 16),
}
MAIN = STAGES["main"]
# `--recipe long`: memories of up to 128 frames as every policy selects them, counting and ordering drawn
# twice as often: they need moments minutes apart, which 20-frame memories never showed the model.
LONG = Stage(("realtime_colour", "episodic_first", "episodic_before", "ordering", "ordering", "counting", "counting"),
             (0.3, 0.15, 0.1, 0.25, 0.2), (0.35, 0.4, 0.25), 128, 8,
             ("full", "window", "uniform", "sparse", "recall"))
# `--recipe curriculum`: LONG on memories growing 16 -> 128 frames: a 128-frame step costs ~20 times a
# 16-frame one, and from scratch it learns nothing in a CPU budget.
CURRICULUM = {f"long{n}": Stage(LONG.kinds, LONG.layout_weights, LONG.style_weights, n, LONG.batch_size, LONG.layouts)
              for n in (16, 32, 64, 128)}
# `--recipe focus` (a pilot from the shipped weights): with `--aux-weight 0.5 --aux-layer 2` it taught
# ordering that holds to 180 frames, not counting (README, "Up to which memory length the weights answer").
FOCUS = Stage(("realtime_colour", "episodic_first", "episodic_before", "ordering", "ordering", "ordering",
               "counting", "counting", "counting"), (0.6, 0.1, 0.1, 0.1, 0.1), (0.35, 0.4, 0.25), 64, 8,
              ("full", "window", "uniform", "sparse", "recall"))
# `--recipe hold` (issue 37): the shape stage, then memories of 32, 96, 256 frames from every policy's selections, the memory
# kinds (first, just before / after X, which of two came first, a rare colour in the last N minutes) drawn
# twice as often as the others, and the shape on screen (names need it); with `--max-stream-s 1800` the
# selections sit where a half-hour stream puts them.
HOLD_KINDS = ("realtime_colour", "realtime_shape", "ordering", "counting") + 2 * sb.MEMORY_KINDS
HOLD = {f"hold{n}": Stage(HOLD_KINDS, (0.3, 0.2, 0.15, 0.2, 0.15), (0.35, 0.4, 0.25), n, batch,
                          ("full", "window", "uniform", "sparse", "recall"))
        for n, batch in ((32, 16), (96, 8), (256, 4))}
HOLD = {name: dataclasses.replace(stage, unique_subjects=True) for name, stage in HOLD.items()}
# `--recipe shape`: the shape on screen now, asked as often as its colour, on short memories: objects are named
# by colour and shape, and the shipped weights' visual tokens tell shapes apart 58 % of the time (colours 100 %).
SHAPE = Stage(("realtime_colour", "realtime_shape", "realtime_shape"), (0.6, 0.4), (0.35, 0.4, 0.25), 8, 32,
              ("full", "window"))
# `--recipe find` (issue 37): after the v1 stages, the memory kinds and the shape on screen, asked on memories
# growing 12 -> 32 -> 96 -> 256 frames (the hold stages' memories), no ordering or counting to share the steps.
# From a hold32 checkpoint, 400 steps of the first such stage answered "just before X" 94 % of the time at 4-12
# frames, where 600 more hold32 steps left it at 56 % at 8-32 frames (benchmarks/micro-hold-pilot.md, "Finding X
# in short memories first"); the shape is asked from the first of them on, where the hold recipe's shape stage of
# 8-frame memories cost long memories' realtime answers.
FIND_KINDS = ("realtime_colour", "realtime_shape", "episodic_first", "ordering_pair", "episodic_recent") + 2 * (
    "episodic_before", "episodic_after")  # X named twice as often: "just before / after X" each 2 in 9 examples
FIND = {"find12": Stage(FIND_KINDS, (0.7, 0.3), (0.35, 0.4, 0.25), 12, 32, ("full", "window"), unique_subjects=True),
        **{f"find{n}": dataclasses.replace(HOLD[f"hold{n}"], kinds=FIND_KINDS) for n in (32, 96, 256)}}
# `--recipe read` (issue 37): the find weights answer "just before X" without reading the question (asked about
# another object, or "after" for "before", they answer the same; benchmarks/micro-hold-pilot.md, "Reading the
# question"). Each memory of a named kind asked in contrast: the find stage's short streams (two or three objects),
# and 6, 12, 24 frames of long streams as `uniform` and `sparse` select them (an object a frame, X anywhere).
SPREAD = {f"spread{n}": Stage(FIND_KINDS, (0.0, 0.0, 0.5, 0.5), (0.35, 0.4, 0.25), n, batch, unique_subjects=True,
                              contrast=True) for n, batch in ((6, 32), (12, 32), (24, 16))}
READ = {"read12": dataclasses.replace(FIND["find12"], contrast=True), **SPREAD}
RECIPES = {"v1": STAGES, "shape": {**STAGES, "shape": SHAPE}, "long": {**STAGES, "long": LONG},  # v1: the shipped weights' recipe
           "curriculum": {**STAGES, **CURRICULUM}, "focus": {**STAGES, "focus": FOCUS},
           "hold": {**STAGES, "shape": SHAPE, **HOLD}, "find": {**STAGES, **FIND},
           "read": {**STAGES, **FIND, **READ}}
# Auxiliary per-visual-token targets (`--aux-weight`), read from one layer's hidden state by a linear head
# trained with the model and never saved: a 4-layer model given only the answer's loss finds neither the
# onsets counting needs nor the ranks ordering needs. `own` and `tally` (`--aux-count`) are the counting
# answer at every frame; neither taught it (benchmarks/micro-focus-pilot.md).
COUNT_CAP = 5  # "5 or more": counting questions ask about 1-4
AUX_CLASSES = {"colour": 1 + len(sb.COLOURS), "shape": 1 + len(sb.SHAPES), "onset": 2, "rank": 5,
               "own": 1 + COUNT_CAP, **{f"tally_{c}": 1 + COUNT_CAP for c in sb.COLOURS},
               "prev_colour": 1 + len(sb.COLOURS), "prev_shape": 1 + len(sb.SHAPES)}
AUX_SETS = {"none": ("colour", "shape", "onset", "rank"), "own": ("colour", "shape", "onset", "rank", "own"),
            "tally": ("colour", "shape", "onset", "rank") + tuple(f"tally_{c}" for c in sb.COLOURS),
            # the object before this one in memory: "just before X" reads it at X, "just after X" finds X in it
            "prev": ("colour", "shape", "onset", "rank", "prev_colour", "prev_shape")}


# What `--subject-weight` teaches the token that predicts the answer to carry: the question's half of finding
# X in memory (the frames carry their object, and the one before it, by AUX_CLASSES).
SUBJECT_CLASSES = {"colour": 1 + len(sb.COLOURS), "shape": 1 + len(sb.SHAPES), "relation": 3}


@dataclass
class Example:
    """One training example: the frames in memory, where they sit, the prompt and the answer."""

    frames: np.ndarray  # (K, S, S, 3) uint8 RGB: the frames with any token in memory, oldest first
    frame_index: np.ndarray  # (K,) their index in the stream (frame i was streamed at t = i s)
    keep: np.ndarray  # (K, 16) bool: which of each frame's tokens are in memory
    streamed: int  # frames streamed before the question (positions continue after them)
    prompt: str
    answer: str
    kind: str
    layout: str
    labels: np.ndarray  # (K, 13) int per frame, AUX_CLASSES' order: colour, shape (0 none), onset (0/1), rank (0 none,
    # 1-4), own (0 none, 1-COUNT_CAP), the tally of each colour in `sb.COLOURS`' order (0-COUNT_CAP), then the
    # colour and shape of the object before this frame's in memory (0 none)
    evidence: np.ndarray  # (K,) bool: the frames the answer is read from (`evidence_frames`)
    subject: np.ndarray  # (3,) int, SUBJECT_CLASSES' order: what the question looks for (`subject_labels`)


def named_object(q: sb.SynthQuestion) -> str:
    """X's name in "What colour was the object just before / after the red circle?": "red circle"."""
    return q.question.rsplit(" the ", 1)[1].rstrip("?")


def asked_colour(q: sb.SynthQuestion) -> str:
    """The colour of "Did a red object appear in the last N minutes?": "red"."""
    return q.question.split(" a ", 1)[1].split()[0]


def subject_labels(q: sb.SynthQuestion) -> np.ndarray:
    """What the question looks for, as the token that predicts the answer should carry it (`--subject-weight`):
    the colour and shape of the object it names (X of "just before / after X"; the colour alone of "in the
    last N minutes"; 0 none) and how memory shows it (1: X's own frames, "before"; 2: the frames after X's,
    which know X as the object before them, "after"; 0 otherwise).

    Returns:
        (3,) int64.
    """
    out = np.zeros(len(SUBJECT_CLASSES), np.int64)
    if q.kind in RELATION_KINDS:
        colour, shape = named_object(q).split()
        out[:] = 1 + sb.COLOURS.index(colour), 1 + sb.SHAPES.index(shape), 1 if q.kind == "episodic_before" else 2
    elif q.kind == "episodic_recent":
        out[0] = 1 + sb.COLOURS.index(asked_colour(q))
    return out


def frame_labels(timeline: sb.Timeline, frame_index: np.ndarray, label_frames: list[int]) -> np.ndarray:
    """Per frame in memory, the auxiliary targets (`AUX_CLASSES`): its object's colour and shape, whether
    it is the object's first frame in memory (onset), the object's rank (1-4) among those memory shows,
    `own` (objects of its colour shown so far, itself included) and per colour the tally so far; counts
    capped at COUNT_CAP, and the colour and shape of the object memory shows before this frame's. A frame
    whose object is not covered by kept tokens counts as empty.

    Returns:
        (K, 13) int64.
    """
    shown = set(label_frames)
    labels = np.zeros((len(frame_index), len(AUX_CLASSES)), np.int64)
    rank, last, prev, tally = 0, None, None, np.zeros(len(sb.COLOURS), np.int64)
    tallies = slice(5, 5 + len(sb.COLOURS))
    for row, i in enumerate(frame_index):
        app = timeline.on_screen(int(i)) if int(i) in shown else None
        if app is not None:
            colour = sb.COLOURS.index(app.colour)
            onset = app is not last
            rank += onset
            tally[colour] += onset
            if onset:
                prev, last = last, app
            labels[row, :5] = (1 + colour, 1 + sb.SHAPES.index(app.shape), int(onset), min(rank, 4),
                               min(tally[colour], COUNT_CAP))
            if prev is not None:
                labels[row, tallies.stop:] = (1 + sb.COLOURS.index(prev.colour), 1 + sb.SHAPES.index(prev.shape))
        labels[row, tallies] = np.minimum(tally, COUNT_CAP)
    return labels


def evidence_frames(timeline: sb.Timeline, q: sb.SynthQuestion, frame_index: np.ndarray,
                    label_frames: list[int]) -> np.ndarray:
    """Per frame in memory, whether it shows an object the answer is read from, given what the auxiliary
    targets put in every frame (`--aux-count prev`: its object and the one before): the newest frame
    (realtime), the first or n-th object, X for "just before X" (its frames know the object before it),
    the object after X for "just after X" (its frames know X), both objects of "which came first", the
    newest object of the colour asked about in "in the last N minutes". Counting reads every object of a
    colour: no frame is marked. What `--attn-weight` teaches one attention head to look at.

    Returns:
        (K,) bool.
    """
    shown = set(label_frames)
    apps = [timeline.on_screen(int(i)) if int(i) in shown else None for i in frame_index]
    seen = sorted(set(apps) - {None}, key=lambda a: a.start_s)
    index_of = {a.name: k for k, a in enumerate(seen)}
    if q.kind.startswith("realtime"):
        return np.arange(len(frame_index)) == len(frame_index) - 1
    if q.kind == "episodic_first":
        wanted = seen[:1]
    elif q.kind == "ordering":
        wanted = [seen[next(n for n, word in enumerate(sb.ORDINALS) if f"the {word} object" in q.question)]]
    elif q.kind in RELATION_KINDS:
        x = index_of[named_object(q)]
        wanted = [seen[x if q.kind == "episodic_before" else x + 1]]
    elif q.kind == "ordering_pair":
        wanted = [seen[index_of[name]] for name in q.options]
    elif q.kind == "episodic_recent":
        wanted = [a for a in seen if a.colour == asked_colour(q)][-1:]
    else:
        wanted = []
    return np.array([a is not None and a in wanted for a in apps], bool)


def choose_memory(rng: np.random.Generator, layout: str, streamed: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(frame indices (n,) ascending, keep (n, 16) bool token masks) that a memory of `k` frames' worth
    holds under `layout`; the newest frame is always whole.
    """
    per = GRID * GRID
    if layout == "full":
        frames = np.arange(streamed)
        return frames, np.ones((streamed, per), bool)
    if layout == "uniform":
        frames = np.unique(np.round(np.linspace(0, streamed - 1, k)).astype(int))
        return frames, np.ones((len(frames), per), bool)
    if layout == "window":  # sliding: 4 sink tokens of frame 0, then the most recent tokens
        budget = k * per - int(rng.integers(0, per))
        start = streamed * per - (budget - 4)
        token = np.arange(streamed * per)
        kept = (token >= start) | (token < 4)
        frames = np.unique(token[kept] // per)
        return frames, kept.reshape(streamed, per)[frames]
    if layout == "recall":  # a recent window, and older records brought back, spliced in time order
        window = int(rng.integers(1, k))
        older = rng.choice(streamed - window, size=min(k - window, streamed - window), replace=False)
        frames = np.unique(np.concatenate([older, np.arange(streamed - window, streamed)]))
        keep = rng.random((len(frames), per)) < rng.uniform(0.5, 1.0, size=(len(frames), 1))
        keep[frames >= streamed - window] = True
        keep[keep.sum(1) == 0, 0] = True
        return frames, keep
    # sparse: a scattered subset with partly kept frames (per-token importance keeps pieces)
    older = np.sort(rng.choice(streamed - 1, size=min(k - 1, streamed - 1), replace=False))
    frames = np.append(older, streamed - 1)
    keep = rng.random((len(frames), per)) < rng.uniform(0.4, 1.0, size=(len(frames), 1))
    keep[-1] = True
    keep[keep.sum(1) == 0, 0] = True
    return frames, keep


def covered(frame: np.ndarray, keep: np.ndarray) -> bool:
    """Whether the kept tokens of `frame` show its object (object pixels in a kept token's cell)."""
    mask = np.any(frame != np.asarray(sb.BACKGROUND_RGB, np.uint8), axis=-1)
    cell = frame.shape[0] // GRID
    share = mask[: cell * GRID, : cell * GRID].reshape(GRID, cell, GRID, cell).mean(axis=(1, 3)).reshape(-1)
    return bool((share[keep] >= COVERED).any())


def jpeg_like(frame: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Lossy-code a frame (JPEG at a random quality): the eval videos are mp4, training frames are not."""
    ok, buf = cv2.imencode(".jpg", frame[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, int(rng.integers(40, 96))])
    return cv2.imdecode(buf, cv2.IMREAD_COLOR)[:, :, ::-1] if ok else frame


def prompt_text(q: sb.SynthQuestion, style: str) -> tuple[str, str]:
    """(prompt, answer) as hermes sends and scores `q`: "ovo" (OVO-Bench's official prompt; the letter,
    or the count), "session" (`format_prompt` with options; the letter, or the count) or "open" (the
    bare question; the option's text, "red").
    """
    if style == "open" or (q.kind == "counting" and style == "session"):
        return q.question, q.answer
    letter = OPTION_LETTERS[q.gt] if q.gt is not None else q.answer
    if style == "session":
        return format_prompt(q.question, q.options), letter
    kind = KIND_COUNT if q.kind == "counting" else KIND_MC
    record = BenchmarkQuestion(q.question, q.options, q.answer, q.gt, q.t_s, q.task, {}, "train", {"kind": kind})
    return sent_text(build_prompt("ovo-bench", record)), letter  # as the eval runner sends it


def make_example(rng: np.random.Generator, stage: Stage, max_stream_s: int, kind: str | None = None,
                 layout: str | None = None) -> Example:
    """Draw one example of `stage`: the first of `make_examples`."""
    return make_examples(rng, stage, max_stream_s, kind, layout)[0]


def make_examples(rng: np.random.Generator, stage: Stage, max_stream_s: int, kind: str | None = None,
                  layout: str | None = None) -> list[Example]:
    """Draw one memory of `stage` and the examples asked about it (retrying until the drawn stream supports the
    drawn question): one, or for "just before / after X" in a `Stage.contrast` stage two or three (about X; about
    another object Y, same relation; about X's other neighbour; in one prompt style), those whose answers memory
    shows and differ from the first's.

    Returns:
        The examples, the drawn question's first.
    """
    kind = kind or str(rng.choice(stage.kinds))
    layout = layout or str(rng.choice(stage.layouts, p=stage.layout_weights))
    max_frames = stage.max_frames
    contrast = stage.contrast and kind in RELATION_KINDS  # names X and Y as `unique_subjects` does
    target_count = str(rng.integers(1, 5))  # counts drawn evenly, not as they fall (mostly 1 in short clips)
    # episodic_recent: yes and no evenly (drawn only for it: the other kinds' draws stay the shipped recipe's)
    target_yes = str(rng.choice(sb.YES_NO)) if kind == "episodic_recent" else None
    for attempt in range(1000):
        if attempt % 50 == 49:  # that count does not fit this layout (4 in a short window): draw another
            target_count = str(rng.integers(1, 5))
        if attempt == 200:  # e.g. ordering needs four objects: more than a short full clip holds
            layout = "uniform"
        k = int(rng.integers(4, max_frames + 1))
        streamed = k if layout == "full" else int(rng.integers(k + 4, max_stream_s + 1))
        timeline = sb.random_timeline(rng, streamed, lead_in_s=(0, 4))
        frames_idx, keep = choose_memory(rng, layout, streamed, k)
        subject_s = None
        if (stage.unique_subjects and kind in NAMED_KINDS) or contrast:
            targets = rng.choice(frames_idx, size=2 if kind == "ordering_pair" or contrast else 1)
            try:
                timeline, subjects = sb.name_subjects(rng, timeline, [(float(t), streamed - 0.5) for t in targets])
            except ValueError:  # nothing gone by the question yet
                continue
            subject_s = subjects[0] if contrast else min(subjects)
        # a wholly kept frame always counts; only partly kept ones need their pixels looked at
        label_frames = [int(i) for i, m in zip(frames_idx, keep)
                        if i == streamed - 1 or m.all() or covered(sb.render_frame(timeline, int(i)), m)]
        colour = timeline.rare_colour if kind == "counting" and rng.random() < 0.7 else None
        q = sb.make_question(rng, timeline, label_frames, kind, streamed - 0.5, colour=colour, subject_s=subject_s)
        if q is None or (q.kind == "counting" and q.answer != target_count) or (
                q.kind == "episodic_recent" and q.answer != target_yes):
            continue
        frames = np.stack([sb.render_frame(timeline, int(i)) for i in frames_idx])
        if rng.random() < 0.8:
            frames = np.stack([jpeg_like(f, rng) for f in frames])
        style = str(rng.choice(STYLES, p=stage.style_weights))
        labels = frame_labels(timeline, frames_idx, label_frames)
        asked = [q]
        if contrast:  # Y (another name) with X's relation, and X with the other one, where memory answers otherwise
            other = RELATION_KINDS[1 - RELATION_KINDS.index(kind)]
            siblings = [sb.make_question(rng, timeline, label_frames, k, streamed - 0.5, subject_s=s)
                        for k, s in ((kind, subjects[1]), (other, subjects[0]))]
            # X's neighbours often share a colour (the rare colour takes every other slot): no contrast there
            asked += [a for a in siblings if a is not None and a.answer != q.answer]
            if len(asked) == 1:
                continue
        examples = []
        for question in asked:
            prompt, answer = prompt_text(question, style)
            examples.append(Example(frames, frames_idx, keep, streamed, prompt, answer, question.kind, layout, labels,
                                    evidence_frames(timeline, question, frames_idx, label_frames),
                                    subject_labels(question)))
        return examples
    raise RuntimeError(f"no {kind} question fits {layout} memories of at most {max_frames} frames")
