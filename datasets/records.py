"""The unified benchmark record of docs/ARCHITECTURE.md, Evaluation, and the value parsers every loader shares.

Every benchmark loader turns its official files into a list of `VideoRecord`s, each holding the
`BenchmarkQuestion`s asked about one video (one stream under the streaming protocol). A question carries
its options with any "A. " / "(A)" prefix removed, the index of the correct option (`gt_index`),
the time it is asked (`t_s`, None for offline benchmarks: asked after the whole video) and the
untouched source entry (`raw`), so nothing the official files say is lost.

Timestamps and option lists come in many spellings across the benchmarks ("00:03:10", "3:10",
54.2, "[0:00:00 - 0:01:00]", "00:15-00:19"; "A. cat", "(A) cat", "A.cat", bare "cat"); the
parsers here are the single place those spellings are understood.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from hermes.errors import UsageError

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# Question kinds: how a reply is prompted and scored (see the benchmark modules and parsing.py).
KIND_MC = "mc"  # multiple choice, answered with an option letter
KIND_YESNO = "yesno"  # OVO-Bench SSR/CRR probes, answered "Yes" / "No"
KIND_COUNT = "count"  # OVO-Bench REC probes, answered with a number
KIND_OPEN = "open"  # open-ended (RVS, MLVU generation tasks), needs a judge
KIND_PROACTIVE = "proactive"  # StreamingBench proactive output: answer at the right moment


@dataclass
class BenchmarkQuestion:
    """One question about a video, in the unified form of docs/ARCHITECTURE.md, Evaluation.

    Attributes:
        question: The question text as the benchmark words it (options removed when the
            benchmark puts them inline, as LVBench does).
        options: Option texts without letter prefixes; empty for open-ended questions.
        answer: The reference answer: the correct option's text for multiple choice, the
            expected text/number otherwise; None when the benchmark withholds it.
        gt_index: Index of the correct option in `options`, or None.
        t_s: When the question is asked, in seconds from the start of the video; None for
            offline benchmarks (asked after the whole video).
        task: The benchmark's task name for this question (what accuracy is broken down by).
        raw: The source entry exactly as read from the benchmark's file.
        qid: An id unique within the benchmark, stable across runs (resume relies on it).
        meta: Parsed extras the metrics and prompts need: "kind", "groups" (extra labels the
            `tasks` filter and the metrics accept, e.g. OVO category or Video-MME duration),
            and per-benchmark values such as a proactive ground-truth time.
    """

    question: str
    options: list[str]
    answer: str | None
    gt_index: int | None
    t_s: float | None
    task: str
    raw: dict
    qid: str
    meta: dict = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """How the question is answered: one of the KIND_* constants."""
        return self.meta.get("kind") or (KIND_MC if self.options else KIND_OPEN)

    @property
    def gt_letter(self) -> str | None:
        """The correct option's letter ("A" for index 0), or None."""
        return None if self.gt_index is None else LETTERS[self.gt_index]

    @property
    def labels(self) -> tuple[str, ...]:
        """The task name followed by every group label (what `tasks=` filters match)."""
        return (self.task, *self.meta.get("groups", ()))


@dataclass
class VideoRecord:
    """One video and the questions asked about it (one stream under the streaming protocol).

    Attributes:
        video_id: Identifier unique within the benchmark.
        video_path: The video file (or `.npy` frame array), or None when it is not on disk;
            a runner reports such questions as missing rather than dropping them.
        duration: Length in seconds when the benchmark states it, else None.
        questions: Sorted by `t_s`, offline (None) questions last; ties keep file order.
        frames_dir: A folder of extracted frames, for benchmarks that ship frames (MVBench).
        frame_fps: Rate of `frames_dir` / `.npy` frames, in frames per second.
        start_s: Start of the span the questions are about (MVBench bounds), else None.
        end_s: End of that span, else None.
    """

    video_id: str
    video_path: Path | None
    duration: float | None
    questions: list[BenchmarkQuestion]
    frames_dir: Path | None = None
    frame_fps: float | None = None
    start_s: float | None = None
    end_s: float | None = None

    def __post_init__(self) -> None:
        # by the time they are asked, offline (None) ones last; stable, so ties keep file order
        self.questions = sorted(self.questions, key=lambda q: (q.t_s is None, q.t_s or 0.0))

    @property
    def available(self) -> bool:
        """Whether the video's pixels are on disk (a file or a frame folder)."""
        return self.video_path is not None or self.frames_dir is not None


_SPAN_SEPARATOR = re.compile(r"\s*,\s*|\s+-\s+|(?<=\d)-(?=\d)")


def parse_timestamp(value: Any, carry: bool = False) -> float:
    """Parse one point in time to seconds.

    Accepts numbers (215, 54.2), numeric strings ("54.2"), and clock stamps with one to three
    fields: "SS", "MM:SS", "H:MM:SS", "HH:MM:SS.mmm" (StreamingBench writes "00:03:10",
    LVBench "00:15", OVO-Bench plain seconds).

    Args:
        value: The stamp as found in a benchmark file.
        carry: Read every field as a count of its unit, whatever its size, as StreamingBench's
            official scripts do (`sum(int(x) * 60 ** i ...)`): "00:12450" is 12,450 s. Off, a
            minutes/seconds field of 60 or more is an error.

    Returns:
        Seconds, as a non-negative float.

    Raises:
        UsageError: If the value is empty, negative, not finite, a span (use `parse_span`),
            or a clock stamp with a minutes/seconds field of 60 or more.
    """
    if isinstance(value, bool) or value is None:
        raise UsageError(f"expected a timestamp (seconds or H:MM:SS), found {value!r}")
    if isinstance(value, (int, float)):
        return _check_seconds(float(value), value)
    text = str(value).strip()
    if not text:
        raise UsageError("expected a timestamp (seconds or H:MM:SS), found an empty string")
    if text.startswith("[") or _SPAN_SEPARATOR.search(text.strip("[]")):
        raise UsageError(f"expected one timestamp, found the span {text!r}; use parse_span")
    fields = text.split(":")
    if len(fields) > 3:
        raise UsageError(f"expected a timestamp like H:MM:SS, found {text!r}")
    try:
        numbers = [float(f) for f in fields]
    except ValueError:
        raise UsageError(f"expected a timestamp like H:MM:SS or seconds, found {text!r}") from None
    # Only the leading field may exceed 59: "75" seconds is fine, "1:75" is a typo (unless `carry`).
    if any(n < 0 or (n >= 60 and not carry) for n in numbers[1:]):
        raise UsageError(f"expected minutes and seconds below 60 in {text!r}")
    seconds = 0.0
    for n in numbers:
        seconds = seconds * 60 + n
    return _check_seconds(seconds, value)


def _check_seconds(seconds: float, original: Any) -> float:
    """Reject negative and non-finite seconds, naming the original value."""
    if not math.isfinite(seconds) or seconds < 0:
        raise UsageError(f"expected a non-negative finite timestamp, found {original!r}")
    return seconds


def parse_span(value: Any) -> tuple[float, float]:
    """Parse a time span to (start, end) seconds.

    Accepts "[12.5, 30]", "[0:00:00 - 0:01:00]" (StreamingBench `time`), "00:15-00:19"
    (LVBench `time_reference`) and two-element lists or tuples.

    Args:
        value: The span as found in a benchmark file.

    Returns:
        (start, end) in seconds.

    Raises:
        UsageError: If the value is not two timestamps or the end precedes the start.
    """
    if isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        text = str(value).strip()
        inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
        parts = [p for p in _SPAN_SEPARATOR.split(inner.strip()) if p != ""]
    if len(parts) != 2:
        raise UsageError(f"expected a span like [start, end], found {value!r}")
    start, end = parse_timestamp(parts[0]), parse_timestamp(parts[1])
    if end < start:
        raise UsageError(f"span {value!r} ends before it starts")
    return start, end


# "A. cat", "A.cat", "A) cat", "(A) cat", "[A] cat", "A: cat"; the letter must be followed by
# punctuation, so "A man wearing a hat" is never mistaken for a prefixed option.
_OPTION_PREFIX = re.compile(r"^\s*(?:\(([A-Z])\)|\[([A-Z])\]|([A-Z])\s*[.):])\s*")


def _option_prefix_letter(option: str) -> str | None:
    """The letter an option is prefixed with, or None."""
    match = _OPTION_PREFIX.match(option)
    return next((g for g in match.groups() if g), None) if match else None


def normalize_options(options: Sequence[Any]) -> list[str]:
    """Strip letter prefixes ("A. ", "(A)", "A:", "A.") from a list of options.

    Prefixes are removed only when every option carries its own letter in order (A, B, C...),
    so option texts that happen to start with a capital and a dot are left alone. Options
    without letters (StreamingBench SQA, MVBench) are returned stripped of whitespace only;
    letters are assigned by position.

    Args:
        options: Option strings as found in a benchmark file.

    Returns:
        The option texts.
    """
    texts = [str(o).strip() for o in options]
    if texts and all(_option_prefix_letter(t) == LETTERS[i] for i, t in enumerate(texts)):
        return [_OPTION_PREFIX.sub("", t, count=1).strip() for t in texts]
    return texts


def letter_options(options: Sequence[str], style: str = "{letter}. {text}") -> list[str]:
    """Give options their letters by position, in a benchmark's style.

    Args:
        options: Option texts (as `normalize_options` returns them).
        style: A format with {letter} and {text}: "{letter}. {text}" gives "A. cat",
            "({letter}) {text}" gives "(A) cat".

    Returns:
        The lettered options.
    """
    return [style.format(letter=LETTERS[i], text=text) for i, text in enumerate(options)]


def is_option_index(value: Any, count: int) -> bool:
    """Whether `value` is a 0-based index into `count` options (an int, never a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < count


def resolve_gt_index(answer: Any, options: Sequence[str], prefer_text: bool = False) -> int | None:
    """Find the index of the correct option from however the benchmark states it.

    Accepts a 0-based int (OVO-Bench `gt`, LongVideoBench `correct_choice`), a letter with
    optional brackets or dot ("B", "(B)", "B."), the option text itself (MVBench, MLVU; the
    first occurrence wins when a text is listed twice, as the official scripts do), or a
    prefixed text ("B. cat").

    Args:
        answer: The answer field.
        options: The normalised option texts.
        prefer_text: Try an exact option-text match before reading the answer as a letter;
            for benchmarks whose answer field is the option text (MVBench, MLVU), where an
            option could itself be a single letter.

    Returns:
        The index, or None when the answer matches no option.
    """
    if answer is None or isinstance(answer, bool):
        return None
    if isinstance(answer, int):
        return answer if is_option_index(answer, len(options)) else None
    text = str(answer).strip()
    if prefer_text and text in options:
        return list(options).index(text)
    letter = re.fullmatch(r"\(?([A-Za-z])\)?\.?", text)
    if letter and len(text) <= 4:
        index = LETTERS.find(letter.group(1).upper())
        return index if 0 <= index < len(options) else None
    for candidate in (text, _OPTION_PREFIX.sub("", text, count=1).strip()):
        if candidate in options:
            return list(options).index(candidate)
    folded = [o.casefold().rstrip(".") for o in options]
    key = text.casefold().rstrip(".")
    return folded.index(key) if key in folded else None
