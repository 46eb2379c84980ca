"""Aggregating per-sample verdicts into the scores each benchmark defines.

Input: the questions that were meant to be answered (the denominator) and the per-sample
results by `qid`, each a mapping with a boolean verdict under `key` ("official" or "strict",
as `parsing.score_reply` writes them; "judge_correct" for open-ended benchmarks). A question
with no result is *missing*: it stays in the denominator and counts as wrong, and the summary
reports coverage, so a partial run can never look better than it is. A question without a
reference answer (EgoSchema outside its public subset, an MLVU item whose answer matches no
candidate) is *unlabelled*: reported, not scored.

Aggregations (`metric` names used by the registry):

* accuracy -- per task, overall micro average (MVBench, EgoSchema).
* ovo -- OVO-Bench OVOBenchScore: accuracy per task (forward tasks per probe); a category
  (backward / realtime / forward) is the mean of its tasks; overall the mean of categories.
* streamingbench -- per task and per subset file, overall micro; proactive output also
  reports `time_accuracy` (answered within ±2 s, count.py).
* videomme -- per task and per duration bucket (short / medium / long), overall micro; also
  `leaderboard`, the numbers Video-MME's official eval_your_results.py prints and its
  leaderboard lists: per duration bucket and over the entire set, correct / replies with an
  extractable letter (a reply without one, or a missing sample, leaves the denominator), named
  in `official_definition`.
* mlvu -- per task, overall micro and M-Avg (mean of the task accuracies).
* longvideobench -- per question category and per duration group, overall micro.
* lvbench -- per question type, a question counting toward every type it lists
  (compute_accuracy.py), overall micro.
* judge -- open-ended (RVS): share judged correct over every question (ours), and ReKV's
  eval_open_ended.py definitions, the official ones: `rekv_accuracy` = yes / (yes + no) over
  judged replies and `rekv_mean_score`, the mean integer score over every reply ReKV keeps (one
  that says neither yes nor no included; see `judge.parse_judge_reply`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from statistics import fmean

from hermes.errors import UsageError

from .ovo_bench import CATEGORY_OF
from .records import KIND_PROACTIVE, BenchmarkQuestion, VideoRecord
from .videomme import DURATIONS

METRICS = ("accuracy", "ovo", "streamingbench", "videomme", "mlvu", "longvideobench", "lvbench", "judge")


def questions_of(records: Iterable[VideoRecord]) -> list[BenchmarkQuestion]:
    """All questions of a list of records, in order."""
    return [q for record in records for q in record.questions]


def _tally(questions: Sequence[BenchmarkQuestion], results: Mapping[str, Mapping], key: str) -> dict:
    """Counts and accuracy over labelled questions; missing ones count as wrong.

    Returns:
        {"expected", "answered", "scored", "correct", "accuracy", "accuracy_answered"}:
        accuracy = correct / expected, missing answers counting as wrong; it is None only
        when there were answers but none could be scored (open-ended replies with no judge
        verdict), since a number then would be invented. accuracy_answered = correct / scored.
    """
    answered = [results[q.qid] for q in questions if q.qid in results]
    verdicts = [r.get(key) for r in answered]
    scored = [v for v in verdicts if v is not None]
    correct = sum(1 for v in scored if v)
    expected = len(questions)
    return {
        "expected": expected,
        "answered": len(answered),
        "scored": len(scored),
        "correct": correct,
        "accuracy": None if not expected or (answered and not scored) else correct / expected,
        "accuracy_answered": correct / len(scored) if scored else None,
    }


def _by_label(
    questions: Sequence[BenchmarkQuestion], labels: Callable[[BenchmarkQuestion], Iterable[str]], results, key
) -> dict[str, dict]:
    """A tally per label; a question with several labels counts toward each."""
    groups: dict[str, list[BenchmarkQuestion]] = {}
    for q in questions:
        for label in labels(q):
            groups.setdefault(str(label), []).append(q)
    return {label: _tally(qs, results, key) for label, qs in groups.items()}


def _mean(values: Iterable[float | None]) -> float | None:
    """Mean of the defined values, or None when there are none."""
    present = [v for v in values if v is not None]
    return fmean(present) if present else None


# What each metric breaks accuracy down by, besides the task.
_CATEGORIES: dict[str, Callable[[BenchmarkQuestion], Iterable[str]]] = {
    "ovo": lambda q: (CATEGORY_OF.get(q.task, "other"),),
    "streamingbench": lambda q: (q.meta.get("subset", "other"),),
    "videomme": lambda q: (q.meta.get("duration", "other"),),
    "longvideobench": lambda q: (q.meta.get("duration_group", "other"),),
    "lvbench": lambda q: q.meta.get("question_types", (q.task,)),
}


def summarize(
    metric: str,
    questions: Iterable[BenchmarkQuestion],
    results: Mapping[str, Mapping],
    key: str = "official",
) -> dict:
    """Aggregate per-sample verdicts as the benchmark defines.

    Args:
        metric: One of METRICS (the registry gives each benchmark's).
        questions: Every question that was meant to be answered.
        results: Per-sample results by qid, holding a verdict under `key` (True, False, or
            None for "not scored").
        key: Which verdict to aggregate: "official" or "strict" ("judge" metrics always
            read "judge_correct").

    Returns:
        {"metric", "key", "overall", "per_task", "per_category" (when the benchmark has
        categories), "coverage": {"expected", "answered", "scored", "missing", "unlabelled",
        "fraction"}} plus metric extras ("m_avg", "mean_score", proactive "time_accuracy", Video-MME's
        "leaderboard", ReKV's "rekv_accuracy").

    Raises:
        UsageError: For an unknown metric name.
    """
    if metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    if metric == "judge":
        key = "judge_correct"
    questions = list(questions)
    labelled = [q for q in questions if q.answer is not None]
    total = _tally(labelled, results, key)
    per_task = _by_label(labelled, lambda q: (q.task,), results, key)
    summary = {
        "metric": metric,
        "key": key,
        "overall": total["accuracy"],
        "per_task": per_task,
        "coverage": {
            "expected": total["expected"],
            "answered": total["answered"],
            "scored": total["scored"],
            "missing": total["expected"] - total["answered"],
            "unlabelled": len(questions) - len(labelled),
            "fraction": total["answered"] / total["expected"] if total["expected"] else None,
        },
    }
    if metric in _CATEGORIES:
        summary["per_category"] = _by_label(labelled, _CATEGORIES[metric], results, key)
    if metric == "ovo":
        _ovo_macro(summary)
    elif metric == "mlvu":
        summary["m_avg"] = _mean(t["accuracy"] for t in per_task.values())
    elif metric == "judge":
        judged = [results[q.qid] for q in labelled if q.qid in results and results[q.qid].get(key) is not None]
        scores = [r.get("judge_score") for r in judged if r.get("judge_score") is not None]
        summary["mean_score"] = _mean(float(s) for s in scores)
        summary["rekv_accuracy"] = sum(1 for r in judged if r[key]) / len(judged) if judged else None
        # ReKV averages the int score of every reply it kept, those that say neither yes nor no included
        kept = [results[q.qid]["judge_score"] for q in labelled if results.get(q.qid, {}).get("judge_score") is not None]
        summary["rekv_mean_score"] = _mean(float(int(s)) for s in kept)
        summary["official_definition"] = "rekv_accuracy"
    elif metric == "videomme":
        summary["leaderboard"] = _videomme_leaderboard(labelled, results, key)
        summary["official_definition"] = "leaderboard"
    if metric == "streamingbench":
        _proactive_timing(summary, labelled, results)
    return summary


def _videomme_leaderboard(labelled: Sequence[BenchmarkQuestion], results: Mapping[str, Mapping], key: str) -> dict:
    """Video-MME as its official eval_your_results.py scores it: only replies with an extracted letter count.

    Returns:
        {"overall", "extracted", "correct", "per_duration": {bucket: {"extracted", "correct", "accuracy"}}}:
        accuracies are correct / extracted, None where no reply had a letter (the script prints 0.0
        there); "overall" is the script's "entire dataset" line, over every selected bucket.
    """
    parsed = "parsed_official" if key == "official" else "parsed_strict"

    def tally(qs: Sequence[BenchmarkQuestion]) -> dict:
        extracted = [results[q.qid] for q in qs if q.qid in results and results[q.qid].get(parsed) is not None]
        correct = sum(1 for r in extracted if r.get(key))
        return {"extracted": len(extracted), "correct": correct,
                "accuracy": correct / len(extracted) if extracted else None}

    buckets: dict[str, list[BenchmarkQuestion]] = {d: [] for d in DURATIONS}  # the script's order
    for q in labelled:
        buckets.setdefault(q.meta.get("duration", "other"), []).append(q)
    entire = tally(labelled)
    return {"overall": entire["accuracy"], "extracted": entire["extracted"], "correct": entire["correct"],
            "per_duration": {bucket: tally(qs) for bucket, qs in buckets.items() if qs}}


def _ovo_macro(summary: dict) -> None:
    """OVO-Bench: category = mean of its tasks' accuracies; overall = mean of categories."""
    for category, tally in summary["per_category"].items():
        tasks = [t for t, v in summary["per_task"].items() if CATEGORY_OF.get(t, "other") == category]
        tally["accuracy"] = _mean(summary["per_task"][t]["accuracy"] for t in tasks)
        tally["tasks"] = sorted(tasks)
    summary["overall"] = _mean(c["accuracy"] for c in summary["per_category"].values())


def _proactive_timing(summary: dict, labelled: Sequence[BenchmarkQuestion], results: Mapping[str, Mapping]) -> None:
    """StreamingBench proactive output: also the share answered on time (count.py's
    time_accuracy); missing samples count as late."""
    for task, tally in summary["per_task"].items():
        proactive = [q for q in labelled if q.task == task and q.kind == KIND_PROACTIVE]
        if proactive:
            on_time = sum(1 for q in proactive if results.get(q.qid, {}).get("time_correct"))
            tally["time_accuracy"] = on_time / len(proactive)
