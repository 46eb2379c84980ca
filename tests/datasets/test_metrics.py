"""Aggregation golden values, computed by hand in the comments next to each assertion."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes.datasets.benchmarks import lvbench, mlvu, ovo_bench, rvs, streamingbench, videomme
from hermes.datasets.metrics import questions_of, summarize
from hermes.datasets.records import BenchmarkQuestion
from hermes.errors import UsageError

FIXTURES = Path(__file__).parent / "fixtures"


def verdicts(by_qid: dict) -> dict:
    """{qid: {"official": verdict}} from {qid: verdict}."""
    return {qid: {"official": v} for qid, v in by_qid.items()}


def test_ovo_macro_average_over_tasks_then_categories():
    questions = questions_of(ovo_bench.load(FIXTURES / "ovo_bench"))
    results = verdicts({
        "ovo-1558-0": True, "ovo-1558-1": False,  # REC 1/2
        "ovo-1210": True,  # ACR 1/1
        "ovo-0": True,  # EPM 1/1; HLD (ovo-297) missing: 0/1
        "ovo-1516-1": True, "ovo-1516-0": True,  # SSR 2/2
        "ovo-1468-0": False,  # CRR 0/2, ovo-1468-1 missing
    })
    s = summarize("ovo", questions, results)
    assert {t: v["accuracy"] for t, v in s["per_task"].items()} == {
        "REC": 0.5, "ACR": 1.0, "EPM": 1.0, "HLD": 0.0, "SSR": 1.0, "CRR": 0.0,
    }
    # backward (EPM 1, HLD 0) = 0.5; realtime (ACR 1) = 1.0; forward (REC .5, SSR 1, CRR 0) = 0.5
    assert {c: v["accuracy"] for c, v in s["per_category"].items()} == pytest.approx(
        {"forward": 0.5, "realtime": 1.0, "backward": 0.5}
    )
    assert s["per_category"]["forward"]["tasks"] == ["CRR", "REC", "SSR"]
    assert s["overall"] == pytest.approx(2 / 3)  # (0.5 + 1.0 + 0.5) / 3
    assert s["coverage"] == {
        "expected": 9, "answered": 7, "scored": 7, "missing": 2, "unlabelled": 0, "fraction": 7 / 9,
    }


def test_default_accuracy_counts_missing_as_wrong_and_skips_unlabelled():
    def q(qid, task, answer="x"):
        return BenchmarkQuestion("?", ["x", "y"], answer, 0 if answer else None, None, task, {}, qid, {"kind": "mc"})

    questions = [q("1", "X"), q("2", "X"), q("3", "Y"), q("4", "Z", answer=None)]
    results = {"1": {"official": True}, "3": {"official": True}, "4": {"official": False}}
    s = summarize("accuracy", questions, results)
    assert s["overall"] == pytest.approx(2 / 3)  # 2 correct of 3 labelled; question 2 missing
    assert s["per_task"]["X"] == {
        "expected": 2, "answered": 1, "scored": 1, "correct": 1, "accuracy": 0.5, "accuracy_answered": 1.0,
    }
    assert s["per_task"]["Y"]["accuracy"] == 1.0
    assert "Z" not in s["per_task"]
    assert s["coverage"] == {
        "expected": 3, "answered": 2, "scored": 2, "missing": 1, "unlabelled": 1, "fraction": 2 / 3,
    }
    assert "per_category" not in s


def test_strict_key_is_aggregated_separately():
    questions = questions_of(videomme.load(FIXTURES / "videomme"))
    results = {
        "videomme-001-1": {"official": True, "strict": False},
        "videomme-001-2": {"official": True, "strict": True},
        "videomme-301-1": {"official": False, "strict": False},
        "videomme-601-1": {"official": True, "strict": True},
    }
    assert summarize("videomme", questions, results)["overall"] == 0.75  # 3 / 4
    assert summarize("videomme", questions, results, key="strict")["overall"] == 0.5  # 2 / 4


def test_videomme_per_duration_bucket():
    questions = questions_of(videomme.load(FIXTURES / "videomme"))
    results = verdicts({"videomme-001-1": True, "videomme-001-2": False, "videomme-301-1": True})  # 601-1 missing
    s = summarize("videomme", questions, results)
    # short 1/2, medium 1/1, long 0/1 (missing); overall 2/4
    assert {d: v["accuracy"] for d, v in s["per_category"].items()} == {"short": 0.5, "medium": 1.0, "long": 0.0}
    assert s["overall"] == 0.5
    assert s["coverage"]["missing"] == 1


def test_mlvu_micro_and_m_avg():
    questions = questions_of(mlvu.load(FIXTURES / "mlvu"))
    results = verdicts({"mlvu-1_plotQA-0": True, "mlvu-1_plotQA-1": True, "mlvu-4_count-0": False})
    s = summarize("mlvu", questions, results)
    assert s["overall"] == pytest.approx(2 / 3)  # micro: 2 of 3
    assert s["m_avg"] == 0.5  # mean of plotQA 1.0 and count 0.0


def test_lvbench_counts_a_question_toward_every_type():
    questions = questions_of(lvbench.load(FIXTURES / "lvbench"))
    results = verdicts({"lvbench-55": True, "lvbench-56": False, "lvbench-77": True})
    s = summarize("lvbench", questions, results)
    assert {t: v["accuracy"] for t, v in s["per_category"].items()} == {
        "key information retrieval": 1.0, "reasoning": 0.0, "event understanding": 0.0, "entity recognition": 1.0,
    }
    assert s["per_category"]["event understanding"]["expected"] == 1
    assert s["overall"] == pytest.approx(2 / 3)


def test_streamingbench_subsets_and_proactive_timing():
    questions = questions_of(streamingbench.load(FIXTURES / "streamingbench"))
    results = verdicts({
        "sb-real-sample_1_real-0": True, "sb-real-sample_1_real-2": True, "sb-real-sample_1_real-1": False,
        "sb-omni-sample_2_Source_Discrimination-0": True,
        "sb-sqa-sample_17_sqa-1": True,  # sqa-0 missing
    })
    results["sb-proactive-sample_17_proactive-0"] = {"official": False, "time_correct": True}
    s = summarize("streamingbench", questions, results)
    assert {t: v["accuracy"] for t, v in s["per_task"].items()} == {
        "Object Perception": 1.0, "Counting": 0.0, "Source Discrimination": 1.0,
        "Sequential Question Answering": 0.5, "Proactive Output": 0.0,
    }
    assert s["per_task"]["Proactive Output"]["time_accuracy"] == 1.0
    assert {c: v["accuracy"] for c, v in s["per_category"].items()} == pytest.approx(
        {"real": 2 / 3, "omni": 1.0, "sqa": 0.5, "proactive": 0.0}
    )
    assert s["overall"] == pytest.approx(4 / 7)


def test_judge_metric_for_open_ended():
    questions = questions_of(rvs.load(FIXTURES / "rvs"))
    results = {
        "rvs-ego-ego_1-1": {"judge_correct": True, "judge_score": 4},
        "rvs-ego-ego_1-0": {"judge_correct": False, "judge_score": 2},
    }
    s = summarize("judge", questions, results)
    assert s["overall"] == pytest.approx(1 / 3)  # the movie question is missing
    assert s["mean_score"] == 3.0
    assert s["key"] == "judge_correct"
    # Replies without a judge verdict: answered, not scored, no accuracy claimed.
    unjudged = summarize("judge", questions, {q.qid: {"reply": "..."} for q in questions})
    assert unjudged["overall"] is None and unjudged["mean_score"] is None
    assert unjudged["coverage"]["answered"] == 3 and unjudged["coverage"]["scored"] == 0


def test_nothing_answered_scores_zero_with_zero_coverage():
    questions = questions_of(ovo_bench.load(FIXTURES / "ovo_bench"))
    s = summarize("ovo", questions, {})
    assert s["overall"] == 0.0  # every question missing, so every question wrong
    assert s["coverage"]["fraction"] == 0.0 and s["coverage"]["missing"] == 9


def test_unknown_metric():
    with pytest.raises(UsageError, match="unknown metric"):
        summarize("f1", [], {})
