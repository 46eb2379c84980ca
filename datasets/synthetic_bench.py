"""A seeded synthetic streaming benchmark in the OVO-Bench format (its task codes, so its loader, prompts and
scorer apply), and training clips from the same world (README.md, "The micro model and the synthetic
benchmark"). Frame `i` is the picture at `t = i` s (1 fps); a question at `t_s` is about frames `< t_s`.
Everything is a pure function of the seed. `write_suite_set` writes one set of the depth-balanced suite
for `scripts/eval_micro.py --sweep`.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

# The shapes' motion and the background are the demo videos' (`hermes.pipelines.synthetic`); the world
# itself (timelines of appearances, the questions) is the benchmark's own: the micro model was trained
# on exactly these streams, so its generation must not change.
from hermes.pipelines.synthetic import BACKGROUND_RGB, bounce, write_mp4

COLOURS_RGB = {"red": (230, 40, 40), "green": (40, 200, 60), "blue": (50, 90, 240),
               "yellow": (240, 220, 40), "purple": (160, 60, 230), "white": (235, 235, 235)}
COLOURS = tuple(COLOURS_RGB)
SHAPES = ("circle", "square", "triangle")
FRAME_SIZE_PX = 64  # written frames; the micro model resizes them to its own input
FAMILIES = ("realtime", "episodic", "counting", "ordering")
TASK_OF = {"realtime_colour": "ATR", "episodic_first": "EPM", "episodic_before": "EPM",
           "ordering": "ASI", "counting": "REC",
           # issue 37's memory kinds: need memory, no arithmetic; each joins the family of its task code
           "episodic_after": "EPM", "ordering_pair": "ASI", "episodic_recent": "EPM",
           # what a name's shape needs: the micro model must see it before it can find "the red triangle"
           "realtime_shape": "ATR"}
KINDS_V1 = ("realtime_colour", "episodic_first", "episodic_before", "ordering", "counting")  # the shipped weights'
MEMORY_KINDS = ("episodic_first", "episodic_before", "episodic_after", "ordering_pair", "episodic_recent")
YES_NO = ("yes", "no")
# "in the last N seconds / minutes" (1 fps: a window of w seconds is w frames)
RECENT_WINDOWS_S = (10, 20, 30, 45, 60, 120, 180, 300, 600, 900, 1200)
ORDINALS = ("first", "second", "third")
ANNOTATION_FILE = "ovo_bench_new.json"
META_FILE = "synthetic_bench.json"


@dataclass(frozen=True)
class Appearance:
    """One object on screen for frames `start_s` .. `end_s - 1`; geometry in fractions of the frame side."""

    colour: str
    shape: str
    start_s: int
    end_s: int  # exclusive
    u0: float  # start of the centre's path, in [0, 1] of the free range (see `centre`)
    v0: float
    du: float  # path speed, free ranges per second
    dv: float
    radius: float  # half-size, fraction of the frame side

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"

    def centre(self, t_s: float) -> tuple[float, float]:
        """Centre (x, y) as fractions of the frame; the path bounces so the object stays inside."""
        free = 1.0 - 2.0 * self.radius
        dt = t_s - self.start_s
        return (self.radius + free * bounce(self.u0 + self.du * dt),
                self.radius + free * bounce(self.v0 + self.dv * dt))


@dataclass
class Timeline:
    """Every appearance of one stream, in time order, non-overlapping."""

    duration_s: int
    appearances: list[Appearance]
    rare_colour: str | None = None  # the colour `make_timeline` gave a planned count, if any

    def on_screen(self, frame_index: int) -> Appearance | None:
        """The object in frame `frame_index`, or None (a binary search: a day's stream has ~17,000 objects)."""
        i = bisect.bisect_right(self.appearances, frame_index, key=lambda a: a.start_s) - 1
        return self.appearances[i] if i >= 0 and frame_index < self.appearances[i].end_s else None

    def frames_before(self, t_s: float) -> list[int]:
        """The frames a question at `t_s` may use: those strictly before it."""
        return list(range(min(self.duration_s, int(np.ceil(t_s)))))


def make_timeline(rng: np.random.Generator, duration_s: int, *, lead_in_s: tuple[int, int] = (1, 4),
                  visible_s: tuple[int, int] = (2, 4), gap_s: tuple[int, int] = (1, 3),
                  rare_colour: str | None = None, rare_count: int = 0) -> Timeline:
    """Draw a stream: objects of random colour and shape, one at a time, with empty gaps.

    Consecutive objects never share a colour, so every appearance is a separate event; `rare_colour`
    (for counting) is given to `rare_count` appearances (fewer in a short stream), no two neighbours.

    Args:
        rng: the only source of randomness.
        lead_in_s, visible_s, gap_s: inclusive ranges, in seconds, of the empty start, of each
            appearance and of the gaps between them.
    """
    palette = [c for c in COLOURS if c != rare_colour]
    apps: list[Appearance] = []
    t = int(rng.integers(lead_in_s[0], lead_in_s[1] + 1))
    while True:
        length = int(rng.integers(visible_s[0], visible_s[1] + 1))
        if t + length > duration_s:
            break
        colour = str(rng.choice([c for c in palette if not apps or c != apps[-1].colour]))
        radius = float(rng.uniform(0.2, 0.28))
        apps.append(Appearance(colour, str(rng.choice(SHAPES)), t, t + length, float(rng.uniform(0, 1)),
                               float(rng.uniform(0, 1)), float(rng.uniform(-0.15, 0.15)),
                               float(rng.uniform(-0.15, 0.15)), radius))
        t += length + int(rng.integers(gap_s[0], gap_s[1] + 1))
    if rare_colour is not None and rare_count > 0:
        # every other slot from a random parity, so no two rare appearances are neighbours
        slots = np.arange(int(rng.integers(0, 2)), len(apps), 2)
        for s in sorted(rng.permutation(slots)[:rare_count].tolist()):
            apps[s] = replace(apps[s], colour=rare_colour)
    return Timeline(duration_s, apps, rare_colour if rare_count > 0 else None)


def render_frame(timeline: Timeline, frame_index: int, size_px: int = FRAME_SIZE_PX) -> np.ndarray:
    """The picture at `t = frame_index` s, (size_px, size_px, 3) uint8 RGB."""
    frame = np.empty((size_px, size_px, 3), dtype=np.uint8)
    frame[:] = BACKGROUND_RGB
    app = timeline.on_screen(frame_index)
    if app is None:
        return frame
    cx, cy = (c * (size_px - 1) for c in app.centre(float(frame_index)))
    r_px = app.radius * size_px
    ys, xs = np.mgrid[0:size_px, 0:size_px]
    dx, dy = xs - cx, ys - cy
    if app.shape == "circle":
        mask = dx**2 + dy**2 <= r_px**2
    elif app.shape == "square":
        half = 0.85 * r_px  # about the circle's area, so size never tells the shape
        mask = (np.abs(dx) <= half) & (np.abs(dy) <= half)
    else:  # triangle pointing up: apex at the top, base at the bottom
        mask = (dy <= r_px) & (np.abs(dx) <= (dy + r_px) / 2.0)
    frame[mask] = COLOURS_RGB[app.colour]
    return frame


def render_frames(timeline: Timeline, num_frames: int | None = None, size_px: int = FRAME_SIZE_PX) -> np.ndarray:
    """Frames 0 .. num_frames - 1 (default: the whole stream) as one (N, size, size, 3) uint8 array."""
    n = timeline.duration_s if num_frames is None else num_frames
    return np.stack([render_frame(timeline, i, size_px) for i in range(n)])


@dataclass
class SynthQuestion:
    """One question about a stream at `t_s`.

    Attributes:
        kind: a key of `TASK_OF`.
        gt: index of the right option (None for counting).
        answer: the right option's text, or the count as a string.
        activity: counting only: the REC activity ("show a red object").
        depth: suite episodic questions: "first", or the depth of the object named in % of the question
            time ("10" ... "90"); "" otherwise.
        subject_s: with `depth`: `start_s` of the object the question names.
    """

    kind: str
    question: str
    options: list[str]
    gt: int | None
    answer: str
    t_s: float
    activity: str = ""
    depth: str = ""
    subject_s: int | None = None

    @property
    def family(self) -> str:
        return self.kind.split("_")[0]

    @property
    def task(self) -> str:
        return TASK_OF[self.kind]


def _choice_question(kind: str, text: str, right: str, pool: tuple[str, ...], t_s: float) -> SynthQuestion:
    """A multiple-choice question over the whole of `pool` in its fixed order: the letter names the answer, so
    the micro model need not learn to read shuffled options (too slow for a CPU budget; not memory)."""
    return SynthQuestion(kind, text, list(pool), pool.index(right), right, t_s)


def make_question(rng: np.random.Generator, timeline: Timeline, visible: list[int], kind: str, t_s: float, *,
                  colour: str | None = None, older_than_s: float = 0.0,
                  subject_s: int | None = None) -> SynthQuestion | None:
    """A question of `kind` about the frames `visible`, asked at `t_s`; None when they cannot support one.

    For training `visible` may be a subset (what a memory policy kept), so the model learns to answer
    from memory as hermes hands it over.

    Args:
        visible: sorted frame indices the answer may use; the last one is "now".
        colour: counting only: the colour to count (default: a random colour seen).
        older_than_s: episodic_before / _after only: the object answered ended at least this long before `t_s`.
        subject_s: the object the question is about starts at this second (None: a random one): the X of
            episodic_before / _after (a name not unique among those seen gives None), the earlier of
            ordering_pair's two, the newest C object of episodic_recent.

    Raises:
        ValueError: an unknown kind.
    """
    if kind not in TASK_OF:
        raise ValueError(f"unknown question kind {kind!r}; expected one of {', '.join(TASK_OF)}")
    shown = {timeline.on_screen(i) for i in visible} - {None}
    seen = sorted(shown, key=lambda a: a.start_s)
    if kind.startswith("realtime"):
        now = timeline.on_screen(visible[-1]) if visible else None
        if now is None:
            return None
        if kind == "realtime_shape":
            return _choice_question(kind, "What shape is the object on screen now?", now.shape, SHAPES, t_s)
        return _choice_question(kind, "What colour is the object on screen now?", now.colour, COLOURS, t_s)
    if kind == "episodic_first":
        if not seen:
            return None
        return _choice_question(kind, "What colour was the first object?", seen[0].colour, COLOURS, t_s)
    if kind in ("episodic_before", "episodic_after"):
        step = -1 if kind == "episodic_before" else 1  # the neighbour asked about
        names = [a.name for a in seen]
        unique = [i for i in range(len(seen)) if 0 <= i + step < len(seen) and names.count(names[i]) == 1
                  and seen[max(i, i + step)].end_s <= t_s - older_than_s]
        if subject_s is not None:
            unique = [i for i in unique if seen[i].start_s == subject_s]
        if not unique:
            return None
        i = int(rng.choice(unique))
        return _choice_question(kind, f"What colour was the object just {kind.split('_')[1]} the {seen[i].name}?",
                                seen[i + step].colour, COLOURS, t_s)
    if kind == "ordering_pair":
        return _pair_question(rng, seen, t_s, subject_s)
    if kind == "episodic_recent":
        return _recent_question(rng, timeline, visible, t_s, colour, subject_s)
    if kind == "ordering":
        if len(seen) < 2:
            return None
        n = int(rng.integers(2, min(3, len(seen)) + 1))  # the second or third object
        return _choice_question(kind, f"What colour was the {ORDINALS[n - 1]} object?", seen[n - 1].colour, COLOURS,
                                t_s)
    counts = {c: sum(a.colour == c for a in seen) for c in COLOURS}
    if colour is None:
        present = [c for c in COLOURS if counts[c] > 0]
        if not present:
            return None
        colour = str(rng.choice(present))
    activity = f"show a {colour} object"
    return SynthQuestion(kind, f"How many times did they {activity}?", [], None, str(counts[colour]), t_s, activity)


def pair_question(rng: np.random.Generator, first: Appearance, second: Appearance, t_s: float) -> SynthQuestion:
    """"Which came first: the A or the B?" about `first` and the later `second`, named in an order drawn at
    random (so the answer is option A or B evenly); the options are the two names in that order."""
    pair = [first.name, second.name]
    if rng.random() < 0.5:
        pair.reverse()
    return SynthQuestion("ordering_pair", f"Which came first: the {pair[0]} or the {pair[1]}?", pair,
                         pair.index(first.name), first.name, t_s)


def _pair_question(rng: np.random.Generator, seen: list[Appearance], t_s: float,
                   subject_s: int | None) -> SynthQuestion | None:
    """`pair_question` over two objects whose names are seen once (the earlier one starting at `subject_s`)."""
    names = [a.name for a in seen]
    unique = [i for i in range(len(seen)) if names.count(names[i]) == 1]
    earlier = [i for i in unique if i < unique[-1]] if unique else []
    if subject_s is not None:
        earlier = [i for i in earlier if seen[i].start_s == subject_s]
    if not earlier:
        return None
    i = int(rng.choice(earlier))
    return pair_question(rng, seen[i], seen[int(rng.choice([k for k in unique if k > i]))], t_s)


def window_text(window_s: int) -> str:
    """How a question names the last `window_s` seconds: "30 seconds", "minute", "5 minutes"."""
    if window_s < 60:
        return f"{window_s} seconds"
    return "minute" if window_s == 60 else f"{window_s // 60} minutes"


def _recent_question(rng: np.random.Generator, timeline: Timeline, visible: list[int], t_s: float,
                     colour: str | None, subject_s: int | None) -> SynthQuestion | None:
    """"Did a C object appear in the last N minutes?" (yes / no) about C = the stream's rare colour (or
    `colour`): the common colours are on screen every minute, so only a rare one makes a question. The
    answer is drawn first (yes or no evenly), then a window of `RECENT_WINDOWS_S` that gives it, within a
    factor of two of how long ago C was last seen where one is (the edge, not a window far off); None
    when no window gives an answer. `subject_s`: the newest C object seen must start then.
    """
    colour = colour or timeline.rare_colour
    shows = [i for i in visible if (app := timeline.on_screen(i)) is not None and app.colour == colour]
    if colour is None or not shows or (subject_s is not None and timeline.on_screen(shows[-1]).start_s != subject_s):
        return None
    age_s = t_s - shows[-1]  # the window [t_s - w, t_s) holds C's newest frame iff w > age_s
    yes = [w for w in RECENT_WINDOWS_S if age_s < w <= t_s]
    no = [w for w in RECENT_WINDOWS_S if w < age_s - 1]  # a second apart from the edge
    if not (yes or no):
        return None
    want_yes = bool(rng.random() < 0.5) if yes and no else bool(yes)
    pool = yes if want_yes else no
    near = [w for w in pool if age_s / 2 <= w <= 2 * age_s]
    window_s = int(rng.choice(near or pool))
    return SynthQuestion("episodic_recent", f"Did a {colour} object appear in the last {window_text(window_s)}?",
                         list(YES_NO), 0 if want_yes else 1, YES_NO[0 if want_yes else 1], t_s)


def random_timeline(rng: np.random.Generator, duration_s: int, rare_count: int | None = None, **kwargs) -> Timeline:
    """`make_timeline` with a random rare colour seen `rare_count` times (default: a random 1-4)."""
    rare = str(rng.choice(COLOURS))
    count = int(rng.integers(1, 5)) if rare_count is None else rare_count
    return make_timeline(rng, duration_s, rare_colour=rare, rare_count=count, **kwargs)


def plan_questions(rng: np.random.Generator, timeline: Timeline, per_family: int) -> list[SynthQuestion]:
    """`per_family` questions of each family for one stream, sorted by time, at times that test memory.

    Real-time ones where an object has been on screen two frames; episodic and ordering ones in the
    second half, about long before; counting probes count the rare colour, each answer drawn evenly from
    the counts the stream reaches (so always answering "1" is no strategy).
    """
    d = timeline.duration_s
    questions: list[SynthQuestion] = []

    def ask(kind: str, lo: int, **kwargs) -> None:
        for _ in range(50):  # a few draws always find a time that supports the question
            t_s = int(rng.integers(lo, d)) + 0.5
            q = make_question(rng, timeline, timeline.frames_before(t_s), kind, t_s, **kwargs)
            if q is not None:
                questions.append(q)
                return

    steady = [i + 1 for i in range(d - 1) if timeline.on_screen(i) is not None
              and timeline.on_screen(i) is timeline.on_screen(i + 1)]  # on screen for two frames
    for j in range(per_family):
        i = int(rng.choice(steady))
        questions.append(make_question(rng, timeline, timeline.frames_before(i + 0.5), "realtime_colour", i + 0.5))
        ask(("episodic_first", "episodic_before")[j % 2], d // 2, older_than_s=0.15 * d)
        ask("ordering", d // 2)
    rare = timeline.rare_colour
    starts = [a.start_s for a in timeline.appearances if a.colour == rare]
    for _ in range(per_family if starts else 0):
        # the answer first, evenly over what the stream allows; then a time with exactly that many seen
        k = int(rng.integers(1, len(starts) + 1))
        last_s = (starts[k] if k < len(starts) else d) - 1  # the newest frame before the next one begins
        t_s = int(rng.integers(starts[k - 1], last_s + 1)) + 0.5
        questions.append(make_question(rng, timeline, timeline.frames_before(t_s), "counting", t_s, colour=rare))
    return sorted(questions, key=lambda q: q.t_s)


def ovo_entries(video: str, questions: list[SynthQuestion]) -> list[dict]:
    """OVO-Bench annotation entries for one video: counting questions on one activity share a REC entry;
    ids carry the family (`<video>-<family>-<n>`), so results give per-family accuracy."""
    stem = Path(video).stem
    entries: list[dict] = []
    rec: dict[str, dict] = {}
    for n, q in enumerate(questions):
        if q.kind == "counting":
            if q.activity not in rec:
                rec[q.activity] = {"id": f"{stem}-counting-{n:02d}", "task": "REC", "video": video,
                                   "activity": q.activity, "test_info": [], "family": "counting"}
                entries.append(rec[q.activity])
            rec[q.activity]["test_info"].append({"realtime": q.t_s, "count": int(q.answer)})
            continue
        entries.append({"id": f"{stem}-{q.family}-{n:02d}", "task": q.task, "video": video, "question": q.question,
                        "options": q.options, "gt": q.gt, "answer": q.answer, "realtime": q.t_s,
                        "family": q.family, "kind": q.kind})
        if q.depth:
            entries[-1].update(depth=q.depth, subject_s=q.subject_s)
    return entries


def write_benchmark(root: str | Path, *, seed: int = 0, num_videos: int = 8, duration_s: int = 180,
                    per_family: int = 2, size_px: int = FRAME_SIZE_PX) -> Path:
    """Write a synthetic OVO-Bench into `root`: `src_videos/synth_NNN.mp4`, `ovo_bench_new.json` and
    `synthetic_bench.json` (the arguments and every timeline, so answers can be checked); returns `root`.

    Args:
        seed: video `v` draws from `numpy.random.default_rng([seed, v])`.
        size_px: frame side in pixels (mp4v wants it even; 64 is a whole number of macroblocks).
    """
    def stream(v: int) -> tuple[str, Timeline, list[SynthQuestion]]:
        rng = np.random.default_rng([seed, v])
        timeline = random_timeline(rng, duration_s, rare_count=4)  # counts 1-4 all possible (streams long enough)
        return f"synth_{v:03d}.mp4", timeline, plan_questions(rng, timeline, per_family)

    return _write_set(root, map(stream, range(num_videos)), size_px,
                      {"seed": seed, "num_videos": num_videos, "duration_s": duration_s, "per_family": per_family})


def _write_set(root: str | Path, streams, size_px: int, info: dict) -> Path:
    root = Path(root)
    (root / "src_videos").mkdir(parents=True, exist_ok=True)
    entries, meta = [], {}
    for video, timeline, questions in streams:
        write_mp4(root / "src_videos" / video, render_frames(timeline, size_px=size_px), 1.0, (size_px, size_px))
        entries += ovo_entries(video, questions)
        meta[video] = [asdict(a) for a in timeline.appearances]
    (root / ANNOTATION_FILE).write_text(json.dumps(entries, indent=1) + "\n")
    info = {"generator": __name__, **info, "size_px": size_px, "fps": 1.0, "timelines": meta}
    (root / META_FILE).write_text(json.dumps(info) + "\n")
    return root


# set name -> stream length (s); a new set goes last: a set's streams draw from its index here
SUITE_S = {"short": 20, "long": 180, "long600": 600, "long1800": 1800, "long900": 900}
SUITE_SEED = 2000  # the shipped suite's seed (training draws from seed 0-2 and `[seed, 1]`, never from it)
DEPTHS_PCT = (10, 20, 30, 40, 50, 60, 70, 80, 90)  # "just before X" with X at this % of the question time
ASK_LATE = 0.9  # suite episodic questions are asked in the last tenth of the stream


def name_subjects(rng: np.random.Generator, timeline: Timeline,
                  asks: list[tuple[float, float]]) -> tuple[Timeline, list[int]]:
    """(timeline, start_s of each X): for each (target_s, t_s), the object X that a "just before X" question
    asked at `t_s` names, starting near `target_s`.

    X (not the first object, gone by `t_s`) starts nearest `target_s`. Its name must be seen once, so
    every other object of that name gets another shape (the colour, so counts and answers, stays); at most
    two subjects share a colour, so a free shape is always left (hence at most 12 subjects).

    Raises:
        ValueError: no object is gone by some `t_s`.
    """
    apps = list(timeline.appearances)
    subjects: list[int] = []  # indices into apps
    for target_s, t_s in asks:
        gone = [i for i in range(1, len(apps)) if apps[i].end_s <= t_s]
        for i in sorted(gone, key=lambda i: (abs(apps[i].start_s - target_s), i)):
            names = {apps[j].name for j in subjects}
            if i in subjects or (apps[i].name not in names
                                 and sum(apps[j].colour == apps[i].colour for j in set(subjects)) < 2):
                subjects.append(i)
                break
        else:
            raise ValueError(f"no object before {t_s} s to ask about ({len(apps)} objects)")
    taken = {apps[j].name for j in subjects}
    for i, app in enumerate(apps):
        if i not in subjects and app.name in taken:
            free = [s for s in SHAPES if f"{app.colour} {s}" not in taken]
            apps[i] = replace(app, shape=str(rng.choice(free)))
    return replace(timeline, appearances=apps), [apps[j].start_s for j in subjects]


def plan_suite_questions(rng: np.random.Generator, timeline: Timeline,
                         per_family: int) -> tuple[Timeline, list[SynthQuestion]]:
    """(timeline with shapes changed, questions by time) of one suite stream: a "first object" question and a
    "just before X" per depth of `DEPTHS_PCT`, asked in the last tenth; the other families as `plan_questions`.

    Raises:
        ValueError: the stream is too short to name an object at every depth.
    """
    d = timeline.duration_s
    times_s = [int(rng.integers(int(ASK_LATE * d), d)) + 0.5 for _ in range(len(DEPTHS_PCT) + 1)]
    timeline, subjects = name_subjects(rng, timeline, [(pct / 100 * t_s, t_s)
                                                      for pct, t_s in zip(DEPTHS_PCT, times_s[1:])])
    questions = [q for q in plan_questions(rng, timeline, per_family) if q.family != "episodic"]
    first = make_question(rng, timeline, timeline.frames_before(times_s[0]), "episodic_first", times_s[0])
    questions.append(replace(first, depth="first", subject_s=timeline.appearances[0].start_s))
    for pct, t_s, subject_s in zip(DEPTHS_PCT, times_s[1:], subjects):
        q = make_question(rng, timeline, timeline.frames_before(t_s), "episodic_before", t_s, subject_s=subject_s)
        questions.append(replace(q, depth=str(pct), subject_s=subject_s))
    return timeline, sorted(questions, key=lambda q: q.t_s)


def plan_memory_questions(rng: np.random.Generator, timeline: Timeline, subjects: list[int],
                          times_s: list[float]) -> list[SynthQuestion]:
    """Issue 37's memory kinds for one suite stream, each tagged with its depth (% of the question time):
    "just after X" and "which came first: X or a later subject" about the "just before X" subjects
    (`subjects`, asked at their `times_s`), and "a rare-colour object in the last N minutes" asked where the
    newest such object sits at each depth of `DEPTHS_PCT` the stream allows. A depth the stream cannot
    support (a successor not yet seen, no rare object at that depth) is skipped.
    """
    questions: list[SynthQuestion] = []
    apps = {a.start_s: a for a in timeline.appearances}
    for n, (pct, t_s, subject_s) in enumerate(zip(DEPTHS_PCT, times_s, subjects)):
        q = make_question(rng, timeline, timeline.frames_before(t_s), "episodic_after", t_s, subject_s=subject_s)
        if q is not None:
            questions.append(replace(q, depth=str(pct), subject_s=subject_s))
        later = [m for m in range(n + 1, len(subjects)) if subjects[m] > subject_s]
        if later:  # asked when both are gone: at the later subject's time
            m = int(rng.choice(later))
            q = pair_question(rng, apps[subject_s], apps[subjects[m]], max(t_s, times_s[m]))
            questions.append(replace(q, depth=str(pct), subject_s=subject_s))
    rare = [a for a in timeline.appearances if a.colour == timeline.rare_colour]
    for pct in DEPTHS_PCT:
        # asked at t_s = start / depth, where this rare object is still the newest one
        fits = [(a, a.start_s * 100 / pct) for a in rare]
        fits = [(a, int(t)) for (a, t), nxt in zip(fits, rare[1:] + [None])
                if a.end_s < t < timeline.duration_s and (nxt is None or t < nxt.start_s)]
        if fits:
            app, t = fits[int(rng.integers(len(fits)))]
            q = make_question(rng, timeline, timeline.frames_before(t + 0.5), "episodic_recent", t + 0.5,
                              subject_s=app.start_s)
            if q is not None:
                questions.append(replace(q, depth=str(pct), subject_s=app.start_s))
    return questions


def write_suite_set(root: str | Path, name: str, *, seed: int = SUITE_SEED, num_videos: int = 8,
                    per_family: int = 4, size_px: int = FRAME_SIZE_PX, memory_kinds: bool = False) -> Path:
    """Write set `name` of the suite (`SUITE_S[name]`-second streams) as `write_benchmark` does; returns `root`.

    Video `v` draws from `default_rng([seed, index of name in SUITE_S, v])`: the sets of one seed are
    apart, and a set's streams do not depend on how many are written.

    Args:
        per_family: real-time, ordering and counting questions per stream (episodic: 10).
        memory_kinds: also issue 37's memory kinds (`plan_memory_questions`), drawn from their own
            generator `[seed, set index, v, 37]`: the other questions and the video stay as without them.

    Raises:
        ValueError: an unknown set name.
    """
    if name not in SUITE_S:
        raise ValueError(f"unknown suite set {name!r}; expected one of {', '.join(SUITE_S)}")
    duration_s = SUITE_S[name]

    set_index = list(SUITE_S).index(name)

    def stream(v: int) -> tuple[str, Timeline, list[SynthQuestion]]:
        rng = np.random.default_rng([seed, set_index, v])
        timeline, questions = plan_suite_questions(rng, random_timeline(rng, duration_s, rare_count=4), per_family)
        if memory_kinds:
            before = sorted((q for q in questions if q.kind == "episodic_before"), key=lambda q: int(q.depth))
            questions = sorted(questions + plan_memory_questions(
                np.random.default_rng([seed, set_index, v, 37]), timeline,
                [q.subject_s for q in before], [q.t_s for q in before]), key=lambda q: q.t_s)
        return f"{name}_{v:03d}.mp4", timeline, questions

    info = {"suite": name, "seed": seed, "num_videos": num_videos, "duration_s": duration_s, "per_family": per_family}
    if memory_kinds:  # recorded only when on, so the shipped sets' meta files stay as they were
        info["memory_kinds"] = True
    return _write_set(root, map(stream, range(num_videos)), size_px, info)


def write_demo(folder: str | Path, *, seed: int = 0, duration_s: int = 40) -> tuple[Path, list[SynthQuestion]]:
    """(`folder/demo.mp4`, a question of each family by time) for `hermes-video demo`."""
    rng = np.random.default_rng([seed, 10**6])  # apart from any benchmark video's stream
    timeline = random_timeline(rng, duration_s)
    path = Path(folder) / "demo.mp4"
    write_mp4(path, render_frames(timeline), 1.0, (FRAME_SIZE_PX, FRAME_SIZE_PX))
    return path, plan_questions(rng, timeline, per_family=1)


def main(argv: list[str] | None = None) -> int:
    """`python -m hermes.datasets.synthetic_bench DIR [--videos N] [--duration-s S | --suite SET] [--per-family K] [--seed X]`."""
    import argparse

    p = argparse.ArgumentParser(description="Write a synthetic streaming benchmark in the OVO-Bench format.")
    p.add_argument("root", help="output folder")
    p.add_argument("--videos", type=int, default=8)
    p.add_argument("--duration-s", type=int, default=180)
    p.add_argument("--per-family", type=int, default=None,
                   help="questions of each family per stream (default 2; --suite: 4 real-time, ordering, counting)")
    p.add_argument("--seed", type=int, default=None,
                   help=f"benchmark seed (default 0; with --suite the shipped suite's, {SUITE_SEED})")
    p.add_argument("--suite", choices=SUITE_S,
                   help="write this set of the suite instead (depth-balanced episodic questions; "
                        "its length is the set's, --duration-s is ignored)")
    p.add_argument("--memory-kinds", action="store_true",
                   help="with --suite: also the memory kinds (just after X, which of two came first, a rare "
                        "colour in the last N minutes), each balanced over depth")
    args = p.parse_args(argv)
    if args.memory_kinds and not args.suite:
        p.error("--memory-kinds needs --suite")
    if args.suite:
        seed = SUITE_SEED if args.seed is None else args.seed
        root = write_suite_set(args.root, args.suite, seed=seed, num_videos=args.videos,
                               per_family=args.per_family or 4, memory_kinds=args.memory_kinds)
    else:
        root = write_benchmark(args.root, seed=args.seed or 0, num_videos=args.videos, duration_s=args.duration_s,
                               per_family=args.per_family or 2)
    print(f"wrote {root}; evaluate with: hermes-video eval ovo-bench --data-root {root} --model micro-llava-onevision")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
