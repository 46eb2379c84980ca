"""Reading an answer out of a model's reply: each benchmark's official rule, and a strict one.

`parse_official` applies the extraction the benchmark's own evaluation code applies, quirks
included (each benchmark module's `parse`), so numbers stay comparable with published ones.
`parse_strict` accepts only a reply that *is* an answer: one capital letter, optionally "(B)",
"B." or "B)", optionally followed by that option's exact text. Both return an option index or
None; results report both, so a model that scores only under the lenient rule is visible.

Where the official scorer is not "extract a letter, compare" (OVO-Bench credits a reply that
*contains* the right letter; MVBench compares the first word by substring), `official_correct`
applies the scorer itself (the module's `correct`); `score_reply` gathers everything a
per-sample result records.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from . import registry
from .benchmark import option_index
from .records import KIND_COUNT, KIND_MC, KIND_OPEN, KIND_PROACTIVE, KIND_YESNO, BenchmarkQuestion

_STRICT = re.compile(r"(?:\((?P<a>[A-Z])\)|(?P<b>[A-Z])[.)]?)(?:\s+(?P<text>.+))?", re.DOTALL)


def parse_strict(reply: str | None, options: Sequence[str]) -> int | None:
    """The option a reply names, counting only replies that are exactly an answer.

    Accepted (surrounding whitespace aside): "B", "B.", "B)", "(B)", each optionally followed
    by option B's text ("(B) cat", "B. cat"; case and a final period ignored). Lower-case
    letters, prefixes like "The answer is", and unbalanced brackets are not answers.

    Args:
        reply: The model's reply.
        options: The question's options.

    Returns:
        The option index, or None.
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
    """The option a reply names, by the benchmark's official extraction rule (its module's `parse`).

    Args:
        reply: The model's reply (for MVBench/MLVU, the continuation after the answer prefix).
        options: The question's options.
        benchmark: Benchmark name.
        variant: An older official rule where the benchmark's scorer changed (its `parser_variants`);
            None: the current one.

    Returns:
        The option index, or None (open-ended benchmarks: always).
    """
    return registry.get_benchmark(benchmark).parse(reply or "", options, variant)


def official_correct(reply: str | None, question: BenchmarkQuestion, benchmark: str,
                     variant: str | None = None) -> bool | None:
    """Whether the official scorer would count the reply correct.

    Args:
        reply: The model's reply.
        question: The question (its `answer`/`gt_index` are the reference).
        benchmark: Benchmark name.
        variant: The official parser's variant (see `parse_official`).

    Returns:
        True/False, or None when the question cannot be scored here (open-ended questions
        need a judge; unlabelled questions have no reference). Proactive timing is applied
        by `score_reply`; this checks the content only.
    """
    if question.answer is None or question.kind == KIND_OPEN:
        return None
    return registry.get_benchmark(benchmark).correct(reply or "", question, variant)


def strict_correct(reply: str | None, question: BenchmarkQuestion) -> bool | None:
    """Whether the reply is exactly the reference answer (see `parse_strict`).

    Yes/no probes need exactly "Yes"/"No", counts exactly the number, proactive output
    exactly the expected text (a final period allowed in each case).

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
        question: The question.
        reply: The model's reply (None when it produced none).
        benchmark: Benchmark name.
        answered_at_s: For proactive output, when the model spoke (None: it never did).
        variant: The official parser's variant (see `parse_official`).

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
