"""A streaming session: frames in, chunk by chunk, into the model's memory; questions answered at any moment.

    session = StreamingSession(model, "full", frames)        # frames: any iterable of Frame, in time order
    answer = session.ask("What is moving?", at=12.0)           # encodes frames with t_s < 12.0, then answers
    for answer in session.run(questions): ...                  # a whole schedule of questions

Rules the session keeps (docs/ARCHITECTURE.md, Data flow):
- a question at time t is answered from exactly the frames with `t_s < t` (a partly filled chunk is
  encoded before answering, and the first frame at or after t waits for the next chunk);
- answering leaves memory as it was: question and answer tokens are rewound out of the cache;
- frames are encoded in chunks of `chunk_frames`, each chunk one forward of the vision tower and
  one prefill of the language model (`hermes.probe.prefill_chunk`, which also carries the memory
  policy's probe when the chunk will evict);
- a stop (Ctrl-C, SIGTERM, `request_stop`) is honoured between chunks, never inside one: the stream
  ends at a consistent point, what was asked is answered, and `close` checkpoints. A chunk that
  failed half-way (an exception, a forced second Ctrl-C) marks the session broken, and a broken
  session is never checkpointed (the last good checkpoint stands).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hermes.cache import KIND_VISUAL
from hermes.config import MemoryConfig
from hermes.errors import ConfigError, UsageError
from hermes.memory import build_policy
from hermes.probe import prefill_chunk
from hermes.models.base import VLMAdapter
from hermes.pipelines.asked import Question  # noqa: F401  (re-exported: the Python API's question)
from hermes.pipelines.frames import Frame
from hermes.pipelines.heap import freeze_startup_heap

OPTION_LETTERS = "ABCDEFGHIJ"
log = logging.getLogger(__name__)


@dataclass
class Answer:
    """One answer and how it was produced; `to_json()` gives the fields of docs/ARCHITECTURE.md, Interfaces."""

    question: str
    answer: str
    at_s: float | None
    frames_seen: int
    last_frame_t_s: float | None  # timestamp of the newest frame the answer could see
    ttft_ms: float
    latency_ms: float
    memory: dict[str, int]
    options: tuple[str, ...] = ()
    first_token_logits: torch.Tensor | None = field(default=None, repr=False)
    recall: dict | None = None  # {"recall_ms", "records", "tokens"} when recall is on
    prompt_tokens: int = 0  # tokens the answer attended to: memory (with recall) and the question
    completion_tokens: int = 0  # tokens generated

    def to_json(self) -> dict[str, Any]:
        out = {"question": self.question, "answer": self.answer, "at_s": self.at_s,
               "frames_seen": self.frames_seen, "ttft_ms": round(self.ttft_ms, 3),
               "latency_ms": round(self.latency_ms, 3), "memory": self.memory}
        if self.options:
            out["options"] = list(self.options)
        if self.recall is not None:
            out["recall"] = self.recall
        return out


def check_option_count(options: Sequence[str]) -> None:
    """Refuse more options than there are letters (A-J) to answer with.

    Raises:
        UsageError: more than 10 options.
    """
    if len(options) > len(OPTION_LETTERS):
        raise UsageError(f"at most {len(OPTION_LETTERS)} options per question, found {len(options)}")


def format_prompt(question: str, options: Iterable[str] = ()) -> str:
    """The question text the model sees; multiple choice gets lettered options and an instruction."""
    options = list(options)
    if not options:
        return question
    check_option_count(options)
    lines = [question] + [f"{OPTION_LETTERS[i]}. {text}" for i, text in enumerate(options)]
    lines.append("Answer with the option's letter from the given choices directly.")
    return "\n".join(lines)


@dataclass
class ChunkStats:
    """What one chunk cost."""

    frames: int
    encode_ms: float  # vision tower + language-model prefill (with the probe's pseudo-query when it rides along)
    maintain_ms: float  # memory maintenance after the chunk (0 when nothing is evicted)


class StreamingSession:
    """Feeds frames to a model chunk by chunk and answers questions from its memory.

    Args:
        model: a loaded adapter.
        memory: the memory config, or a policy name with default settings.
        source: frames in time order (a file reader, a live source, or any iterable of `Frame`).
        chunk_frames: frames encoded per forward.
        max_new_tokens: answer length cap.
        progress: show a progress bar over frames (for terminals).
        total_frames: expected number of frames, for the progress bar (None if unknown).
        memory_dir: where levels 2 and 3 and checkpoints persist (a folder or ``s3://bucket/prefix``).
        resume: continue the stream saved in `memory_dir`.
        read_only: follow a stream another process writes into `memory_dir`: restore its last
            checkpoint, recall from its records, write nothing.
        on_close: called once by the first `close` (`hermes.open` releases its video this way).

    Raises:
        ConfigError: an unknown memory policy or invalid memory settings.
    """

    def __init__(self, model: VLMAdapter, memory: MemoryConfig | str = "full", source: Iterable[Frame] = (),
                 *, chunk_frames: int = 16, max_new_tokens: int = 64, progress: bool = False,
                 total_frames: int | None = None, memory_dir: str | Path | None = None,
                 resume: bool = False, read_only: bool = False,
                 on_close: Callable[[], None] | None = None) -> None:
        if chunk_frames < 1:
            raise ConfigError(f"stream.chunk_frames must be at least 1, found {chunk_frames}")
        if resume and memory_dir is None:
            raise UsageError("--resume continues a stream saved in a memory directory: give --memory-dir DIR")
        memory_cfg = MemoryConfig(policy=memory) if isinstance(memory, str) else memory
        self.model = model
        self.memory = build_policy(memory_cfg, model)
        self.recall = memory_cfg.recall
        self.chunk_frames = chunk_frames
        self.max_new_tokens = max_new_tokens
        self.cache = model.new_cache()
        self.model.encode_prefix(self.cache)
        self.encoded_t_s: list[float] = []  # every frame encoded so far, in order
        self.chunk_stats: list[ChunkStats] = []
        self.peak_cache_bytes = self.cache.nbytes()  # largest the working cache has been (before maintenance)
        self._frames: Iterator[Frame] = iter(source)
        self._pending: Frame | None = None  # read from the source but belongs to a later question
        self._exhausted = False
        self._progress = None
        self._on_close = on_close
        self.lower = None  # levels 2 and 3 (hermes.lower.LowerLevels), with a memory directory or recall
        if memory_dir is not None or memory_cfg.recall:
            from hermes.lower import LowerLevels

            self.memory.check_lower_levels()
            self.lower = LowerLevels(memory_cfg, model, memory_dir, read_only=read_only)
        self._persistent = memory_dir is not None and not read_only  # a follower never writes
        if read_only:
            from hermes.pipelines.persistence import restore_session

            try:
                restore_session(self)  # the writer's last checkpoint: level 1 as it saved it
            except BaseException:
                self.lower.close()
                raise
        self._checkpoint_every = memory_cfg.checkpoint_every
        self.stop_requested = False  # set by `request_stop` (signals); honoured between chunks
        self.broken: str | None = None  # why the working cache can no longer be trusted (never checkpointed)
        self.cut_short = False  # a stop ended `advance` before the time it was asked to reach
        if self._persistent:
            from hermes.pipelines.persistence import has_checkpoint, restore_session

            if resume:
                try:
                    restore_session(self)
                except BaseException:
                    self.lower.close()  # nobody gets this session to close it
                    raise
            elif has_checkpoint(self.lower):
                self.lower.close()
                raise UsageError(f"memory directory {memory_dir} already holds a stream: pass --resume to continue "
                                 f"it, or choose another --memory-dir")
        if progress:
            from tqdm import tqdm

            self._progress = tqdm(total=total_frames, unit="frame", desc="encoding", leave=False)
        freeze_startup_heap()  # the model and what this open loaded stay: no collector passes over them

    # ---- ingest ------------------------------------------------------------------------------------

    def ingest(self, frames: list[Frame]) -> None:
        """Encode `frames` (one chunk, in time order) into memory."""
        if not frames:
            return
        if self.broken:
            raise UsageError(f"the stream cannot continue: {self.broken}")
        if getattr(self.memory, "reencodes", False):  # recent-frames: frames are encoded per question
            self.memory.keep_frames(frames)
            self.encoded_t_s.extend(f.t_s for f in frames)
            return
        start = time.perf_counter()
        self.broken = "a chunk's encode was interrupted half-way"  # until this chunk is whole
        try:
            chunk = self.model.encode_chunk([f.rgb for f in frames], [f.t_s for f in frames])
            positions = self.memory.place(self.cache, chunk.layout)  # compacts first if out of range
            # the maintenance's pseudo-query, if this chunk will evict, rides in the chunk's forward
            probe_embeds = self.memory.probe_queries(self.cache, chunk.embeds.shape[0])
            probe = prefill_chunk(self.model, self.cache, chunk.embeds, positions, probe_embeds, **chunk.model_kwargs)
            self.cache.record(positions, KIND_VISUAL, len(self.encoded_t_s) + chunk.frame_index)
            self.encoded_t_s.extend(f.t_s for f in frames)
            encode_ms = (time.perf_counter() - start) * 1e3
            self.peak_cache_bytes = max(self.peak_cache_bytes, self.cache.nbytes())
            if self.lower is not None:
                # the previous chunk's records reach the level-2 log during this chunk's encode; waiting
                # here (rarely at all) keeps at most one chunk's records short of durable
                self.lower.store.barrier()
            # copies of the evicted tokens are made only for lower levels that take them
            evictions = self.memory.maintain(self.cache, copy_evicted=self.lower is not None, probe=probe)
            maintain_ms = evictions.maintain_ms
            if self.lower is not None:  # what level 1 evicted goes down, as the policy returned it
                start = time.perf_counter()
                self.lower.capture(evictions, self.encoded_t_s)
                maintain_ms += (time.perf_counter() - start) * 1e3
        except BaseException as exc:
            self.broken = f"a chunk failed half-way ({type(exc).__name__})"
            raise
        self.broken = None
        self.chunk_stats.append(ChunkStats(len(frames), encode_ms, maintain_ms))
        if self._progress is not None:
            self._progress.update(len(frames))
        n = len(self.chunk_stats)
        if self._persistent and (n == 1 or n % self._checkpoint_every == 0):  # the first one early
            # saved on the disk writer's thread from a snapshot; every chunk (a live source, whose frames
            # cannot be read again) waits for it, so a crash still loses at most the chunk in flight;
            # otherwise it lands while the next chunk encodes (a crash re-reads from the previous one)
            self.checkpoint(wait=self._checkpoint_every == 1)

    def request_stop(self) -> None:
        """Ask the stream to stop at the next chunk boundary (safe from a signal handler)."""
        self.stop_requested = True

    def checkpoint(self, wait: bool = True) -> None:
        """Save level 1 and the stream position to the memory directory (no-op without one).

        Args:
            wait: Return once it is durable (False: it is written on the disk writer's thread while
                the caller goes on; the next checkpoint, `barrier` or close waits for it).

        Raises:
            UsageError: the session is broken (a chunk failed half-way): its cache is never saved.
        """
        if self.broken:
            raise UsageError(f"not checkpointing: {self.broken}; the last checkpoint stands")
        if self._persistent:
            from hermes.pipelines.persistence import save_session

            save_session(self, wait=wait)

    def state_dict(self) -> dict[str, Any]:
        """Everything the session's owners need to resume: the cache's (``cache.*``), the policy's
        (``policy.*``) and the session's own (``encoded_t_s``, the frame times; ``policy``, its name).

        Values are tensors (as they are, not copied) or JSON-able scalars and dicts.
        """
        state: dict[str, Any] = {f"cache.{k}": v for k, v in self.cache.state_dict().items()}
        state.update({f"policy.{k}": v for k, v in self.memory.state_dict().items()})
        state.update(encoded_t_s=torch.tensor(self.encoded_t_s, dtype=torch.float64), policy=self.memory.name)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (cache tensors go to the model's device).

        Raises:
            ValueError: a state of another memory policy, or one its owners refuse.
        """
        if state["policy"] != self.memory.name:
            raise ValueError(f"a session state of memory policy {state['policy']!r}, not {self.memory.name!r}")
        part = lambda prefix: {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}  # noqa: E731
        self.cache.load_state_dict(part("cache."), device=self.model.device)
        self.memory.load_state_dict(part("policy."))
        self.encoded_t_s = state["encoded_t_s"].tolist()

    def _next_frame(self) -> Frame | None:
        if self._pending is not None:
            frame, self._pending = self._pending, None
            return frame
        if self._exhausted:
            return None
        frame = next(self._frames, None)
        # a resumed stream skips what it already saw (the source starts from the beginning again)
        while frame is not None and self.encoded_t_s and frame.t_s <= self.encoded_t_s[-1]:
            frame = next(self._frames, None)
        if frame is None:
            self._exhausted = True
        return frame

    def advance(self, until_s: float | None = None) -> None:
        """Encode source frames with `t_s < until_s` (all remaining frames when None)."""
        chunk: list[Frame] = []
        while True:
            frame = self._next_frame()
            if frame is None:
                break
            if until_s is not None and frame.t_s >= until_s:
                self._pending = frame  # it belongs after the question
                break
            chunk.append(frame)
            if len(chunk) == self.chunk_frames:
                if self.stop_requested:  # between chunks: these frames are read again on --resume
                    self.cut_short = True
                    return
                self.ingest(chunk)
                chunk = []
        if self.stop_requested:
            self.cut_short = True
        else:
            self.ingest(chunk)

    # ---- answers -----------------------------------------------------------------------------------

    def memory_stats(self) -> dict[str, int]:
        """Memory held now, per level (levels 2 and 3 report 0 when they are off)."""
        lower = self.lower.stats() if self.lower is not None else {"dram_bytes": 0, "disk_bytes": 0,
                                                                  "disk_records": 0}
        return {"hbm_tokens": self.cache.num_tokens, "hbm_bytes": self.cache.nbytes(), **lower}

    def ask(self, question: str, options: Iterable[str] = (), at: float | None = None,
            answer_prefix: str = "", query: str | None = None,
            on_text: Callable[[str], None] | None = None) -> Answer:
        """Answer `question` from the frames before `at` (or from everything ingested so far).

        Args:
            question: the question text.
            options: multiple-choice options (lettered A, B, ... in the prompt); the answer is then
                the letter of one of them, decoding restricted to the offered letters (one token).
            at: stream time in seconds; frames with `t_s < at` are encoded first. Must not go
                back before frames already encoded.
            answer_prefix: text the answer starts with (a benchmark's "Best option:(");
                the returned answer is what the model writes after it.
            query: the bare question when `question` is a whole benchmark prompt: what the memory
                retrieves with (`rekv`) and conditions on (`memory.condition_on_question`); None: `question`.
            on_text: receives the answer's text piece by piece as it is generated (`serve`'s SSE).

        Returns:
            The `Answer`; memory is exactly as before the call.

        Raises:
            UsageError: `at` earlier than a frame already in memory.
        """
        options = tuple(options)
        check_option_count(options)  # before any prompt (ours or a baseline's) letters them
        if at is not None:
            if self.encoded_t_s and at <= self.encoded_t_s[-1]:
                raise UsageError(f"question at {at:g}s comes after frames up to {self.encoded_t_s[-1]:g}s "
                                 f"were already encoded; ask questions in time order")
            self.advance(until_s=at)
        if hasattr(self.memory, "question_embeds"):  # recent-frames asks in SimpleStream's wording and framing
            prompt = self.memory.question_embeds(self.model, question, options)
        else:
            prompt = self.model.question_embeds(format_prompt(question, options))
        if answer_prefix:
            prompt = torch.cat([prompt, self.model.embed_text(answer_prefix).to(prompt.dtype)])
        # hermes.baselines answer from a cache of their own: recent-frames' fresh one, rekv's retrieved view
        query = query or question
        cache = self.memory.answer_cache(self.model, self.cache, query) \
            if hasattr(self.memory, "answer_cache") else self.cache
        self.memory.make_room(cache, prompt.shape[0] + self.max_new_tokens)
        self.memory.note_question(query)
        mark = cache.mark()
        recall = None
        try:
            if self.recall and self.lower is not None:
                recall = self.lower.recall(cache, prompt)  # an answer-time view: rewound below
            prompt_tokens = cache.num_tokens + prompt.shape[0]
            if options:  # the answer is one of the offered letters, never free text
                letters = self.model.letter_token_ids(OPTION_LETTERS[:len(options)])
                generation = self.model.generate_greedy(prompt, cache, 1, on_text=on_text,
                                                        first_token_ids=list(letters))
                text = letters[generation.token_ids[0]]
            else:
                generation = self.model.generate_greedy(prompt, cache, self.max_new_tokens, on_text=on_text)
                text = generation.text
        finally:
            cache.rewind(mark)
        return Answer(question=question, answer=text, at_s=at, frames_seen=len(self.encoded_t_s),
                      last_frame_t_s=self.encoded_t_s[-1] if self.encoded_t_s else None,
                      ttft_ms=generation.ttft_ms, latency_ms=generation.latency_ms,
                      memory=self.memory_stats(), options=options,
                      first_token_logits=generation.first_token_logits,
                      recall=recall.to_json() if recall is not None else None,
                      prompt_tokens=prompt_tokens, completion_tokens=len(generation.token_ids))

    def run(self, questions: Iterable[Question] = (), *, to_end: bool = False) -> Iterator[Answer]:
        """Stream the source, answering each question when the stream reaches its time.

        Args:
            questions: questions with `at_s` (sorted here by time); None means "at the end".
            to_end: keep encoding after the last question until the source ends (without
                questions the whole source is always encoded).

        Yields:
            One `Answer` per question, in time order.
        """
        questions = list(questions)
        timed = sorted((q for q in questions if q.at_s is not None), key=lambda q: q.at_s)
        at_end = [q for q in questions if q.at_s is None]
        unanswered = 0
        with stop_on_signals(self):
            for i, q in enumerate(timed):
                if not self.stop_requested:  # reach q's moment before generating: a stop on the way skips it
                    self.advance(until_s=q.at_s)
                if self.stop_requested:  # the stream stopped before q's moment: not answered, not generated
                    unanswered = len(timed) - i
                    break
                yield self.ask(q.text, q.options, at=q.at_s)
            if (to_end or at_end or not timed) and not self.stop_requested:
                self.advance()
            for q in at_end:  # asked of the stream as it stands, stopped or not
                yield self.ask(q.text, q.options)
        if self.stop_requested:
            log.warning("stopped on request after %d frames (%.1f s of stream), %d timed question(s) not reached; "
                        "--resume continues", len(self.encoded_t_s),
                        self.encoded_t_s[-1] if self.encoded_t_s else 0.0, unanswered)
        self.close()

    def __enter__(self) -> StreamingSession:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """End the session: a last checkpoint, levels 2 and 3 flushed, `on_close` called (safe to call twice)."""
        on_close, self._on_close = self._on_close, None
        try:
            self._close_memory()
        finally:
            if on_close is not None:
                on_close()

    def _close_memory(self) -> None:
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        if self.lower is not None:
            try:
                if self._persistent and not self.broken:
                    self.lower.store.drain()  # host memory to disk before the final checkpoint claims it
                    self.checkpoint()
                elif self._persistent:
                    log.warning("not checkpointing: %s; the last checkpoint stands (--resume continues from it)",
                                self.broken)
            finally:
                lower, self.lower = self.lower, None
                self._persistent = False
                lower.close()

@contextlib.contextmanager
def stop_on_signals(session: StreamingSession, source=None):
    """While active, Ctrl-C and SIGTERM ask `session` (and `source`) to stop between chunks.

    A second signal raises KeyboardInterrupt at once (a forced stop: the chunk in flight marks the
    session broken, so its cache is not checkpointed). Outside the main thread this does nothing
    (signals are delivered to the main thread only).

    Args:
        session: the session to stop.
        source: optionally, a live source with ``request_stop()``, so a wait for frames ends too.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame) -> None:
        if session.stop_requested:
            raise KeyboardInterrupt
        session.request_stop()
        if source is not None and hasattr(source, "request_stop"):
            source.request_stop()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
