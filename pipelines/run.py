"""`hermes-video run` as typed functions (docs/ARCHITECTURE.md, Interfaces).

`prepare_run` checks what the command line alone can tell (questions, files, the source's path, the
configuration) before torch is imported; `execute_run` opens the source, loads the model, checks that
the memory holds the stream and every question fits, then streams.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hermes.errors import SourceError, UsageError
from hermes.pipelines.asked import (Question, check_times, expand_every, finite_seconds, in_answer_order,
                                    questions_from_args, read_questions_file)


def check_source_spec(source: str) -> None:
    """What can be said about SOURCE without opening it: empty, a missing file, a bad scheme.

    Raises:
        UsageError: an empty SOURCE.
        SourceError: a path that does not exist, or is not a readable, complete video file (one FFmpeg
            cannot open, such as a text file named .mp4, included).
    """
    if not source.strip():
        raise UsageError("SOURCE is empty: give a video file, an image folder, a webcam index or a stream URL")
    if "://" in source or source.strip().isdigit():
        return  # URLs and webcams are checked when opened (the scheme check is in open_source)
    from hermes.pipelines.video_checks import check_file  # no decoder, no torch

    path = Path(source).expanduser()
    if path.is_dir():
        return  # an image folder
    if not path.exists() and not path.suffix:
        raise SourceError(f"source not found: {source} is not an existing file or folder; expected a video "
                          f"file, an image folder, a webcam index (0, 1, ...) or an rtsp://, rtmp:// or "
                          f"http(s):// URL")
    check_file(path, probe=True)


@dataclass
class RunPlan:
    """Everything `run` needs, checked: the configuration, the source, the questions and how to ask them."""

    cfg: Any  # the resolved HermesConfig
    source: str  # a video file, an image folder, a webcam index or a stream URL
    questions: list[Question]
    ask_every_s: float | None = None  # ask the untimed questions every S seconds of stream time
    reconnect_timeout_s: float | None = None  # live streams: give up after S seconds without a connection
    interactive: bool = False  # questions typed on stdin; a file plays back in real time
    memory_dir: str | None = None  # levels 2 and 3 and checkpoints of the stream live here
    resume: bool = False  # continue the stream saved in `memory_dir`
    memory_chosen: bool = False  # the user chose the memory: a live source keeps even an unbounded one
    read_only: bool = False  # answer from the stream another process writes into `memory_dir`; no source
    to_end: bool = False  # keep streaming after the last question until the source ends
    notes: list[str] = field(default_factory=list)  # printed on stderr before the stream starts


def prepare_run(source: str | None, asked: list[tuple[str, str | None]], resolve_config: Callable[[], Any], *,
                questions_file: str | None = None, ask_every: str | None = None,
                reconnect_timeout: str | None = None, interactive: bool = False, memory_dir: str | None = None,
                resume: bool = False, memory_chosen: bool = False, read_only: bool = False,
                to_end: bool = False) -> RunPlan:
    """Every check `run` can make before importing torch.

    Args:
        source: SOURCE as given.
        asked: `(text, at)` per `--ask`, `at` the `--at` text or None (at the end).
        resolve_config: builds the configuration (called after the question checks).
        questions_file: a JSONL questions file, or None.
        ask_every, reconnect_timeout: the flags' text in seconds, or None.
        interactive, memory_dir, resume, memory_chosen, read_only, to_end: as `RunPlan`.

    Returns:
        The checked plan.

    Raises:
        UsageError, SourceError, ConfigError, ModelError: one line, before anything heavy loads.
    """
    if read_only:
        if not memory_dir or source is not None or resume or interactive:
            raise UsageError("--read-only answers from the stream another process writes: give --memory-dir DIR "
                             "and --ask, and no SOURCE, --resume or --interactive")
    elif source is None:
        raise UsageError("the following arguments are required: source (a video file, an image folder, a "
                         "webcam index or a stream URL; none with --read-only)")
    else:
        check_source_spec(source)
    questions = questions_from_args(asked)
    if questions_file:
        questions += read_questions_file(questions_file)
    ask_every_s = None if ask_every is None else finite_seconds(ask_every, "--ask-every", positive=True)
    reconnect_s = None if reconnect_timeout is None else \
        finite_seconds(reconnect_timeout, "--reconnect-timeout", positive=True)
    if ask_every_s is not None and not any(q.at_s is None for q in questions):
        raise UsageError("--ask-every S repeats the --ask questions that have no --at: give --ask TEXT")
    if not questions and not interactive and not memory_dir:
        raise UsageError("no question to answer: give --ask TEXT [--at S], --questions FILE or --interactive "
                         "(or --memory-dir DIR to only build a memory of the video)")
    if resume and not memory_dir:
        raise UsageError("--resume continues a stream saved in a memory directory: give --memory-dir DIR")
    if memory_dir:
        check_memory_dir(memory_dir)
    if read_only and not questions:
        raise UsageError("--read-only answers questions: give --ask TEXT or --questions FILE")
    plan = RunPlan(resolve_config(), source or "", questions, ask_every_s, reconnect_s, interactive, memory_dir,
                   resume, memory_chosen, read_only=read_only, to_end=to_end)
    if read_only:
        plan.cfg.memory.recall = True  # a follower answers from the writer's records: recall is the point
    from hermes.model_registry import resolve_source  # the registry and paths only: no torch

    resolve_source(plan.cfg.model.name, plan.cfg.model.hub_id)
    ordered = in_answer_order(questions)
    if ordered != questions and ask_every_s is None:
        plan.notes.append("answers come in time order (questions at the end last), not in the order given; "
                          "with --json each carries its \"id\" from the questions file")
    return plan


# ---- the stream ---------------------------------------------------------------------------------------


def check_capacity(model, cfg, duration_s: float | None, live: bool) -> str | None:
    """Refuse, before encoding, a memory that cannot hold the stream (`full`: every visual token of a
    recording; a bounded policy: its budget) beside `memory.position_reserve`.

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


def check_prompts(model, cfg, questions: list[Question]) -> None:
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
        with self.bar.external_write_mode() if self.bar is not None else contextlib.nullcontext():
            emit()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.total = self.bar.n  # the stream's real length: it ends at n/n, not short of an estimate
            self.bar.refresh()
            self.bar.close()


def streams_to_end(plan: RunPlan) -> bool:
    """Whether the stream goes on after its last question (`--to-end`, or `--memory-dir`)."""
    return plan.to_end or bool(plan.memory_dir)


def check_memory_dir(memory_dir: str) -> None:
    """What can be said about ``--memory-dir`` before anything loads: a file, a bad s3:// URL, no boto3.

    Raises:
        UsageError: one line.
    """
    from hermes.tiers.s3 import S3Location, parse_location

    location = parse_location(memory_dir)
    if isinstance(location, S3Location):
        try:
            import boto3  # noqa: F401
        except ImportError:
            raise UsageError("an s3:// --memory-dir needs boto3: pip install 'hermes-video[s3]'") from None
    elif location.exists() and not location.is_dir():
        raise UsageError(f"--memory-dir expects a directory, found a file: {memory_dir}")


def answer_read_only(plan: RunPlan, on_answer: Callable[[Any, Question | None], None]) -> None:
    """``--read-only``: each question answered at once from the writer's last checkpoint and recall
    over its records; nothing is written."""
    from hermes.models.loading import load_model
    from hermes.pipelines.session import StreamingSession

    cfg = plan.cfg
    model = load_model(cfg.model)
    check_prompts(model, cfg, plan.questions)
    session = StreamingSession(model, cfg.memory, (), chunk_frames=cfg.stream.chunk_frames,
                               max_new_tokens=cfg.model.max_new_tokens, memory_dir=plan.memory_dir,
                               resume=True, read_only=True)
    try:
        for question in plan.questions:
            for answer in session.run([question]):
                on_answer(answer, question)
    finally:
        session.close()


def source_options(cfg, source: str, reconnect_timeout_s: float | None = None) -> dict:
    """The keyword arguments of `open_source` that `cfg` asks for: a file's video backend
    (`stream.backend`, unless auto) and a live source's `reconnect_timeout_s` (None: its default)."""
    options = {}
    if reconnect_timeout_s is not None:
        options["reconnect_timeout_s"] = reconnect_timeout_s
    if cfg.stream.backend != "auto" and Path(source).is_file():
        options["backend"] = cfg.stream.backend
    return options


def execute_run(plan: RunPlan, *, progress: bool,
                on_answer: Callable[[Any, Question | None], None]) -> str | None:
    """Open the source, load the model, check capacity and prompts, then stream and answer.

    Args:
        plan: what `prepare_run` checked (or a plan a caller such as the demo built).
        progress: a progress bar on stderr (a recording without a live schedule).
        on_answer: receives each `Answer` with the `Question` it answers (whose `id` the user gave).

    Returns:
        Why a live run ended, or None for a recording.

    Raises:
        HermesError: source (3), model (4) or usage errors found once the source is open.
    """
    from hermes.models.loading import load_model
    from hermes.pipelines.interactive import check_live_memory
    from hermes.pipelines.session import StreamingSession
    from hermes.pipelines.sources import open_source

    if plan.read_only:
        return answer_read_only(plan, on_answer)
    cfg = plan.cfg
    with open_source(plan.source, fps=cfg.stream.fps,
                     **source_options(cfg, plan.source, plan.reconnect_timeout_s)) as source:
        info = getattr(source, "info", None)
        duration_s = info.duration_s if info is not None else None
        check_times(plan.questions, duration_s)
        questions = list(plan.questions)
        if plan.ask_every_s is not None and not source.live and duration_s is not None and not plan.interactive:
            questions = expand_every(questions, plan.ask_every_s, duration_s)  # as fast as the model
        for note in plan.notes:
            print(f"note: {note}", file=sys.stderr, flush=True)
        cfg.memory = check_live_memory(cfg.memory, source.live, plan.memory_chosen)  # before the model loads
        model = load_model(cfg.model)
        note = check_capacity(model, cfg, duration_s, source.live)
        if note:
            print(f"note: {note}", file=sys.stderr, flush=True)
        check_prompts(model, cfg, questions)
        live_mode = bool(plan.interactive or (plan.ask_every_s is not None and questions == plan.questions))
        if source.live or live_mode:
            return run_live_source(plan, model, source, questions, on_answer)
        ordered = in_answer_order(questions)
        expected = math.floor(duration_s * cfg.stream.fps + 1e-9) + 1 if duration_s else None
        bar = ProgressBar(progress, expected)
        session = StreamingSession(model, cfg.memory, bar.wrap(source), chunk_frames=cfg.stream.chunk_frames,
                                   max_new_tokens=cfg.model.max_new_tokens, memory_dir=plan.memory_dir,
                                   resume=plan.resume)
        # a stop (Ctrl-C, or a moment past the end) skips the timed questions still ahead but not the
        # end-of-video ones, so answers are paired with questions of their own kind
        timed_left = iter([q for q in ordered if q.at_s is not None])
        end_left = iter([q for q in ordered if q.at_s is None])
        try:
            for answer in session.run(ordered, to_end=streams_to_end(plan)):
                question = next(end_left if answer.at_s is None else timed_left)
                if answer.frames_seen == 0 and answer.at_s is None:
                    raise SourceError(f"no frames could be read from {source.describe()} (re-download or "
                                      f"re-encode it)")
                bar.write(lambda: on_answer(answer, question))
        finally:
            session.close()  # flushes the memory directory, on Ctrl-C too
            bar.close()
        return None


def stdin_lines() -> Iterable[bytes | str]:
    """Lines typed on standard input, read with `os.read` on its descriptor, not `sys.stdin.buffer`:
    a daemon reader blocked in `BufferedReader.readline` holds its lock when the run ends, and the
    interpreter's shutdown flush then aborts ("_enter_buffered_busy", exit 134).

    Returns:
        Lines as bytes (each ending in a newline but maybe the last), or stdin itself where it has
        no descriptor (a test's StringIO).
    """
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an object with no descriptor
        return sys.stdin

    def read() -> Iterator[bytes]:
        pending = b""
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:  # a terminal gone (EIO after a hang-up): the end of the input
                chunk = b""
            if not chunk:
                if pending:
                    yield pending
                return
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                yield line + b"\n"

    return read()


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


def run_live_source(plan: RunPlan, model, source, questions: list[Question],
                    on_answer: Callable[[Any, Question | None], None]) -> str:
    """A camera or stream, or a recording played back in real time (`--interactive` only)."""
    from hermes.pipelines.interactive import QuestionInbox, QuestionSchedule, run_live
    from hermes.pipelines.session import StreamingSession

    cfg = plan.cfg
    timed = [q for q in questions if q.at_s is not None]
    untimed = [q for q in questions if q.at_s is None]
    if untimed and plan.ask_every_s is None:
        raise UsageError("on a live source, --ask needs --at S (stream time) or --ask-every S")
    session = StreamingSession(model, cfg.memory, (), chunk_frames=cfg.stream.live_chunk_frames,
                               max_new_tokens=cfg.model.max_new_tokens, memory_dir=plan.memory_dir,
                               resume=plan.resume)
    started = time.monotonic()
    pace = not source.live and plan.interactive  # only --interactive plays a recording in real time
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
    lines = Utf8Lines(stdin_lines()) if plan.interactive else None
    inbox = QuestionInbox(lines, clock) if lines is not None else None
    if inbox is not None:
        print(f"streaming {source.describe()}: type a question and press Enter (Ctrl-D or Ctrl-C to stop)",
              file=sys.stderr, flush=True)
    schedule = QuestionSchedule(timed, plan.ask_every_s, untimed)
    try:
        reason = run_live(session, frames, clock=clock, pace=pace, schedule=schedule, inbox=inbox,
                          on_answer=on_answer, chunk_frames=cfg.stream.live_chunk_frames,
                          to_end=streams_to_end(plan))
    finally:
        session.close()  # flushes the memory directory
    stats = source.stats
    print(f"stopped ({reason}): {len(session.encoded_t_s)} frames encoded, {stats.frames_dropped} dropped, "
          f"{stats.gaps} gaps, max lag {stats.max_lag_s:.2f} s", file=sys.stderr, flush=True)
    if lines is not None and lines.error:
        raise UsageError(lines.error)
    return reason
