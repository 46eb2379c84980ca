"""Reading an answer out of a reply: the benchmark's official rule, quirks included (its module's `parse`
and `correct`), and a strict one beside it, so a model that scores only under the lenient rule is visible
(docs/ARCHITECTURE.md, Evaluation)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from . import registry
from .benchmark import option_index
from .records import KIND_COUNT, KIND_MC, KIND_OPEN, KIND_PROACTIVE, KIND_YESNO, BenchmarkQuestion

_STRICT = re.compile(r"(?:\((?P<a>[A-Z])\)|(?P<b>[A-Z])[.)]?)(?:\s+(?P<text>.+))?", re.DOTALL)


def parse_strict(reply: str | None, options: Sequence[str]) -> int | None:
    """The option index a reply names when it is exactly an answer, else None.

    Accepted: "B", "B.", "B)", "(B)", each optionally followed by option B's text (case and a final
    period ignored). Lower-case letters, "The answer is" and unbalanced brackets are not answers.
    """
    match = _STRICT.fullmatch((reply or "").strip())
    if not match:
        return None
    index = option_index(match.group("a") or match.group("b"), options)
    text = match.group("text")
    if index is None or text is None:
        return index
    return index if text.strip().casefold().rstrip(".") == options[index].strip().casefold().rstrip(".") else None


def parse_official(reply: str | None, options: Sequence[str], benchmark: str, variant: str | None = None) -> int | None:
    """The option index the benchmark's official extraction reads from `reply`, or None.

    Args:
        reply: The reply (MVBench/MLVU: the continuation after the answer prefix).
        variant: An older official rule (the benchmark's `parser_variants`); None: the current one.
    """
    return registry.get_benchmark(benchmark).parse(reply or "", options, variant)


def official_correct(reply: str | None, question: BenchmarkQuestion, benchmark: str,
                     variant: str | None = None) -> bool | None:
    """The official scorer's verdict on the reply's content (proactive timing: `score_reply`).

    Returns:
        True/False, or None for open-ended (a judge scores them) and unlabelled questions.
    """
    if question.answer is None or question.kind == KIND_OPEN:
        return None
    return registry.get_benchmark(benchmark).correct(reply or "", question, variant)


def strict_correct(reply: str | None, question: BenchmarkQuestion) -> bool | None:
    """Whether the reply is exactly the reference (`parse_strict`; yes/no, counts and proactive output:
    the text itself, a final period allowed).

    Returns:
        True/False, or None for open-ended and unlabelled questions.
    """
    if question.answer is None or question.kind == KIND_OPEN:
        return None
    text = (reply or "").strip().rstrip(".").strip()
    if question.kind in (KIND_YESNO, KIND_COUNT, KIND_PROACTIVE):
        return text == question.answer.strip().rstrip(".")
    if question.gt_index is None:
        return None
    return parse_strict(reply, question.options) == question.gt_index


def score_reply(question: BenchmarkQuestion, reply: str | None, benchmark: str, answered_at_s: float | None = None,
                variant: str | None = None) -> dict:
    """Everything a per-sample result records about one reply.

    Args:
        answered_at_s: Proactive output: when the model spoke (None: it never did).

    Returns:
        {"parsed_official", "parsed_strict", "official", "strict"} and, for proactive
        output, "time_correct" (the benchmark's `on_time`); the official and strict verdicts
        then require it too.
    """
    has_options = question.kind in (KIND_MC, KIND_YESNO)
    result = {
        "parsed_official": parse_official(reply, question.options, benchmark, variant) if has_options else None,
        "parsed_strict": parse_strict(reply, question.options) if question.kind == KIND_MC else None,
        "official": official_correct(reply, question, benchmark, variant),
        "strict": strict_correct(reply, question),
    }
    if question.kind == KIND_PROACTIVE:
        on_time = registry.get_benchmark(benchmark).on_time(question, answered_at_s)
        result["time_correct"] = on_time
        result["official"] = bool(on_time and result["official"])
        result["strict"] = bool(on_time and result["strict"])
    return result
