"""The rules for real official files (issue 16), on small files written here in each benchmark's
official format (from the formats' documentation; no benchmark data): a malformed field scoring
does not need is kept and flagged, one it needs excludes the question with a reason, only an
unreadable file is an error; every message names the file and the record."""

from __future__ import annotations

import argparse
import json

import pytest

from hermes.datasets.benchmarks import lvbench, mlvu, streamingbench
from hermes.datasets.cli import add_eval_parser
from hermes.datasets.common import annotations_only
from hermes.datasets.metrics import summarize
from hermes.datasets.records import KIND_MC, KIND_OPEN, BenchmarkQuestion
from hermes.errors import UsageError


def lvbench_line(key, qa):
    return json.dumps({"key": key, "type": "documentary", "video_info": {"duration_minutes": 60}, "qa": qa})


def lv_qa(uid, time_reference, answer="B"):
    return {"uid": uid, "question": "Which one?\n(A) red\n(B) blue\n(C) green\n(D) white", "answer": answer,
            "question_type": ["key information retrieval"], "time_reference": time_reference}


def test_lvbench_junk_time_reference_is_kept_and_flagged(tmp_path):
    lines = [lvbench_line("vidA", [lv_qa("1", "116:50-108:00"), lv_qa("2", "08:17-None"), lv_qa("3", "00:15-00:19")]),
             lvbench_line("vidB", [lv_qa("4", "00:01-00:02", answer="F")])]  # F names no option: excluded
    (tmp_path / "video_info.meta.jsonl").write_text("\n".join(lines) + "\n")
    with annotations_only():
        records = lvbench.load(tmp_path)
    assert [q.qid for r in records for q in r.questions] == ["lvbench-1", "lvbench-2", "lvbench-3"]
    spans = [q.meta["time_reference_s"] for q in records[0].questions]
    assert spans == [None, None, (15.0, 19.0)]
    issues = records.issues
    assert [(f["field"], f["value"]) for f in issues.flagged] == [("time_reference", "116:50-108:00"),
                                                                  ("time_reference", "08:17-None")]
    assert "video_info.meta.jsonl line 1" in issues.flagged[0]["where"] and "uid 1" in issues.flagged[0]["where"]
    assert "ends before it starts" in issues.flagged[0]["reason"]
    [excluded] = issues.excluded
    assert "line 2" in excluded["where"] and "uid 4" in excluded["where"] and "'F'" in excluded["reason"]
    summary = issues.to_json()
    assert (summary["flagged"], summary["excluded"]) == (2, 1)


def sb_segment(video, questions):
    return {"time": "[0:00:00 - 0:01:00]", "video_categories": "Sports", "video_path": video, "questions": questions}


def sb_question(time_stamp, options, answer="A", **extra):
    return {"task_type": "Object Perception", "question": "What is it?", "time_stamp": time_stamp,
            "answer": answer, "options": options, **extra}


FOUR = ["A. cat", "B. dog", "C. cow", "D. owl"]


def test_streamingbench_irregular_stamps_and_junk_candidates(tmp_path):
    real = [sb_segment("./videos/v1.mp4", [sb_question("00:12450", FOUR), sb_question("00:00:8", FOUR),
                                           sb_question("00:03:10", FOUR, answer="Q"),  # names no option
                                           {"task_type": "Object Perception", "question": "x", "answer": "A",
                                            "options": FOUR}])]  # no time_stamp: cannot be asked
    omni = [sb_segment("./videos/v2.mp4", [
        sb_question("00:00:05", ["A. cat", "", "B. dog", "C. cow", "", "D. owl"], answer="D"),  # empty ones
        sb_question("00:00:06", ["  A. cat ", "B. dog", "C. cow", "D. owl"]),  # padded
        sb_question("00:00:07", ["A. a", "B. b", "C. c", "D. d", "E. e", "F. f", "G. g"], answer="G"),
    ])]
    (tmp_path / "questions_real.json").write_text(json.dumps(real))
    (tmp_path / "questions_omni.json").write_text(json.dumps(omni))
    with annotations_only():
        records = streamingbench.load(tmp_path)
    by_qid = {q.qid: q for r in records for q in r.questions}
    # as the official scripts read them: every field a count of its unit
    assert by_qid["sb-real-v1-0"].t_s == 12450.0 and by_qid["sb-real-v1-1"].t_s == 8.0
    assert set(by_qid) == {"sb-real-v1-0", "sb-real-v1-1", "sb-omni-v2-0", "sb-omni-v2-1", "sb-omni-v2-2"}
    empty = by_qid["sb-omni-v2-0"]
    assert empty.options == ["cat", "dog", "cow", "owl"] and empty.answer == "owl"
    assert by_qid["sb-omni-v2-1"].options[0] == "cat"
    seven = by_qid["sb-omni-v2-2"]
    assert len(seven.options) == 7 and seven.gt_letter == "G"
    reasons = sorted(f["reason"] for f in records.issues.flagged)
    assert reasons == ["7 candidates where the template shows 4", "empty candidate dropped (the others carry their "
                       "letters)", "irregular time stamp read as 12450 s, as the official scripts do",
                       "padded candidate stripped"]
    excluded = records.issues.excluded
    assert [e["where"] for e in excluded] == ["questions_real.json segment 0 question 2 (video v1)",
                                              "questions_real.json segment 0 question 3 (video v1)"]
    assert "'Q'" in excluded[0]["reason"] and "'time_stamp'" in excluded[1]["reason"]


def test_mlvu_duplicate_gold_is_the_last_match_and_flagged(tmp_path):
    (tmp_path / "json").mkdir()
    items = [{"video": "m.mp4", "duration": 100, "question": "How many?", "candidates": ["Two", "Three", "Three"],
              "answer": "Three", "question_type": "count"},
             {"video": "m.mp4", "duration": 100, "question": "How many?", "candidates": ["Two", "Four"],
              "answer": "Five", "question_type": "count"}]
    (tmp_path / "json" / "4_count.json").write_text(json.dumps(items))
    with annotations_only():
        records = mlvu.load(tmp_path, tasks=["count"])
    [q] = records[0].questions
    assert q.gt_index == 2 and q.meta["ambiguous_gold"]
    assert records.issues.flagged[0]["where"] == "4_count.json item 0"
    assert records.issues.excluded[0]["where"] == "4_count.json item 1"


def test_an_unreadable_file_is_the_only_error_and_names_the_file(tmp_path):
    (tmp_path / "video_info.meta.jsonl").write_text(lvbench_line("a", [lv_qa("1", "")]) + "\n{not json\n")
    with annotations_only(), pytest.raises(UsageError, match=r"video_info.meta.jsonl:2 is not valid JSON"):
        lvbench.load(tmp_path)


def test_eval_check_reports_counts_without_videos_or_model(tmp_path, capsys):
    (tmp_path / "video_info.meta.jsonl").write_text(lvbench_line("a", [lv_qa("1", "08:17-None"), lv_qa("2", "")]))
    parser = argparse.ArgumentParser()
    add_eval_parser(parser.add_subparsers())
    args = parser.parse_args(["eval", "check", "lvbench", "--data-root", str(tmp_path), "--json"])
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["questions"], report["videos_on_disk"], report["flagged"], report["excluded"]) == (2, 0, 1, 0)


def mc(qid, task="t", gt=0):
    return BenchmarkQuestion("q", ["a", "b", "c", "d"], ["a", "b", "c", "d"][gt], gt, None, task, {}, qid,
                             {"kind": KIND_MC})


def test_videomme_reports_both_denominators_and_names_the_official_one():
    questions = [mc(f"q{i}") for i in range(4)]
    results = {"q0": {"official": True, "parsed_official": 0}, "q1": {"official": False, "parsed_official": 1},
               "q2": {"official": False, "parsed_official": None}}  # q3 missing
    s = summarize("videomme", questions, results)
    assert s["overall"] == 1 / 4  # every question (ours)
    assert s["leaderboard"]["overall"] == 1 / 2 and s["official_definition"] == "leaderboard"


def test_rvs_reports_rekv_accuracy_and_mean_score_beside_ours():
    questions = [BenchmarkQuestion("q", [], "ref", None, 1.0, "ego", {}, f"r{i}", {"kind": KIND_OPEN})
                 for i in range(4)]
    results = {"r0": {"judge_correct": True, "judge_score": 4}, "r1": {"judge_correct": False, "judge_score": 1},
               "r2": {"judge_correct": None, "judge_score": None}}  # unreadable verdict; r3 missing
    s = summarize("judge", questions, results)
    assert s["overall"] == 1 / 4
    assert s["rekv_accuracy"] == 1 / 2 and s["rekv_mean_score"] == 2.5 and s["official_definition"] == "rekv_accuracy"


def test_longvideobench_out_of_range_choice_excludes_only_that_question(tmp_path):
    from hermes.datasets.benchmarks import longvideobench

    def item(i, choice):
        return {"id": f"q{i}", "video_id": "v", "video_path": "v.mp4", "duration": 30, "question": "Which?",
                "candidates": ["a", "b"], "correct_choice": choice, "question_category": "S2E",
                "duration_group": 15}

    (tmp_path / "lvb_val.json").write_text(json.dumps([item(0, 1), item(1, 5)]))
    with annotations_only():
        records = longvideobench.load(tmp_path)
    assert [q.qid for q in records[0].questions] == ["lvb-q0"]
    [excluded] = records.issues.excluded
    assert "item 1 (id q1)" in excluded["where"] and "out of range" in excluded["reason"]


def test_streamingbench_prompt_shows_the_first_four_items_as_the_official_template_does():
    from hermes.datasets.registry import build_prompt

    raw = ["A. cat", "B. dog", "the rest of the dog option", "C. cow", "D. owl"]
    q = BenchmarkQuestion("What is it?", ["cat", "dog", "the rest of the dog option", "cow", "owl"], "owl", 4, 3.0, "t",
                 {"options": raw}, "sb-1", {"kind": KIND_MC, "subset": "real"})
    user = build_prompt("streamingbench", q).user
    assert "A. cat\nB. dog\nthe rest of the dog option\nC. cow\n\nThe best option is:" in user
    assert "D. owl" not in user
