"""The benchmark protocol: what one module of `datasets/benchmarks/` defines (docs/ARCHITECTURE.md, Evaluation).

A benchmark module holds everything specific to its benchmark: the loader, the official prompt,
the official reply parser and the official metric's extras. It exports `BENCHMARKS`, a dict of
canonical name -> `Benchmark`, and may export `ALIASES` (folded spelling -> canonical name). The
registry finds every module of that folder; nothing else names a benchmark, so adding one is one
module plus its test (README, "Adding a benchmark"). What several benchmarks share stays shared:
`records` (the unified record, value parsers), `common` (files, selection, the loader frame),
`parsing` (strict parsing, per-sample scoring), `metrics` (tallies, coverage, judged accuracy)
and `judge` (the open-ended judge), plus the few prompt and parser pieces below.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import NamedTuple

from .records import KIND_OPEN, LETTERS, BenchmarkQuestion, letter_options

STREAMING = "streaming"  # one stream per video, questions asked at their time, the stream going on
OFFLINE = "offline"  # the whole video, then the questions

# lmms-eval's LongVideoBench post prompt (tasks/longvideobench/utils.py), used by EgoSchema and LVBench too.
LETTER_DIRECTLY = "Answer with the option's letter from the given choices directly."


@dataclass(frozen=True)
class Prompt:
    """What to send for one question.

    Attributes:
        user: The user-turn text (placed after the video by the model adapter).
        system: System text ("" when the benchmark has none).
        answer_prefix: Text the assistant turn starts with ("" when none); a reply is its continuation.
        query: The bare question, what memory retrieves with ("": the user text).
    """

    user: str
    system: str = ""
    answer_prefix: str = ""
    query: str = ""


class Benchmark(NamedTuple):
    """How to load, run and score one benchmark: `(loader, protocol, metric)` and the hooks below.

    A benchmark module subclasses it, overriding `prompt` (always) and whichever other hooks its
    official evaluation needs; the defaults are plain multiple choice.

    Attributes:
        loader: `load(data_root, tasks=None, limit=None) -> list[VideoRecord]` (see `common.make_loader`).
        protocol: STREAMING or OFFLINE.
        metric: The aggregation `metrics.summarize` applies: this benchmark's own name when it has
            official extras (`categories`, `add_metrics`), else a shared one ("accuracy", "judge").

    Class attributes:
        family: The name prompts and parsers are keyed by where several registry entries share
            them (RVS-Ego and RVS-Movie are "rvs"); "" means the entry's own name.
        parser_variants: Older official parsers `parse` accepts as `variant`.
        inclusive_ceil: Official protocol feeds the clip [0, ceil(t)] for a question at t (OVO-Bench).
        context_s: Official protocol answers each question from a fresh session over the last this
            many seconds (StreamingBench); None: one continuing stream.
    """

    loader: Callable
    protocol: str
    metric: str = "accuracy"

    # Class attributes, not fields (unannotated): a subclass sets them.
    family = ""
    parser_variants = ()
    inclusive_ceil = False
    context_s = None

    def prompt(self, question: BenchmarkQuestion, previous: Sequence[BenchmarkQuestion], stage: str) -> Prompt:
        """The official prompt for `question`; `previous`: its video's earlier questions; `stage`: "answer"/"poll"."""
        raise NotImplementedError

    def parse(self, reply: str, options: Sequence[str], variant: str | None = None) -> int | None:
        """The option index the official extraction reads from `reply`, or None (the default: open-ended)."""
        return None

    def correct(self, reply: str, question: BenchmarkQuestion, variant: str | None = None) -> bool | None:
        """The official verdict for a labelled, not open-ended question (default: parsed index == gt_index)."""
        if question.gt_index is None:
            return None
        return self.parse(reply, question.options, variant) == question.gt_index

    def on_time(self, question: BenchmarkQuestion, answered_at_s: float | None) -> bool:
        """Proactive output: whether a reply at `answered_at_s` counts as on time (default: any reply)."""
        return answered_at_s is not None

    def categories(self, question: BenchmarkQuestion) -> Iterable[str]:
        """The labels a summary's `per_category` counts `question` toward; a benchmark without this
        override has no `per_category`."""
        return ()

    def add_metrics(self, summary: dict, labelled: Sequence[BenchmarkQuestion], results: Mapping[str, Mapping],
                    key: str) -> None:
        """Add the official metric's extras to a `metrics.summarize` result (default: none)."""


def option_index(letter: str | None, options: Sequence[str]) -> int | None:
    """Index of an option letter, or None when it is not one of the options'."""
    if not letter or len(letter) != 1:
        return None
    index = LETTERS.find(letter)
    return index if 0 <= index < len(options) else None


def letter_after_prefixes(reply: str, options: Sequence[str], prefixes: Sequence[str], letters: str) -> int | None:
    """Video-MME's and LongVideoBench's rule: drop each answer prefix, then the first of `letters` anywhere.

    The official "more than ten words and no letter" rule is implied: no letter, no answer.
    """
    text = reply.strip()
    for prefix in prefixes:
        text = text.replace(prefix, "")
    match = re.search(f"[{letters}]", text)
    return None if match is None else option_index(match.group(0), options)


def best_option_prompt(question: BenchmarkQuestion, system: str, prefix: str) -> Prompt:
    """MVBench's and MLVU's template: "Question: ...\\nOptions:\\n(A) ..." and the answer prefix.

    MLVU's generation tasks (open-ended) send the question alone.
    """
    if question.kind == KIND_OPEN:
        return Prompt(question.question)
    options = letter_options(question.options, "({letter}) {text}")
    body = f"Question: {question.question}\nOptions:\n" + "\n".join(options)
    return Prompt(body + "\nOnly give the best option.", system=system, answer_prefix=prefix)


def mean(values: Iterable[float | None]) -> float | None:
    """Mean of the defined values, or None when there are none."""
    present = [v for v in values if v is not None]
    return fmean(present) if present else None
