"""`run_eval`: one benchmark, one model and memory config, every selected question answered and scored.

Protocols (docs/ARCHITECTURE.md, Evaluation; the registry says which a benchmark uses):

* streaming (OVO-Bench, StreamingBench, RVS): one `StreamingSession` per video; questions in
  time order, each asked at its `t_s` so that exactly the frames before it are encoded, the
  stream continuing after each answer. Every answer is checked against that rule (the newest
  frame it saw is earlier than the question) and the run stops with `FutureFrameError` if not.
  StreamingBench proactive questions are polled as the official script does: one second after
  the question, then every second up to 4 s past the ground-truth time, asking "is it the right
  time?"; on the first reply containing "yes" the question itself is asked, and that moment is
  the answer time.
* offline (Video-MME, MVBench, EgoSchema, MLVU, LongVideoBench, LVBench): the whole video (or
  the MVBench window) is encoded, then every question is asked.

Protocol variants (`protocol=`, recorded in the summary): "official" (the default: what
published numbers used) and "strict" (only frames before the question, one continuing stream).
They differ where the benchmark says its official pipeline does: `inclusive_ceil` (OVO-Bench: a
question at t is answered from the frames up to and including ceil(t); the stream still continues)
and `context_s` (StreamingBench: each question on a fresh session over [t - 60 s, t); a proactive
question on a fresh session fed from the question time on, polled there).

Prompts come from `registry.build_prompt` and are sent verbatim (options included in the text,
none passed to the session). Replies are scored by `parsing.score_reply` (official and strict),
open-ended replies by a `judge.Judge` when one is configured. Results go to `results.SampleLog`
as they are produced; `summary.json` and `report.md` are written at the end.

Resume: videos whose questions all have samples are skipped. A video with some samples is run
again from its start, because asking a question can change memory (a policy may evict to make
room for the prompt): replaying keeps the stream identical to an uninterrupted run. Replies to
questions already recorded are compared with the record, not written again; differences are
counted in the summary (`resume.replay_mismatches`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import itertools
import json
import math
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from hermes.config import HermesConfig, build_config
from hermes.errors import SourceError, UsageError

from . import registry
from .benchmark import STREAMING, Benchmark, Prompt
from .common import first_questions
from .judge import Judge, JudgeConfig, build_judge
from .metrics import questions_of
from .parsing import score_reply
from .record_frames import open_record_frames
from .records import KIND_OPEN, KIND_PROACTIVE, BenchmarkQuestion, VideoRecord
from .report import write_report
from .results import MANIFEST_FILE, SUMMARY_FILE, SampleLog, _read_samples, write_atomic
from .shards import Shard, parse_shard, select_shard
from .summary import accuracy, cost_figures, coverage, environment, input_settings

# StreamingBench proactive polling (StreamingBenchProactive.py): first poll one second after the
# question, then every second, until this long after the ground-truth time.
POLL_INTERVAL_S = 1.0
POLL_AFTER_GT_S = 4.0
PROTOCOL_VARIANTS = ("official", "strict")
# OVO-Bench official: frames up to and including ceil(t); this much past it stays out.
_INCLUSIVE_S = 1e-6


class FutureFrameError(AssertionError):
    """An answer saw a frame at or after its question's time: the streaming protocol is broken.

    This is a bug in the session or the runner, never a user error, so it is not a HermesError.
    """


def sent_text(prompt: Prompt) -> str:
    """The text sent to the session for a prompt.

    The stream's system prompt is fixed when it starts, so a benchmark's per-question system text
    (MVBench, MLVU) goes before the user text (the summary notes it). The answer prefix is sent
    separately (`StreamingSession.ask(answer_prefix=)`): the reply is what follows it.
    """
    return prompt.system + prompt.user if prompt.system else prompt.user


class _VideoRun:
    """Streams one video through a fresh session and records each answer.

    Args:
        ctx: The run (see `_Run`).
        record: The video and its questions.
    """

    def __init__(self, ctx: _Run, record: VideoRecord) -> None:
        self.ctx = ctx
        self.record = record
        self.session = None
        self.frames_seen = 0

    def run(self) -> None:
        """Encode the video and answer its questions (writing samples as they come).

        Raises:
            SourceError: The video cannot be read (open or mid-stream).
            FutureFrameError: An answer saw frames after its question.
        """
        if self.ctx.windowed:
            self._windowed()
            return
        with self._open(0.0):
            if self.ctx.protocol == STREAMING:
                self._streaming()
            else:
                self.session.advance()
                for i in range(len(self.record.questions)):
                    self._finish(i, self._ask(self._prompt(i), None))

    @contextlib.contextmanager
    def _open(self, start_s: float):
        """A fresh session over the video's frames from `start_s` on (closed on exit)."""
        from hermes.pipelines.session import StreamingSession

        cfg = self.ctx.cfg
        with open_record_frames(self.record, cfg.stream.fps, cfg.stream.backend) as source:
            frames = source.frames if start_s <= 0 else (f for f in source.frames if f.t_s >= start_s)
            self.session = StreamingSession(self.ctx.model, cfg.memory, frames, chunk_frames=cfg.stream.chunk_frames,
                                            max_new_tokens=cfg.model.max_new_tokens)
            self.frames_seen = 0
            try:
                yield self.session
            finally:
                self.session.close()

    def _windowed(self) -> None:
        """StreamingBench official: each question on a fresh session over [t - context_s, t);
        proactive ones from their question time on; untimed ones over the whole video."""
        questions = self.record.questions
        for i, q in enumerate(questions):
            if q.t_s is None:
                with self._open(0.0):
                    self.session.advance()
                    self._finish(i, self._ask(self._prompt(i), None))
            elif q.kind == KIND_PROACTIVE:
                with self._open(q.t_s):
                    self._poll(i, q)
            else:
                with self._open(max(0.0, q.t_s - self.ctx.context_s)):
                    self._finish(i, self._ask(self._prompt(i), q.t_s))

    def _prompt(self, index: int, stage: str = "answer") -> Prompt:
        questions = self.record.questions
        prompt = registry.build_prompt(self.ctx.name, questions[index], previous=questions[:index], stage=stage)
        return dataclasses.replace(prompt, query=questions[index].question)  # rekv retrieves with the bare question

    def _ask(self, prompt: Prompt, at_s: float | None):
        """Ask through the session and check the no-future-frames rule (of the protocol variant)."""
        if at_s is not None and self.ctx.inclusive_ceil:
            at_s = math.ceil(at_s) + _INCLUSIVE_S  # OVO-Bench official: the clip [0, ceil(t)]
        answer = self.session.ask(sent_text(prompt), at=at_s, answer_prefix=prompt.answer_prefix or "",
                                  query=prompt.query or None)
        if at_s is not None and answer.last_frame_t_s is not None and not answer.last_frame_t_s < at_s:
            raise FutureFrameError(f"{self.record.video_id}: question at {at_s:g}s was answered from a frame at "
                                   f"{answer.last_frame_t_s:g}s")
        if answer.frames_seen < self.frames_seen:
            raise FutureFrameError(f"{self.record.video_id}: frames seen fell from {self.frames_seen} to "
                                   f"{answer.frames_seen}; the stream went backwards")
        self.frames_seen = answer.frames_seen
        return answer

    def _streaming(self) -> None:
        """Questions (and proactive polls) in time order; untimed questions at the end."""
        questions = self.record.questions
        order = itertools.count()  # ties keep file order
        events: list[tuple[float, int, int, int]] = []  # (at_s, order, question index, poll number)
        untimed = []
        for i, q in enumerate(questions):
            if q.t_s is None:
                untimed.append(i)
            elif q.kind == KIND_PROACTIVE:
                # Polled at least once, even if the window is already over (the official loop
                # would then record no answer; so does one "no").
                heapq.heappush(events, (q.t_s + POLL_INTERVAL_S, next(order), i, 1))
            else:
                heapq.heappush(events, (q.t_s, next(order), i, 0))
        polls: dict[int, list[dict]] = {}
        while events:
            at_s, _, i, poll = heapq.heappop(events)
            if not poll:
                self._finish(i, self._ask(self._prompt(i), at_s))
                continue
            next_at = self._poll_once(i, questions[i], at_s, poll, polls.setdefault(i, []))
            if next_at is not None:
                heapq.heappush(events, (next_at, next(order), i, poll + 1))
        if untimed:
            self.session.advance()
            for i in untimed:
                self._finish(i, self._ask(self._prompt(i), None))

    def _poll_once(self, i: int, q: BenchmarkQuestion, at_s: float, poll: int, history: list[dict]) -> float | None:
        """One proactive poll ("is it the right time?"); returns the next poll's time, or None when done."""
        check = self._ask(self._prompt(i, stage="poll"), at_s)
        history.append({"at_s": at_s, "reply": check.answer, "frames_seen": check.frames_seen,
                        "last_frame_t_s": check.last_frame_t_s})
        if "yes" in check.answer.strip().lower():
            self._finish(i, self._ask(self._prompt(i), at_s), answered_at_s=at_s, polls=history)
            return None
        next_at = q.t_s + (poll + 1) * POLL_INTERVAL_S
        if next_at <= q.meta.get("gt_time_s", q.t_s) + POLL_AFTER_GT_S:
            return next_at
        self._finish(i, check, answered_at_s=None, polls=history)  # never said "yes"
        return None

    def _poll(self, i: int, q: BenchmarkQuestion) -> None:
        """Every poll of one proactive question on the current session."""
        history: list[dict] = []
        at_s, poll = q.t_s + POLL_INTERVAL_S, 1
        while at_s is not None:
            at_s = self._poll_once(i, q, at_s, poll, history)
            poll += 1

    def _finish(self, index: int, answer, answered_at_s: float | None = None, polls: list | None = None) -> None:
        """Score and record the answer to question `index` (or compare it, for one recorded before)."""
        q = self.record.questions[index]
        proactive = q.kind == KIND_PROACTIVE
        reply = None if proactive and answered_at_s is None else answer.answer
        done = self.ctx.log.samples.get(q.qid)
        if done is not None:
            if done.get("reply") != reply:
                self.ctx.replay_mismatches += 1
            return
        prompt = self._prompt(index)
        sample = {
            "qid": q.qid, "video_id": self.record.video_id, "task": q.task, "kind": q.kind,
            "question": q.question, "options": q.options, "reference": q.answer, "gt_index": q.gt_index,
            "t_s": q.t_s, "prompt": {"system": prompt.system, "user": prompt.user,
                                     "answer_prefix": prompt.answer_prefix},
            "reply": reply, **score_reply(q, reply, self.ctx.name, answered_at_s=answered_at_s,
                                          variant=self.ctx.parser_variant),
            "at_s": answer.at_s, "frames_seen": answer.frames_seen, "last_frame_t_s": answer.last_frame_t_s,
            "ttft_ms": round(answer.ttft_ms, 3), "latency_ms": round(answer.latency_ms, 3), "memory": answer.memory,
        }
        if answer.recall is not None:  # memory.recall on: what was brought back for this question
            sample["recall"] = answer.recall
        if proactive:
            sample.update(answered_at_s=answered_at_s, polls=polls or [])
        self.ctx.judge_sample(q, sample)
        self.ctx.log.append(sample)
        if self.ctx.bar is not None:
            self.ctx.bar.update(1)


class _Run:
    """State shared by the videos of one run."""

    def __init__(self, name: str, spec: Benchmark, cfg: HermesConfig, model, judge: Judge | None, log: SampleLog,
                 bar, variant: str = "official", parser_variant: str | None = None) -> None:
        self.name, self.protocol, self.cfg = name, spec.protocol, cfg
        self.model, self.judge, self.log, self.bar = model, judge, log, bar
        self.replay_mismatches = 0
        self.variant, self.parser_variant = variant, parser_variant
        official = variant == "official" and spec.protocol == STREAMING
        self.inclusive_ceil = official and spec.inclusive_ceil  # the clip [0, ceil(t)]
        self.context_s = spec.context_s if official else None  # [t - context_s, t), proactive from t
        self.windowed = self.context_s is not None

    def judge_sample(self, q: BenchmarkQuestion, sample: dict) -> None:
        """Add the judge's verdict to an open-ended sample (when a judge is configured)."""
        if self.judge is None or q.kind != KIND_OPEN or q.answer is None:
            return
        result = self.judge.judge(q.question, q.answer, sample["reply"])
        info = self.judge.describe()
        sample.update(judge_correct=result["verdict"], judge_score=result["score"], judge_raw=result["raw"],
                      judged_by=f"{info['kind']}:{info['model']}")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "model"


def default_output_dir(benchmark: str, cfg: HermesConfig) -> Path:
    """`hermes-eval/<benchmark>-<model>-<memory policy>` in the working directory.

    Deterministic, so `--resume` finds the same folder without repeating `--output`.
    """
    return Path("hermes-eval") / f"{registry.canonical_name(benchmark)}-{_slug(cfg.model.name)}-{cfg.memory.policy}"


def run_eval(benchmark: str, data_root, cfg: HermesConfig, *, limit: int | None = None,
             limit_questions: int | None = None, tasks: str | Sequence[str] | None = None, output_dir,
             resume: bool = False,
             strict_videos: bool = False, progress: bool = True, model=None,
             judge: Judge | JudgeConfig | None = None, protocol: str = "official",
             parser_variant: str | None = None, shard: Shard | None = None, answer_missing: bool = True) -> dict:
    """Evaluate one benchmark end to end and write its results.

    Args:
        benchmark: Benchmark name (any spelling `registry.canonical_name` accepts).
        data_root: The benchmark's folder (annotations and videos).
        cfg: The resolved configuration (model, memory, stream); recorded in the results.
        limit: Evaluate at most this many videos (streams; questions for MVBench).
        limit_questions: Then at most this many questions, the first in file order (as lmms-eval's
            `--limit` counts).
        tasks: Task or group names to keep (see each loader).
        output_dir: Results folder (see results.py for its layout).
        resume: Continue the run recorded in `output_dir`.
        strict_videos: Fail on the first video that is missing or unreadable instead of
            counting its questions as missing.
        progress: Show a progress bar over questions (only when stderr is a terminal).
        model: A loaded adapter to use instead of loading `cfg.model` (tests, notebooks).
        judge: A judge, or the config of one, for open-ended questions; None leaves them
            unscored (replies are still recorded; rerun with `resume` and a judge to score).
        protocol: "official" (what published numbers used; see the module docstring) or
            "strict" (only frames before the question).
        parser_variant: An older official parser where one exists (the benchmark's `parser_variants`).
        shard: Run only this shard's videos (`--shard i/n`); merge shards with `eval merge`.
        answer_missing: Off: answer nothing, only summarise the samples already in
            `output_dir` (what `eval merge` does; unanswered questions count as missing).

    Returns:
        The summary dict also written to `summary.json`.

    Raises:
        UsageError: Bad benchmark, tasks, limit, data root, output folder or variant.
        SourceError: No selected video on disk, or (strict_videos) the first missing/unreadable one.
        ModelError: The model or judge cannot be loaded or reached.
        FutureFrameError: An answer saw frames after its question (a bug).
    """
    started = time.perf_counter()
    name = registry.canonical_name(benchmark)
    spec = registry.get_benchmark(name)
    if protocol not in PROTOCOL_VARIANTS:
        raise UsageError(f"expected --protocol official or strict, found {protocol!r}")
    if parser_variant is not None and parser_variant not in spec.parser_variants:
        known = ", ".join(f"{b}: {'/'.join(s.parser_variants)}" for b, s in registry.BENCHMARKS.items()
                          if s.parser_variants)
        raise UsageError(f"{name} has no parser variant {parser_variant!r} (variants: {known})")
    loaded = spec.loader(data_root, tasks=tasks, limit=limit)
    issues = getattr(loaded, "issues", None)
    records = select_shard(first_questions(list(loaded), limit_questions), shard)
    missing = [r.video_id for r in records if not r.available]
    if strict_videos and missing:
        raise SourceError(f"{name}: video {missing[0]} is not under {data_root} ({len(missing)} of {len(records)} "
                          "selected videos missing); download it or drop --strict-videos")
    if isinstance(judge, JudgeConfig):
        judge = build_judge(judge)
    model_name = cfg.model.name if model is None else model.name
    manifest = {"benchmark": name, "model": model_name, "config": cfg.to_dict(), "protocol": protocol,
                "parser_variant": parser_variant, "tasks": tasks, "limit": limit, "limit_questions": limit_questions,
                "shard": None if shard is None else str(shard)}
    # The output folder is checked before the model loads: a wrong --output fails in a second.
    with SampleLog.open(output_dir, manifest, resume) as log:
        todo = [q for r in records if r.available for q in r.questions if q.qid not in log.samples]
        todo = todo if answer_missing else []
        if model is None and todo:  # nothing left to answer: no model to load (a finished --resume)
            from hermes.models.loading import load_model

            model = load_model(cfg.model)
        bar = None
        if progress and sys.stderr.isatty() and todo:
            from tqdm import tqdm

            bar = tqdm(total=len(todo), unit="question", desc=name)
        ctx = _Run(name, spec, cfg, model, judge, log, bar, protocol, parser_variant)
        ctx.model_name = model.name if model is not None else model_name
        unreadable = []
        try:
            _rejudge(ctx, records)
            for record in records:
                if not todo or not record.available or all(q.qid in log.samples for q in record.questions):
                    continue
                try:
                    _VideoRun(ctx, record).run()
                except SourceError as exc:
                    if strict_videos:
                        raise
                    unreadable.append({"video_id": record.video_id, "error": _one_line(exc)})
        finally:
            if bar is not None:
                bar.close()
        videos = {"expected": len(records), "missing": missing, "unreadable": unreadable}
        summary = _summary(ctx, spec, records, videos, time.perf_counter() - started, issues, tasks, shard)
        summary["limit"] = {"videos": limit, "questions": limit_questions}  # which cut made the denominator
    folder = Path(output_dir).expanduser()
    text = json.dumps(summary, indent=2, ensure_ascii=False) + "\n"
    write_atomic(folder / SUMMARY_FILE, text)
    summary = json.loads(text)  # the caller gets exactly what the file says (tuples become lists)
    selected = {q.qid for q in questions_of(records)}
    write_report(folder, summary, [s for s in log.samples.values() if s["qid"] in selected])
    return summary


def _rejudge(ctx: _Run, records: Sequence[VideoRecord]) -> None:
    """On resume with a judge: score recorded open-ended replies that no judge has seen."""
    if ctx.judge is None:
        return
    for q in questions_of(records):
        sample = ctx.log.samples.get(q.qid)
        if sample is not None and "judge_raw" not in sample and q.kind == KIND_OPEN and q.answer is not None:
            updated = dict(sample)
            ctx.judge_sample(q, updated)
            ctx.log.append(updated)  # the last line of a qid wins


def _summary(ctx: _Run, spec, records: Sequence[VideoRecord], videos: dict, wall_s: float, issues=None,
             tasks=None, shard: Shard | None = None) -> dict:
    """Everything summary.json holds."""
    questions = questions_of(records)
    selected = {q.qid for q in questions}
    samples = [s for s in ctx.log.samples.values() if s["qid"] in selected]
    results = {s["qid"]: s for s in samples}
    notes = []
    if any(s.get("prompt", {}).get("system") for s in samples):
        notes.append("the benchmark's system text is sent before the question, not as the stream's system prompt")
    unjudged = sum(1 for s in samples if s.get("kind") == KIND_OPEN and s.get("reference") is not None
                   and "judge_raw" not in s)
    if unjudged:
        notes.append(f"{unjudged} open-ended replies recorded but not scored: no judge configured (rerun with "
                     "--resume and --judge to score them)")
    if ctx.replay_mismatches:
        notes.append(f"{ctx.replay_mismatches} replayed answers differ from the recorded ones (non-deterministic "
                     "kernels?); the recorded ones are kept")
    return {
        "benchmark": ctx.name, "protocol": ctx.protocol, "protocol_variant": ctx.variant,
        "parser_variant": ctx.parser_variant, "metric": spec.metric, "model": ctx.model_name,
        # what every number here was measured with: fps, pixels per frame, judge, subset
        "settings": input_settings(ctx.cfg, ctx.model, ctx.judge, tasks, ctx.variant, shard),
        "accuracy": accuracy(spec.metric, questions, results),
        "data_issues": issues.to_json() if issues is not None else None,
        "coverage": coverage(questions, results, videos),
        "cost": cost_figures(samples),
        "judge": ctx.judge.describe() if ctx.judge is not None else None,
        "judged_by": dict(Counter(s["judged_by"] for s in samples if s.get("judged_by"))),
        "config": ctx.cfg.to_dict(),
        "resume": {"samples_reused": ctx.log.reused, "torn_bytes_dropped": ctx.log.repaired_bytes,
                   "replay_mismatches": ctx.replay_mismatches},
        "environment": environment(),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_time_s": round(wall_s, 3),  # this invocation (a resumed run counts only its own part)
        "notes": notes,
    }


def merge_shards(parts: Sequence[str], output: str, data_root: str) -> dict:
    """Merge the results folders of the shards of one run into `output`.

    The parts' samples are copied into `output` under the run's manifest (without a shard),
    then the summary is computed over every selected question by the same code as a single
    run (`run_eval` with nothing left to answer: no model is loaded).

    Args:
        parts: The shards' results folders (each with run.json and samples.jsonl).
        output: The merged results folder (created; must not hold results yet).
        data_root: The benchmark's folder, to read the questions (the denominator).

    Returns:
        The merged summary.

    Raises:
        UsageError: A part is not a results folder, parts of different runs, a shard missing
            or given twice, or `output` already holds results.
    """
    manifests, samples = [], {}
    for part in parts:
        folder = Path(part).expanduser()
        try:
            manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"eval merge: {folder} is not a results folder ({MANIFEST_FILE}: {exc})") from None
        manifests.append(manifest)
        if (folder / "samples.jsonl").is_file():
            samples.update(_read_samples(folder / "samples.jsonl")[0])
    shards = [m.get("shard") for m in manifests]
    if any(s is None for s in shards):
        raise UsageError("eval merge: every part must be a --shard run; "
                         f"{parts[shards.index(None)]} is a whole run")
    parsed = [parse_shard(s) for s in shards]
    count = parsed[0].count
    if sorted(p.index for p in parsed) != list(range(1, count + 1)) or any(p.count != count for p in parsed):
        found = ", ".join(shards)
        raise UsageError(f"eval merge: expected shards 1/{count} .. {count}/{count} once each, found {found}")
    base = {k: v for k, v in manifests[0].items() if k != "shard"}
    for part, manifest in zip(parts, manifests):
        if {k: v for k, v in manifest.items() if k != "shard"} != base:
            raise UsageError(f"eval merge: {part} is a shard of a different run (benchmark, config or protocol differ)")
    with SampleLog.open(output, {**base, "shard": None}, resume=False) as log:
        for sample in samples.values():
            log.append(sample)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        json.dump({k: base["config"][k] for k in ("model", "memory", "stream")}, handle)  # JSON is YAML
    cfg = build_config(model=base["config"]["model"]["name"], config_file=handle.name)
    Path(handle.name).unlink()
    return run_eval(base["benchmark"], data_root, cfg, output_dir=output, resume=True, progress=False,
                    protocol=base.get("protocol", "official"), parser_variant=base.get("parser_variant"),
                    answer_missing=False, tasks=base.get("tasks"), limit=base.get("limit"),
                    limit_questions=base.get("limit_questions"))
