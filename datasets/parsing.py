"""Reading an answer out of a model's reply: each benchmark's official rule, and a strict one.

`parse_official` reproduces the extraction each benchmark's own evaluation code applies, quirks
included, so numbers stay comparable with published ones. `parse_strict` accepts only a reply
that *is* an answer: one capital letter, optionally "(B)", "B." or "B)", optionally followed by
that option's exact text. Both return an option index or None; results report both, so a model
that scores only under the lenient rule is visible.

Where the official scorer is not "extract a letter, compare" (OVO-Bench credits a reply that
*contains* the right letter; MVBench compares the first word by substring), `official_correct`
reproduces the scorer itself; `score_reply` gathers everything a per-sample result records.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from . import registry
from .records import KIND_COUNT, KIND_MC, KIND_OPEN, KIND_PROACTIVE, KIND_YESNO, LETTERS, BenchmarkQuestion
from .streamingbench import PROACTIVE_TOLERANCE_S

# Video-MME's extract_characters_regex (BradyFU/Video-MME, now MME-Benchmarks/Video-MME,
# evaluation/eval_your_results.py). Two commas are missing in the official list, so Python joins
# "The best option is" + "The correct option is" and "Best answer:" + "Best option:" into
# single strings that never occur: a reply "Best option: C" is read as B (from "Best"). The
# list is kept exactly so, because published Video-MME numbers were computed with it.
VIDEOMME_PREFIXES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option isThe correct option is",
    "Best answer:Best option:",
)
# LongVideoBench parse_multi_choice_response (lmms-eval tasks/longvideobench/utils.py).
LVB_PREFIXES = (
    "The best answer is", "The correct answer is", "The answer is", "The answer",
    "The best option is", "The correct option is", "Best answer:", "Best option:",
)

_STRICT = re.compile(r"(?:\((?P<a>[A-Z])\)|(?P<b>[A-Z])[.)]?)(?:\s+(?P<text>.+))?", re.DOTALL)


def _index(letter: str | None, options: Sequence[str]) -> int | None:
    """Index of an option letter, or None when it is not one of the options'."""
    if not letter or len(letter) != 1:
        return None
    index = LETTERS.find(letter)
    return index if 0 <= index < len(options) else None


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
    index = _index(match.group("a") or match.group("b"), options)
    text = match.group("text")
    if index is None or text is None:
        return index
    return index if text.strip().casefold().rstrip(".") == options[index].strip().casefold().rstrip(".") else None


PARSER_VARIANTS = {"egoschema": ("current", "legacy")}


def parse_official(reply: str | None, options: Sequence[str], benchmark: str, variant: str | None = None) -> int | None:
    """The option a reply names, by the benchmark's official extraction rule.

    Rules (official source in brackets):

    * videomme [Video-MME eval_your_results.py extract_characters_regex]: remove answer
      prefixes ("The answer is", ...; see VIDEOMME_PREFIXES for the official list's quirk);
      then the first capital A-D anywhere.
    * longvideobench [lmms-eval parse_multi_choice_response]: the same over A-E; the official
      code guesses at random when nothing is found, here that is None (counted wrong).
    * mlvu [MLVU choice_bench.py check_ans]: the character just before the reply's first ")"
      ("B) cat" -> B, "(B) cat" -> B); without a ")" the whole reply must be the letter.
    * mvbench [Ask-Anything mvbench.ipynb check_ans]: "(" is prepended (the answer prompt ends
      with "(") and the first word, stripped of "(", ")" and ".", must be the letter, any case.
    * streamingbench [count.py]: the reply's first character.
    * lvbench [LVBench answer_util.polish_answer]: text before the first ")", after a "(",
      first word, first character.
    * egoschema [lmms-eval egoschema_process_results_generation, since late 2024]: the MMMU
      multiple-choice parse ("(B)", "B ", "B." anywhere; else, for replies over five words, an
      option's text; several candidates: the one whose last occurrence comes first). The
      official code guesses at random when nothing is found; here that is None. `variant=
      "legacy"` is the mid-2024 rule: the reply equals an option ("A. text."), its text, or
      its letter.
    * ovo-bench [OVO-Bench OVOBenchScore]: the official scorer credits a reply that contains
      the correct letter; as an index, the first option letter found. Yes/no probes: "Y"/"N",
      else the first of "Yes"/"No" found.
    * rvs: open-ended, nothing to parse (None).

    Args:
        reply: The model's reply (for MVBench/MLVU, the continuation after "Best option:(").
        options: The question's options.
        benchmark: Benchmark name.
        variant: An older official rule where the benchmark's scorer changed (PARSER_VARIANTS);
            None: the current one.

    Returns:
        The option index, or None.
    """
    name = registry.family(benchmark)
    text = reply or ""
    if name in ("videomme", "longvideobench"):
        prefixes, letters = (VIDEOMME_PREFIXES, "ABCD") if name == "videomme" else (LVB_PREFIXES, "ABCDE")
        s = text.strip()
        for prefix in prefixes:
            s = s.replace(prefix, "")
        # The official "more than ten words and no letter" rule is implied: no letter, no answer.
        match = re.search(f"[{letters}]", s)
        return None if match is None else _index(match.group(0), options)
    if name == "mlvu":
        s = text  # check_ans does not strip
        return _index(s[s.index(")") - 1: s.index(")")] if ")" in s else s, options)
    if name == "mvbench":
        first = ("(" + text.strip().split("\n")[0]).split(" ")[0]
        return _index(first.replace(".", "").replace("(", "").replace(")", "").upper(), options)
    if name == "streamingbench":
        return _index(text[:1], options)
    if name == "lvbench":
        return _index(_polish_lvbench(text), options)
    if name == "egoschema":
        return _egoschema(text.strip(), options) if variant == "legacy" else _mmmu(text, options)
    if name == "ovo-bench":
        return _ovo_index(text, options)
    return None  # rvs: open-ended


def _polish_lvbench(answer: str) -> str:
    """LVBench's polish_answer, step for step."""
    answer = answer.strip().split(")")[0].strip()
    if "(" in answer:
        answer = answer.split("(")[1].strip()
    answer = answer.split(" ")[0]
    return answer[:1]


def _egoschema(pred: str, options: Sequence[str]) -> int | None:
    """lmms-eval's EgoSchema matching: full "A. text." string, then text, then letter."""
    full = [f"{LETTERS[i]}. {o}" if o.endswith(".") else f"{LETTERS[i]}. {o}." for i, o in enumerate(options)]
    for candidates in (full, [f.split(". ", 1)[1] for f in full]):
        if pred in candidates:
            return candidates.index(pred)
    return next((i for i in range(len(options)) if pred in (LETTERS[i], LETTERS[i] + ".")), None)


def _mmmu(response: str, options: Sequence[str]) -> int | None:
    """lmms-eval's parse_multi_choice_response (after MMMU's eval_utils), step for step."""
    letters = LETTERS[: len(options)]
    for char in (",", ".", "!", "?", ";", ":", "'"):
        response = response.strip(char)
    response = f" {response} "  # spaces avoid partial matches
    candidates = [f"({c})" for c in letters if f"({c})" in response]
    candidates += [f"{c} " for c in letters if f"{c} " in response]
    candidates += [f"{c}." for c in letters if f"{c}." in response]
    by_letter = True
    if not candidates and len(response.split()) > 5:
        candidates = [c for c, text in zip(letters, options) if text.strip().lower() in response.lower()]
        by_letter = False
    if not candidates:
        return None  # the official code picks a letter at random here
    if len(candidates) > 1:
        ends = [response.rfind(c) if by_letter else response.lower().rfind(options[letters.index(c)].strip().lower())
                for c in candidates]
        chosen = candidates[ends.index(min(ends))]
    else:
        chosen = candidates[0]
    return _index(chosen.replace("(", "").replace(")", "").replace(".", "").strip(), options)


def _ovo_index(reply: str, options: Sequence[str]) -> int | None:
    """OVO-Bench as an index: yes/no probes by word, otherwise the first option letter seen."""
    if list(options) == ["No", "Yes"]:
        if reply in ("N", "Y"):
            return "NY".index(reply)
        found = [(reply.find(w), i) for i, w in enumerate(options) if w in reply]
        return min(found)[1] if found else None
    found = [(reply.find(LETTERS[i]), i) for i in range(len(options)) if LETTERS[i] in reply]
    return min(found)[1] if found else None


def official_correct(reply: str | None, question: BenchmarkQuestion, benchmark: str,
                     variant: str | None = None) -> bool | None:
    """Whether the official scorer would count the reply correct.

    Args:
        reply: The model's reply.
        question: The question (its `answer`/`gt_index` are the reference).
        benchmark: Benchmark name.

    Returns:
        True/False, or None when the question cannot be scored here (open-ended questions
        need a judge; unlabelled questions have no reference). Proactive timing is applied
        by `score_reply`; this checks the content only.
    """
    if question.answer is None or question.kind == KIND_OPEN:
        return None
    text = reply or ""
    name = registry.family(benchmark)
    if question.kind == KIND_COUNT:
        # OVO REC: every digit in the reply, joined, must spell the count.
        return "".join(re.findall(r"\d+", text)) == question.answer
    if question.kind == KIND_YESNO:
        return text == question.answer[0] or question.answer in text
    if question.kind == KIND_PROACTIVE:
        return question.answer in text
    if question.gt_index is None:
        return None
    if name == "ovo-bench":
        return question.gt_letter in text
    if name == "mvbench":
        # check_ans: first word of "(" + reply vs "(x)", either contained in the other. The
        # official rule also credits an empty reply ("(" is in "(b)"); that one is not copied.
        if not text.strip():
            return False
        pred = ("(" + text.strip().split("\n")[0]).lower().split(" ")[0]
        gt = f"({question.gt_letter.lower()})"
        return pred.replace(".", "") in gt or gt in pred
    return parse_official(text, question.options, benchmark, variant) == question.gt_index


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
        output, "time_correct": within the official ±2 s of the ground-truth time; the
        official and strict verdicts then require it too.
    """
    has_options = question.kind in (KIND_MC, KIND_YESNO)
    result = {
        "parsed_official": parse_official(reply, question.options, benchmark, variant) if has_options else None,
        "parsed_strict": parse_strict(reply, question.options) if question.kind == KIND_MC else None,
        "official": official_correct(reply, question, benchmark, variant),
        "strict": strict_correct(reply, question),
    }
    if question.kind == KIND_PROACTIVE:
        gt_time = question.meta.get("gt_time_s")
        on_time = (
            answered_at_s is not None and gt_time is not None and abs(answered_at_s - gt_time) <= PROACTIVE_TOLERANCE_S
        )
        result["time_correct"] = on_time
        result["official"] = bool(on_time and result["official"])
        result["strict"] = bool(on_time and result["strict"])
    return result
