"""`hermes-video run`: questions, the checks made before anything heavy loads, and the stream itself.

The order is the point of this module. `prepare_run` checks everything that can be checked from the
command line alone — flags, the question list, the questions file, the source's path, the
configuration — and raises a one-line `HermesError` before torch or transformers is imported.
`execute_run` then opens the source, loads the model, checks that the chosen memory can hold the
stream (and that every question fits the model's window) before encoding a frame, and streams.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hermes.errors import SourceError, UsageError

# The keys a questions-file line may carry; anything else is a typo (did-you-mean) rather than ignored.
QUESTION_KEYS = ("question", "at_s", "options", "id")


@dataclass(frozen=True)
class AskedQuestion:
    """A question as the user gave it: text, time (None: at the end), options, the user's id."""

    text: str
    at_s: float | None = None
    options: tuple[str, ...] = ()
    id: Any = None


class AskAction(argparse.Action):
    """`--ask TEXT`: a new question; `--at S` (`AtAction`) then times the question just before it."""

    def __call__(self, parser, namespace, values, option_string=None):
        asked = list(getattr(namespace, "asked", None) or [])
        asked.append([values, None])
        namespace.asked = asked


class AtAction(argparse.Action):
    """`--at S` times the `--ask` right before it; without `--at` a question is asked at the end."""

    def __call__(self, parser, namespace, values, option_string=None):
        asked = getattr(namespace, "asked", None) or []
        if not asked:
            raise UsageError(f"--at {values} comes before any --ask: write --ask TEXT --at S")
        if asked[-1][1] is not None:
            raise UsageError(f"--at {values}: the question {asked[-1][0]!r} already has --at {asked[-1][1]}; "
                             f"give one --at per --ask")
        asked[-1][1] = values


def finite_seconds(text: str, flag: str, *, positive: bool) -> float:
    """A flag's value in seconds, refused unless it is a finite number (and > 0 when `positive`)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise UsageError(f"{flag} expects a number of seconds, found {text!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        want = "a positive" if positive else "a non-negative"
        raise UsageError(f"{flag} expects {want} number of seconds, found {text!r}")
    return value


def questions_from_args(asked: list[list]) -> list[AskedQuestion]:
    """The `--ask`/`--at` pairs as questions, `--at` checked as seconds from the start."""
    return [AskedQuestion(text, None if at is None else finite_seconds(at, "--at", positive=False))
            for text, at in asked]


def read_questions_file(path: str) -> list[AskedQuestion]:
    """Questions from a JSONL file: one `{"question", "at_s"?, "options"?, "id"?}` object per line.

    Raises:
        UsageError: a missing, unreadable or non-UTF-8 file, or a line that is not such an object
            (naming the line; an unknown key gets a did-you-mean).
    """
    from hermes.config import _suggest

    file = Path(path)
    if file.is_dir():
        raise UsageError(f"--questions expects a JSONL file, found a directory: {path}")
    if not file.is_file():
        raise UsageError(f"questions file not found: {path}")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = file.read_bytes()[: exc.start].count(b"\n") + 1
        raise UsageError(f"{path}:{line}: not UTF-8 text; save the file as UTF-8") from None
    except OSError as exc:
        raise UsageError(f"cannot read questions file {path}: {exc.strerror}") from None
    questions = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: not valid JSON ({exc.msg}); expected "
                             f'{{"question": "...", "at_s": 12.0, "options": [...]}}') from None
        if not isinstance(item, dict) or not isinstance(item.get("question"), str):
            raise UsageError(f'{where}: expected an object with a "question" string')
        for key in item:
            if key not in QUESTION_KEYS:
                raise UsageError(f"{where}: unknown key {key!r}{_suggest(key, list(QUESTION_KEYS))}; "
                                 f"a line takes {', '.join(QUESTION_KEYS)}")
        if not item["question"].strip():
            raise UsageError(f'{where}: "question" is empty')
        at_s = item.get("at_s")
        if at_s is not None and (isinstance(at_s, bool) or not isinstance(at_s, (int, float))
                                 or not math.isfinite(at_s) or at_s < 0):
            raise UsageError(f'{where}: "at_s" must be a number of seconds >= 0, found {at_s!r}')
        options = item.get("options") or []
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise UsageError(f'{where}: "options" must be a list of strings')
        if len(options) > 10:
            raise UsageError(f'{where}: at most 10 "options" (lettered A-J), found {len(options)}')
        questions.append(AskedQuestion(item["question"], None if at_s is None else float(at_s), tuple(options),
                                       item.get("id")))
    if not questions:
        raise UsageError(f"questions file {path} holds no questions")
    return questions


def in_answer_order(questions: list[AskedQuestion]) -> list[AskedQuestion]:
    """The order a stream answers in: timed questions by time (stable), then those asked at the end."""
    timed = sorted((q for q in questions if q.at_s is not None), key=lambda q: q.at_s)
    return timed + [q for q in questions if q.at_s is None]


def check_times(questions: list[AskedQuestion], duration_s: float | None) -> None:
    """Reject question times after the end of the video."""
    for q in questions:
        if q.at_s is not None and duration_s is not None and q.at_s > duration_s + 1e-6:
            raise UsageError(f"question time {q.at_s:g}s is past the end of the video ({duration_s:.2f}s)")


def check_source_spec(source: str) -> None:
    """What can be said about SOURCE without opening it: empty, a missing file, a bad scheme.

    Raises:
        UsageError: an empty SOURCE.
        SourceError: a path that does not exist, or is not a readable, complete video file.
    """
    if not source.strip():
        raise UsageError("SOURCE is empty: give a video file, an image folder, a webcam index or a stream URL")
    if "://" in source or source.strip().isdigit():
        return  # URLs and webcams are checked when opened (the scheme check is in open_source)
    from hermes.pipelines.video_checks import check_file  # header reads only, no decoder

    path = Path(source).expanduser()
    if path.is_dir():
        return  # an image folder
    if not path.exists() and not path.suffix:
        raise SourceError(f"source not found: {source} is not an existing file or folder; expected a video "
                          f"file, an image folder, a webcam index (0, 1, ...) or an rtsp://, rtmp:// or "
                          f"http(s):// URL")
    check_file(path)


@dataclass
class RunPlan:
    """Everything `run` needs, checked: the configuration, the questions and how to ask them."""

    cfg: Any
    questions: list[AskedQuestion]
    ask_every_s: float | None = None
    reconnect_timeout_s: float | None = None
    notes: list[str] = field(default_factory=list)


def prepare_run(args, resolve_config: Callable) -> RunPlan:
    """Every check `run` can make before importing torch; returns the plan or raises one line."""
    check_source_spec(args.source)
    questions = questions_from_args(getattr(args, "asked", None) or [])
    if args.questions:
        questions += read_questions_file(args.questions)
    ask_every = None if args.ask_every is None else finite_seconds(args.ask_every, "--ask-every", positive=True)
    reconnect = None if args.reconnect_timeout is None else \
        finite_seconds(args.reconnect_timeout, "--reconnect-timeout", positive=True)
    if ask_every is not None and not any(q.at_s is None for q in questions):
        raise UsageError("--ask-every S repeats the --ask questions that have no --at: give --ask TEXT")
    if not questions and not args.interactive and not args.memory_dir:
        raise UsageError("no question to answer: give --ask TEXT [--at S], --questions FILE or --interactive "
                         "(or --memory-dir DIR to only build a memory of the video)")
    if args.resume and not args.memory_dir:
        raise UsageError("--resume continues a stream saved in a memory directory: give --memory-dir DIR")
    if args.memory_dir and Path(args.memory_dir).exists() and not Path(args.memory_dir).is_dir():
        raise UsageError(f"--memory-dir expects a directory, found a file: {args.memory_dir}")
    plan = RunPlan(resolve_config(args), questions, ask_every, reconnect)
    from hermes.models.hub import check_model_name  # presets and paths only: no torch

    check_model_name(plan.cfg.model.name, plan.cfg.model.hub_id)
    ordered = in_answer_order(questions)
    if ordered != questions and ask_every is None:
        plan.notes.append("answers come in time order (questions at the end last), not in the order given; "
                          "with --json each carries its \"id\" from the questions file")
    return plan


# ---- the stream ---------------------------------------------------------------------------------------


def check_capacity(model, cfg, duration_s: float | None, live: bool) -> str | None:
    """Refuse, before encoding, a memory that cannot hold the stream; a note where it may not.

    `full` keeps every visual token, so a recording needs `frames x tokens per frame` positions
    beside the prompt and `memory.position_reserve`; a bounded policy needs its budget to fit.

    Returns:
        A note to print (a live stream under `full`: how long it can run), or None.

    Raises:
        UsageError: the chosen memory cannot hold the stream (with the preset that can).
    """
    limit = model.max_position_embeddings
    per_frame = model.tokens_per_frame
    room = limit - cfg.memory.position_reserve - 64  # 64: the system prompt and chat template
    if cfg.memory.policy != "full":
        if cfg.memory.budget > room:
            raise UsageError(f"memory.budget {cfg.memory.budget} does not fit the {limit} positions of "
                             f"{cfg.model.name} (with memory.position_reserve {cfg.memory.position_reserve}): "
                             f"use a budget up to {max(room, 1)}")
        return None
    if per_frame <= 0:
        return None
    fits = max(room // per_frame, 0)
    if live or duration_s is None:
        return (f"memory 'full' keeps every frame: this stream will stop after about {fits} frames "
                f"({fits / cfg.stream.fps:.0f} s at {cfg.stream.fps:g} fps), when the model's {limit} positions "
                f"run out; --memory hermes-4k stays bounded")
    frames = math.ceil(duration_s * cfg.stream.fps)
    if frames > fits:
        raise UsageError(f"memory 'full' cannot hold this video: {duration_s:.0f} s at {cfg.stream.fps:g} fps is "
                         f"{frames} frames x {per_frame} tokens, past the {limit} positions of {cfg.model.name} "
                         f"(room for {fits} frames); use a bounded memory such as --memory hermes-4k (the default)")
    return None


def check_prompts(model, cfg, questions: list[AskedQuestion]) -> None:
    """Refuse at once a question (with its options and answer) longer than the room kept for it."""
    from hermes.pipelines.session import format_prompt

    room = cfg.memory.position_reserve
    for q in questions:
        tokens = model.question_embeds(format_prompt(q.text, q.options)).shape[0] + cfg.model.max_new_tokens
        if tokens > room:
            raise UsageError(f"question {q.text[:40]!r} is {tokens} tokens with its answer, more than the "
                             f"{room} positions kept for a question (memory.position_reserve): shorten it or "
                             f"raise memory.position_reserve")


class ProgressBar:
    """Frames encoded, on stderr in a terminal; answer lines are printed around it, not over it."""

    def __init__(self, enabled: bool, total: int | None) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="frame", desc="encoding", leave=False, file=sys.stderr)

    def wrap(self, frames):
        for frame in frames:
            yield frame
            if self.bar is not None:
                self.bar.update(1)

    def write(self, emit: Callable[[], None]) -> None:
        if self.bar is None:
            emit()
            return
        with self.bar.external_write_mode():
            emit()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.total = self.bar.n  # the stream's real length: it ends at n/n, not short of an estimate
            self.bar.refresh()
            self.bar.close()


def execute_run(args, plan: RunPlan, *, progress: bool, on_answer) -> str | None:
    """Open SOURCE, load the model, check capacity and prompts, then stream and answer.

    `on_answer(answer, question)` receives each answer with the question it answers (whose `id`
    the user gave). Returns why a live run ended, or None for a recording.
    """
    from hermes.models.loading import load_model
    from hermes.pipelines.interactive import check_live_memory
    from hermes.pipelines.session import Question, StreamingSession
    from hermes.pipelines.sources import open_source

    cfg = plan.cfg
    options = {}
    if plan.reconnect_timeout_s is not None:
        options["reconnect_timeout_s"] = plan.reconnect_timeout_s
    if cfg.stream.backend != "auto" and Path(args.source).is_file():
        options["backend"] = cfg.stream.backend
    with open_source(args.source, fps=cfg.stream.fps, **options) as source:
        info = getattr(source, "info", None)
        duration_s = info.duration_s if info is not None else None
        check_times(plan.questions, duration_s)
        questions = list(plan.questions)
        if plan.ask_every_s is not None and not source.live and duration_s is not None and not args.interactive:
            questions = expand_every(questions, plan.ask_every_s, duration_s)  # as fast as the model
        for note in plan.notes:
            print(f"note: {note}", file=sys.stderr, flush=True)
        chosen = bool(args.memory or args.config or any(s.startswith("memory.policy") for s in args.set or []))
        cfg.memory = check_live_memory(cfg.memory, source.live, chosen)  # before the model loads
        model = load_model(cfg.model)
        note = check_capacity(model, cfg, duration_s, source.live)
        if note:
            print(f"note: {note}", file=sys.stderr, flush=True)
        check_prompts(model, cfg, questions)
        live_mode = bool(args.interactive or (plan.ask_every_s is not None and questions == plan.questions))
        if source.live or live_mode:
            return run_live_source(args, plan, model, source, questions, on_answer)
        ordered = in_answer_order(questions)
        expected = math.floor(duration_s * cfg.stream.fps + 1e-9) + 1 if duration_s else None
        bar = ProgressBar(progress, expected)
        session = StreamingSession(model, cfg.memory, bar.wrap(source), chunk_frames=cfg.stream.chunk_frames,
                                   max_new_tokens=cfg.model.max_new_tokens, memory_dir=args.memory_dir,
                                   resume=args.resume)
        # a stop (Ctrl-C, or a moment past the end) skips the timed questions still ahead but not the
        # end-of-video ones, so answers are paired with questions of their own kind
        timed_left = iter([q for q in ordered if q.at_s is not None])
        end_left = iter([q for q in ordered if q.at_s is None])
        try:
            for answer in session.run([Question(q.text, q.at_s, q.options) for q in ordered],
                                      to_end=bool(args.memory_dir)):
                question = next(end_left if answer.at_s is None else timed_left)
                if answer.frames_seen == 0 and answer.at_s is None:
                    raise SourceError(f"no frames could be read from {source.describe()} (re-download or "
                                      f"re-encode it)")
                bar.write(lambda: on_answer(answer, question))
        finally:
            session.close()  # flushes the memory directory, on Ctrl-C too
            bar.close()
        return None


def expand_every(questions: list[AskedQuestion], every_s: float, duration_s: float) -> list[AskedQuestion]:
    """`--ask-every S` on a recording: each untimed question at S, 2S, ... up to the end, as timed questions."""
    repeated = [q for q in questions if q.at_s is None]
    times = [k * every_s for k in range(1, int(duration_s / every_s + 1e-9) + 1)]
    timed = [dataclasses.replace(q, at_s=t) for t in times for q in repeated]
    return [q for q in questions if q.at_s is not None] + timed


class Utf8Lines:
    """Lines of a binary stream as text; a line that is not UTF-8 ends the input and is reported."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.error: str | None = None

    def __iter__(self):
        for number, raw in enumerate(self._stream, start=1):
            if isinstance(raw, str):  # a text stream (a test's StringIO): already decoded
                yield raw
                continue
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError:
                self.error = f"standard input line {number} is not UTF-8 text; type questions as UTF-8"
                return


def run_live_source(args, plan: RunPlan, model, source, questions, on_answer) -> str:
    """A camera or stream, or a recording played back in real time (`--interactive` only)."""
    from hermes.pipelines.interactive import QuestionInbox, QuestionSchedule, run_live
    from hermes.pipelines.session import Question, StreamingSession

    cfg = plan.cfg
    timed = [Question(q.text, q.at_s, q.options) for q in questions if q.at_s is not None]
    untimed = [q.text for q in questions if q.at_s is None]
    if untimed and plan.ask_every_s is None:
        raise UsageError("on a live source, --ask needs --at S (stream time) or --ask-every S")
    by_text = {(q.text, q.options): q for q in questions}
    session = StreamingSession(model, cfg.memory, (), chunk_frames=cfg.stream.live_chunk_frames,
                               max_new_tokens=cfg.model.max_new_tokens, memory_dir=args.memory_dir,
                               resume=args.resume)
    started = time.monotonic()
    pace = not source.live and bool(args.interactive)  # only --interactive plays a recording in real time
    frames = source
    if source.live:
        clock = source.now_s
    elif pace:
        def clock() -> float:
            return time.monotonic() - started
    else:  # a schedule on a recording of unknown length: the clock is the media time reached, as fast as we can
        seen = [0.0]
        frames = (seen.__setitem__(0, f.t_s) or f for f in source)

        def clock() -> float:
            return seen[0]
    if session.encoded_t_s and source.live:  # a resumed live stream: its clock continues after the saved one
        offset_s = session.encoded_t_s[-1] + 1e-3
        live_clock = clock

        def clock() -> float:
            return live_clock() + offset_s

        frames = (dataclasses.replace(f, t_s=f.t_s + offset_s) for f in source)
    elif session.encoded_t_s and pace:  # a resumed recording: playback goes on from the last frame encoded
        resumed_s = session.encoded_t_s[-1]

        def clock() -> float:
            return time.monotonic() - started + resumed_s
    lines = Utf8Lines(getattr(sys.stdin, "buffer", sys.stdin)) if args.interactive else None
    inbox = QuestionInbox(lines, clock) if lines is not None else None
    if inbox is not None:
        print(f"streaming {source.describe()}: type a question and press Enter (Ctrl-D or Ctrl-C to stop)",
              file=sys.stderr, flush=True)
    schedule = QuestionSchedule(timed, plan.ask_every_s, untimed)
    try:
        reason = run_live(session, frames, clock=clock, pace=pace, schedule=schedule, inbox=inbox,
                          on_answer=lambda a: on_answer(a, by_text.get((a.question, a.options))),
                          chunk_frames=cfg.stream.live_chunk_frames)
    finally:
        session.close()  # flushes the memory directory
    stats = source.stats
    print(f"stopped ({reason}): {len(session.encoded_t_s)} frames encoded, {stats.frames_dropped} dropped, "
          f"{stats.gaps} gaps, max lag {stats.max_lag_s:.2f} s", file=sys.stderr, flush=True)
    if lines is not None and lines.error:
        raise UsageError(lines.error)
    return reason
