"""Aggregating per-sample verdicts into the scores each benchmark defines.

Input: the questions that were meant to be answered (the denominator) and the per-sample
results by `qid`, each a mapping with a boolean verdict under `key` ("official" or "strict",
as `parsing.score_reply` writes them; "judge_correct" for open-ended benchmarks). A question
with no result is *missing*: it stays in the denominator and counts as wrong, and the summary
reports coverage, so a partial run can never look better than it is. A question without a
reference answer (EgoSchema outside its public subset, an MLVU item whose answer matches no
candidate) is *unlabelled*: reported, not scored.

Aggregation: accuracy per task and overall (micro) for every benchmark; the benchmark's hooks
(`Benchmark.categories`, `Benchmark.add_metrics`, in its module) add what its official metric
defines: OVO-Bench's macro average, StreamingBench's proactive `time_accuracy`, Video-MME's
`leaderboard`, MLVU's M-Avg, the duration or question-type breakdowns. The "judge" metric
(open-ended, RVS) is shared: share judged correct over every question (ours), and ReKV's
eval_open_ended.py definitions, the official ones: `rekv_accuracy` = yes / (yes + no) over
judged replies and `rekv_mean_score`, the mean integer score over every reply ReKV keeps (one
that says neither yes nor no included; see `judge.parse_judge_reply`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from . import registry
from .benchmark import Benchmark, mean
from .records import BenchmarkQuestion, VideoRecord


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


def summarize(
    metric: str,
    questions: Iterable[BenchmarkQuestion],
    results: Mapping[str, Mapping],
    key: str = "official",
) -> dict:
    """Aggregate per-sample verdicts as the benchmark defines.

    Args:
        metric: A benchmark's `metric` (the registry gives each benchmark's).
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
        UsageError: For a metric no benchmark uses.
    """
    hooks = registry.by_metric(metric)
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
    if type(hooks).categories is not Benchmark.categories:  # the benchmark breaks accuracy down by category
        summary["per_category"] = _by_label(labelled, hooks.categories, results, key)
    hooks.add_metrics(summary, labelled, results, key)
    if metric == "judge":
        judged = [results[q.qid] for q in labelled if q.qid in results and results[q.qid].get(key) is not None]
        scores = [r.get("judge_score") for r in judged if r.get("judge_score") is not None]
        summary["mean_score"] = mean(float(s) for s in scores)
        summary["rekv_accuracy"] = sum(1 for r in judged if r[key]) / len(judged) if judged else None
        # ReKV averages the int score of every reply it kept, those that say neither yes nor no included
        kept = [results[q.qid]["judge_score"] for q in labelled if results.get(q.qid, {}).get("judge_score") is not None]
        summary["rekv_mean_score"] = mean(float(int(s)) for s in kept)
        summary["official_definition"] = "rekv_accuracy"
    return summary
