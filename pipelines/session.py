"""A streaming session: frames in, chunk by chunk, into the model's memory; questions answered at any moment.

    session = StreamingSession(model, "full", frames)        # frames: any iterable of Frame, in time order
    answer = session.ask("What is moving?", at=12.0)           # encodes frames with t_s < 12.0, then answers

Rules it keeps (docs/ARCHITECTURE.md, Data flow): a question at t sees exactly the frames with
``t_s < t``; answering rewinds its tokens out of the cache; a stop (Ctrl-C, SIGTERM, `request_stop`)
is honoured between chunks, and a chunk that failed half-way marks the session broken, never
checkpointed (the last good checkpoint stands).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hermes.cache import KIND_VISUAL
from hermes.config import MemoryConfig
from hermes.errors import ConfigError, UsageError
from hermes.policies import build_policy
from hermes.prompt import OPTION_LETTERS, check_option_count, format_prompt  # noqa: F401  (re-exported)
from hermes.probe import prefill_chunk
from hermes.models.base import VLMAdapter
from hermes.pipelines.asked import Question  # noqa: F401  (re-exported: the Python API's question)
from hermes.pipelines.frames import Frame
from hermes.pipelines.heap import freeze_startup_heap

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


def no_phase_timer(phase: str) -> contextlib.AbstractContextManager:
    """`StreamingSession.phase_timer`'s default: times nothing."""
    return contextlib.nullcontext()


CHUNK_STATS_KEPT = 1024  # a stream of days keeps the costs of its latest chunks only (`bench day`)


@dataclass
class ChunkStats:
    """What one chunk cost."""

    frames: int
    encode_ms: float  # vision tower + language-model prefill (with the probe's pseudo-query when it rides along)
    maintain_ms: float  # the policy's maintenance after the chunk, with the lower levels' capture


class StreamingSession:
    """Feeds frames to a model chunk by chunk and answers questions from its memory.

    Args:
        memory: the memory config, or a policy name with default settings.
        source: frames in time order (a file reader, a live source, or any iterable of `Frame`).
        chunk_frames: frames encoded per forward.
        progress: show a progress bar over frames (for terminals).
        total_frames: expected number of frames, for the progress bar (None if unknown).
        memory_dir: where levels 2 and 3 and checkpoints persist (a folder or ``s3://bucket/prefix``).
        resume: continue the stream saved in `memory_dir`.
        read_only: follow a stream another process writes into `memory_dir`: restore its last
            checkpoint, recall from its records, write nothing.
        on_close: called once by the first `close` (`hermes.open` releases its video this way).

    Attributes:
        phase_timer: `phase_timer(name)` gives a context manager around each phase of a chunk's ingest,
            "encode" (vision tower, placement, prefill) and "maintain" (the policy's maintenance); the
            default does nothing. A bench sets it to time the phases (`hermes.pipelines.bench.memory`).

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
        # every frame's time so far, in order: 8 bytes a frame (a Python float in a list took 32; a day at
        # 1 fps is 86,400 frames)
        self.encoded_t_s = array("d")
        self.chunk_stats: list[ChunkStats] = []  # the latest chunks' costs, CHUNK_STATS_KEPT to twice that
        self.chunks_encoded = 0  # by this session
        self.peak_cache_bytes = self.cache.nbytes()  # largest the working cache has been (before maintenance)
        self._frames: Iterator[Frame] = iter(source)
        self._pending: Frame | None = None  # read from the source but belongs to a later question
        self._exhausted = False
        self._progress = None
        self._on_close = on_close
        self.phase_timer: Callable[[str], contextlib.AbstractContextManager] = no_phase_timer
        self.lower = None  # levels 2 and 3 (hermes.lower.LowerLevels), with a memory directory or recall
        if memory_dir is not None or memory_cfg.recall:
            from hermes.lower import LowerLevels

            self.memory.check_lower_levels()
            self.lower = LowerLevels(memory_cfg, model, memory_dir, read_only=read_only)
        self._persistent = memory_dir is not None and not read_only  # a follower never writes
        self._checkpoint_every = memory_cfg.checkpoint_every
        self.stop_requested = False  # set by `request_stop` (signals); honoured between chunks
        self.broken: str | None = None  # why the working cache can no longer be trusted (never checkpointed)
        self.cut_short = False  # a stop ended `advance` before the time it was asked to reach
        if read_only or self._persistent:
            from hermes.pipelines.persistence import has_checkpoint, restore_session

            try:
                if read_only or (self._persistent and resume):  # a follower: the writer's last checkpoint
                    restore_session(self)
                elif self._persistent and has_checkpoint(self.lower):
                    raise UsageError(f"memory directory {memory_dir} already holds a stream: pass --resume to "
                                     f"continue it, or choose another --memory-dir")
            except BaseException:
                self.lower.close()  # nobody gets this session to close it
                raise
        if progress:
            from tqdm import tqdm

            self._progress = tqdm(total=total_frames, unit="frame", desc="encoding", leave=False)
        freeze_startup_heap()  # the model and what this open loaded stay: no collector passes over them

    def ingest(self, frames: list[Frame]) -> None:
        """Encode `frames` (one chunk, in time order) into memory."""
        if not frames:
            return
        if self.broken:
            raise UsageError(f"the stream cannot continue: {self.broken}")
        if self.memory.keep_frames(frames):  # a policy that encodes per question (recent-frames)
            self.encoded_t_s.extend(f.t_s for f in frames)
            return
        start = time.perf_counter()
        self.broken = "a chunk's encode was interrupted half-way"  # until this chunk is whole
        try:
            with self.phase_timer("encode"):
                chunk = self.model.encode_chunk([f.rgb for f in frames], [f.t_s for f in frames])
                positions = self.memory.place(self.cache, chunk.layout)  # compacts first if out of range
                probe_embeds = self.memory.probe_queries(self.cache, chunk.embeds.shape[0])
                probe = prefill_chunk(self.model, self.cache, chunk.embeds, positions, probe_embeds,
                                      record=self.memory.records_probe, **chunk.model_kwargs)
                self.cache.record(positions, KIND_VISUAL, len(self.encoded_t_s) + chunk.frame_index)
            self.encoded_t_s.extend(f.t_s for f in frames)
            encode_ms = (time.perf_counter() - start) * 1e3
            self.peak_cache_bytes = max(self.peak_cache_bytes, self.cache.nbytes())
            if self.lower is not None:
                # the previous chunk's records reach the level-2 log during this chunk's encode; waiting
                # here (rarely at all) keeps at most one chunk's records short of durable
                self.lower.store.barrier()
            start = time.perf_counter()
            with self.phase_timer("maintain"):
                evictions = self.memory.maintain(self.cache, copy_evicted=self.lower is not None, probe=probe)
            if self.lower is not None:  # what level 1 evicted goes down, as the policy returned it
                self.lower.capture(evictions, self.encoded_t_s)
            maintain_ms = (time.perf_counter() - start) * 1e3
        except BaseException as exc:
            self.broken = f"a chunk failed half-way ({type(exc).__name__})"
            raise
        self.broken = None
        self.chunk_stats.append(ChunkStats(len(frames), encode_ms, maintain_ms))
        if len(self.chunk_stats) > 2 * CHUNK_STATS_KEPT:
            del self.chunk_stats[:CHUNK_STATS_KEPT]  # one move per CHUNK_STATS_KEPT chunks
        self.chunks_encoded += 1
        if self._progress is not None:
            self._progress.update(len(frames))
        n = self.chunks_encoded
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
        """What resuming needs: ``cache.*``, ``policy.*``, ``encoded_t_s`` (frame times) and ``policy`` (its name);
        tensors as they are (not copied) or JSON-able values."""
        state: dict[str, Any] = {f"cache.{k}": v for k, v in self.cache.state_dict().items()}
        state.update({f"policy.{k}": v for k, v in self.memory.state_dict().items()})
        times = (torch.frombuffer(self.encoded_t_s, dtype=torch.float64).clone() if self.encoded_t_s
                 else torch.zeros(0, dtype=torch.float64))  # a copy: a buffer still exported could not grow
        state.update(encoded_t_s=times, policy=self.memory.name)
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
        self.encoded_t_s = array("d", state["encoded_t_s"].tolist())

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

    def memory_stats(self) -> dict[str, int]:
        """Memory held now, per level (levels 2 and 3 report 0 when they are off)."""
        lower = self.lower.stats() if self.lower is not None else {"dram_bytes": 0, "disk_bytes": 0,
                                                                  "disk_records": 0}
        return {"hbm_tokens": self.cache.num_tokens, "hbm_bytes": self.cache.nbytes(), **lower}

    def ask(self, question: str, options: Iterable[str] = (), at: float | None = None,
            answer_prefix: str = "", query: str | None = None,
            on_text: Callable[[str], None] | None = None, stop_ids: Collection[int] | None = None) -> Answer:
        """Answer `question` from the frames before `at` (or from everything ingested so far).

        Args:
            options: multiple-choice options (lettered A, B, ... in the prompt); the answer is then
                the letter of one of them, decoding restricted to the offered letters (one token).
            at: stream time in seconds; frames with `t_s < at` are encoded first. Must not go
                back before frames already encoded.
            answer_prefix: text the answer starts with (a benchmark's "Best option:(");
                the returned answer is what the model writes after it.
            query: the bare question when `question` is a whole benchmark prompt: what the memory
                retrieves with (`rekv`) and conditions on (`memory.condition_on_question`); None: `question`.
            on_text: receives the answer's text piece by piece as it is generated (`serve`'s SSE).
            stop_ids: the tokens that end a free-text answer (None: the model's end-of-answer tokens;
                empty: none, `max_new_tokens` are decoded, as a bench measures).

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
        prompt = self.memory.question_embeds(self.model, question, options)
        if answer_prefix:
            prompt = torch.cat([prompt, self.model.embed_text(answer_prefix).to(prompt.dtype)])
        query = query or question
        cache = self.memory.answer_cache(self.model, self.cache, query)
        self.memory.make_room(cache, prompt.shape[0] + self.max_new_tokens)
        self.memory.note_question(query)
        mark = cache.mark()
        recall = None
        try:
            if self.recall and self.lower is not None:
                recall = self.lower.recall(cache, prompt, query,  # an answer-time view: rewound below
                                           self.encoded_t_s[-1] if self.encoded_t_s else None)
            prompt_tokens = cache.num_tokens + prompt.shape[0]
            if options:  # the answer is one of the offered letters, never free text
                letters = self.model.letter_token_ids(OPTION_LETTERS[:len(options)])
                generation = self.model.generate_greedy(prompt, cache, 1, on_text=on_text,
                                                        first_token_ids=list(letters))
                text = letters[generation.token_ids[0]]
            else:
                generation = self.model.generate_greedy(prompt, cache, self.max_new_tokens, on_text=on_text,
                                                        stop_ids=stop_ids)
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
    """While active, Ctrl-C and SIGTERM ask `session` (and `source`) to stop between chunks; a second signal
    raises KeyboardInterrupt at once. Outside the main thread (which alone gets signals) nothing.

    Args:
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
