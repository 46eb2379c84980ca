"""The eval runner end to end on tiny synthetic benchmarks with the builtin tiny model.

The model is random, so replies are noise; what is checked is the protocol (no future frames,
time order, polling), the result files, resume after a crash or a limited run, coverage of
missing videos, and that scripted replies are scored by both parsers.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
from pathlib import Path

import cv2
import pytest

from hermes.config import build_config
from hermes.datasets.cli import add_eval_parser
from hermes.datasets.runner import FutureFrameError, run_eval
from hermes.errors import HermesError, SourceError, UsageError
from hermes.pipelines.session import StreamingSession
from hermes.pipelines.synthetic import make_frame, write_synthetic_video

FIXTURES = Path(__file__).parent / "fixtures"
FPS = 2.0  # sampling rate of every run here: frames at 0, 0.5, 1.0, ...
VIDEO_S = 4.0
SETTINGS = [f"stream.fps={FPS:g}", "stream.chunk_frames=4", "model.max_new_tokens=4"]

# OVO-Bench entries (official format) on two synthetic videos and one that is not on disk:
# backward (EPM, HLD, ASI), real-time (STU) and forward probes (REC, SSR).
OVO_ENTRIES = [
    {"id": 1, "task": "EPM", "video": "a.mp4", "realtime": 2.0, "question": "What moved first?",
     "options": ["red", "blue", "green", "white"], "gt": 0, "answer": "red"},
    {"id": 2, "task": "STU", "video": "a.mp4", "realtime": 3.0, "question": "What is on screen?",
     "options": ["circle", "square"], "gt": 1, "answer": "square"},
    {"id": 3, "task": "REC", "video": "a.mp4", "activity": "move", "start_times": [0], "end_times": [1],
     "test_info": [{"realtime": 1.0, "count": 1}, {"realtime": 3.5, "count": 2}]},
    {"id": 4, "task": "SSR", "video": "b.mp4", "test_info": [{"realtime": 2.5, "step": "erase", "type": 0},
                                                             {"realtime": 1.5, "step": "draw", "type": 1}]},
    {"id": 5, "task": "HLD", "video": "b.mp4", "realtime": 3.2, "question": "Which one?",
     "options": ["a", "b", "c", "d"], "gt": 2, "answer": "c"},
    {"id": 6, "task": "ASI", "video": "gone.mp4", "realtime": 1.0, "question": "Which?",
     "options": ["a", "b"], "gt": 1, "answer": "b"},
]


def frames_before(t_s: float, fps: float = FPS, duration_s: float = VIDEO_S) -> int:
    """Frames a question at t_s may see: those sampled strictly before it."""
    return min(math.ceil(t_s * fps - 1e-9), int(duration_s * fps))


def read_samples(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


def replies(folder: Path) -> dict[str, str | None]:
    return {s["qid"]: s["reply"] for s in read_samples(folder)}


@pytest.fixture(scope="module")
def ovo_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ovo")
    for name, seed in (("a.mp4", 1), ("b.mp4", 2)):
        write_synthetic_video(root / "src_videos" / name, duration_s=VIDEO_S, fps=4.0, size=(64, 48), seed=seed)
    (root / "ovo_bench_new.json").write_text(json.dumps(OVO_ENTRIES))
    return root


@pytest.fixture(scope="module")
def cfg():
    return build_config(model="tiny-llava-onevision", overrides=SETTINGS)


@pytest.fixture(scope="module")
def reference(ovo_root, cfg, tiny_model, tmp_path_factory):
    """One uninterrupted run: (output folder, summary)."""
    out = tmp_path_factory.mktemp("reference")
    return out, run_eval("ovo-bench", ovo_root, cfg, output_dir=out, model=tiny_model, protocol="strict",
                         progress=False)


def comparable(summary: dict) -> dict:
    """What must not change between an uninterrupted run and an interrupted-and-resumed one."""
    return {k: summary[k] for k in ("benchmark", "accuracy", "coverage", "config", "metric", "protocol")}


def test_streaming_run_writes_results_and_sees_no_future_frames(reference, cfg):
    out, summary = reference
    assert {p.name for p in out.iterdir()} >= {"samples.jsonl", "summary.json", "report.md", "run.json"}
    samples = read_samples(out)
    assert len(samples) == 7  # 8 questions, 1 on the missing video
    for s in samples:
        assert s["at_s"] == s["t_s"]
        assert s["frames_seen"] == frames_before(s["t_s"])
        assert s["last_frame_t_s"] < s["t_s"]
        assert {"parsed_official", "parsed_strict", "official", "strict", "ttft_ms", "memory"} <= set(s)
    per_video = {}
    for s in samples:  # one stream per video: time and frames only move forward
        per_video.setdefault(s["video_id"], []).append((s["t_s"], s["frames_seen"]))
    assert all(seq == sorted(seq) for seq in per_video.values())
    assert per_video["b.mp4"][0] == (1.5, 3)  # SSR probes are asked in time order, not file order

    assert summary == json.loads((out / "summary.json").read_text())
    assert set(summary["accuracy"]) == {"official", "strict"}
    assert set(summary["accuracy"]["official"]["per_task"]) == {"EPM", "STU", "REC", "SSR", "HLD", "ASI"}
    cov = summary["coverage"]
    assert (cov["questions_expected"], cov["questions_answered"], cov["questions_missing"]) == (8, 7, 1)
    assert cov["missing_videos"] == ["gone.mp4"] and cov["videos_expected"] == 3
    assert summary["accuracy"]["official"]["per_task"]["ASI"]["answered"] == 0  # in the denominator
    assert set(summary["cost"]["ttft_ms"]) >= {"p50", "p90", "p99"}
    assert summary["cost"]["frames_seen"]["max"] == 7
    assert summary["config"] == json.loads(json.dumps(cfg.to_dict()))
    assert {"torch", "transformers", "hermes"} <= set(summary["environment"]["versions"])
    report = (out / "report.md").read_text()
    assert "| EPM |" in report and "not on disk: gone.mp4" in report and "p99" in report


class Crash(Exception):
    """Stands in for a crash or Ctrl-C in the middle of a run."""


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_results(reference, ovo_root, cfg, tiny_model, tmp_path, monkeypatch):
    ref_out, ref_summary = reference
    original = StreamingSession.ask
    calls = itertools.count()

    def crashing_ask(self, *args, **kwargs):
        if next(calls) == 2:  # the third question of the first video
            raise Crash
        return original(self, *args, **kwargs)

    monkeypatch.setattr(StreamingSession, "ask", crashing_ask)
    with pytest.raises(Crash):
        run_eval("ovo-bench", ovo_root, cfg, output_dir=tmp_path, model=tiny_model, protocol="strict", progress=False)
    monkeypatch.setattr(StreamingSession, "ask", original)
    assert len(read_samples(tmp_path)) == 2
    with (tmp_path / "samples.jsonl").open("a") as f:
        f.write('{"qid": "ovo-2", "reply": "tor')  # a line torn by the crash

    summary = run_eval("ovo-bench", ovo_root, cfg, output_dir=tmp_path, model=tiny_model, protocol="strict",
                       progress=False,
                       resume=True)
    assert replies(tmp_path) == replies(ref_out)
    assert len(read_samples(tmp_path)) == 7  # every line valid, no qid twice
    assert comparable(summary) == comparable(ref_summary)
    assert summary["resume"]["samples_reused"] == 2
    assert summary["resume"]["torn_bytes_dropped"] > 0
    assert summary["resume"]["replay_mismatches"] == 0  # the replayed stream answered the same


@pytest.mark.slow
def test_limited_run_then_resume_equals_one_full_run(reference, ovo_root, cfg, tiny_model, tmp_path):
    ref_out, ref_summary = reference
    first = run_eval("ovo-bench", ovo_root, cfg, output_dir=tmp_path, model=tiny_model, protocol="strict",
                     progress=False, limit=1)
    assert first["coverage"]["questions_expected"] == 4  # the first video only
    summary = run_eval("ovo-bench", ovo_root, cfg, output_dir=tmp_path, model=tiny_model, protocol="strict",
                       progress=False,
                       resume=True)
    assert replies(tmp_path) == replies(ref_out)
    assert comparable(summary) == comparable(ref_summary)
    assert summary["resume"]["samples_reused"] == 4


def test_output_folder_guards(reference, ovo_root, cfg, tiny_model):
    out, _ = reference
    with pytest.raises(UsageError, match="--resume"):
        run_eval("ovo-bench", ovo_root, cfg, output_dir=out, model=tiny_model, protocol="strict", progress=False)
    other = build_config(model="tiny-llava-onevision", overrides=[*SETTINGS, "stream.fps=1"])
    with pytest.raises(UsageError, match="different config.stream.fps"):
        run_eval("ovo-bench", ovo_root, other, output_dir=out, model=tiny_model, protocol="strict",
                 progress=False, resume=True)


def test_strict_videos_fails_on_a_missing_video_in_one_line(ovo_root, cfg, tiny_model, tmp_path):
    with pytest.raises(SourceError) as info:
        run_eval("ovo-bench", ovo_root, cfg, output_dir=tmp_path, model=tiny_model, protocol="strict",
                 strict_videos=True)
    assert "gone.mp4" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "samples.jsonl").exists()


def script_replies(monkeypatch, reply_for):
    """Run the real session (frames, timing, memory) but replace each reply by reply_for(prompt, at)."""
    original = StreamingSession.ask

    def ask(self, question, options=(), at=None, answer_prefix="", query=None):
        answer = original(self, question, options, at, query=query)
        answer.answer = reply_for(question, at)
        return answer

    monkeypatch.setattr(StreamingSession, "ask", ask)


def test_replies_are_scored_by_the_official_and_the_strict_parser(ovo_root, cfg, tiny_model, tmp_path, monkeypatch):
    scripted = {"What moved first?": "The answer is A.", "What is on screen?": "B", "Which one?": "D"}

    def reply_for(prompt, at):
        return next((r for q, r in scripted.items() if q in prompt), "Yes" if "draw" in prompt else "2")

    script_replies(monkeypatch, reply_for)
    summary = run_eval("ovo-bench", ovo_root, cfg, output_dir=tmp_path, model=tiny_model, protocol="strict",
                       progress=False,
                       tasks="EPM,STU,HLD,SSR,REC")
    verdicts = {s["qid"]: (s["official"], s["strict"]) for s in read_samples(tmp_path)}
    assert verdicts["ovo-1"] == (True, False)  # OVO credits a reply containing the letter; strict does not
    assert verdicts["ovo-2"] == (True, True)
    assert verdicts["ovo-5"] == (False, False)
    assert verdicts["ovo-4-1"] == (True, True) and verdicts["ovo-4-0"] == (False, False)  # "Yes" to "draw" only
    assert verdicts["ovo-3-1"] == (True, True) and verdicts["ovo-3-0"] == (False, False)  # count 2 at 3.5 s
    per_task = summary["accuracy"]["official"]["per_task"]
    assert per_task["EPM"]["accuracy"] == 1.0 and summary["accuracy"]["strict"]["per_task"]["EPM"]["accuracy"] == 0
    assert summary["accuracy"]["official"]["per_category"]["realtime"]["accuracy"] == 1.0


def test_the_session_gets_the_bare_question_beside_the_prompt(ovo_root, cfg, tiny_model, tmp_path, monkeypatch):
    """Memory retrieves with the benchmark's bare question (`query`), the model reads the whole prompt."""
    original, asked = StreamingSession.ask, []

    def ask(self, question, options=(), at=None, answer_prefix="", query=None):
        asked.append((question, query))
        return original(self, question, options, at, answer_prefix, query=query)

    monkeypatch.setattr(StreamingSession, "ask", ask)
    run_eval("ovo-bench", ovo_root, cfg, output_dir=tmp_path, model=tiny_model, protocol="strict", progress=False)
    assert asked and all(query and query in prompt and query != prompt for prompt, query in asked)
    assert "What moved first?" in {query for _, query in asked}


def test_an_answer_that_saw_the_future_stops_the_run(ovo_root, cfg, tiny_model, tmp_path, monkeypatch):
    original = StreamingSession.ask

    def leaky_ask(self, question, options=(), at=None, answer_prefix="", query=None):
        answer = original(self, question, options, at)
        answer.last_frame_t_s = at  # as if the frame at the question's own time had been encoded
        return answer

    monkeypatch.setattr(StreamingSession, "ask", leaky_ask)
    with pytest.raises(FutureFrameError, match="question at 1s was answered from a frame at 1s"):
        run_eval("ovo-bench", ovo_root, cfg, output_dir=tmp_path, model=tiny_model, protocol="strict", progress=False)
    assert not (tmp_path / "samples.jsonl").read_text()  # nothing recorded from a broken stream


def test_streamingbench_proactive_polls_every_second_until_yes(cfg, tiny_model, tmp_path, monkeypatch):
    root = tmp_path / "sb"
    write_synthetic_video(root / "videos" / "p.mp4", duration_s=8.0, fps=4.0, size=(64, 48))
    segment = {"time": "[0:00:00 - 0:00:08]", "video_path": "./videos/p.mp4", "questions": [
        {"task_type": "Proactive Output", "question": "When a shape appears, output \"shape\".",
         "time_stamp": "00:00:01", "ground_truth_time_stamp": "00:00:03", "ground_truth_output": "shape"},
        {"task_type": "Proactive Output", "question": "When it ends, output \"end\".",
         "time_stamp": "00:00:01", "ground_truth_time_stamp": "00:00:02", "ground_truth_output": "end"}]}
    (root / "questions_proactive.json").write_text(json.dumps([segment]))

    def reply_for(prompt, at):
        if "right time" in prompt:
            return "Yes." if "shape" in prompt and at >= 4.0 else "No."
        return "shape"

    script_replies(monkeypatch, reply_for)
    summary = run_eval("streamingbench", root, cfg, output_dir=tmp_path / "out", model=tiny_model,
                       protocol="strict", progress=False)
    samples = {s["reference"]: s for s in read_samples(tmp_path / "out")}
    shape, end = samples["shape"], samples["end"]
    assert [p["at_s"] for p in shape["polls"]] == [2.0, 3.0, 4.0]  # from 1 s after the question
    assert shape["answered_at_s"] == 4.0 and shape["reply"] == "shape" and shape["time_correct"]
    assert shape["official"] and shape["frames_seen"] == frames_before(4.0, duration_s=8.0)
    assert [p["at_s"] for p in end["polls"]] == [2.0, 3.0, 4.0, 5.0, 6.0]  # up to 4 s after the truth
    assert end["answered_at_s"] is None and end["reply"] is None and not end["official"]
    assert all(p["last_frame_t_s"] < p["at_s"] for s in (shape, end) for p in s["polls"])
    assert summary["accuracy"]["official"]["per_task"]["Proactive Output"]["time_accuracy"] == 0.5


@pytest.mark.slow
def test_offline_videomme_encodes_whole_videos_and_counts_a_missing_one(cfg, tiny_model, tmp_path):
    root = tmp_path / "videomme"
    shutil.copytree(FIXTURES / "videomme", root)
    for placeholder in (root / "data").iterdir():
        placeholder.unlink()
    write_synthetic_video(root / "data" / "fFjv93ACGo8.mp4", duration_s=3.0, fps=4.0, size=(64, 48))
    write_synthetic_video(root / "data" / "tmp.mp4", duration_s=2.0, fps=4.0, size=(64, 48), seed=3)
    (root / "data" / "tmp.mp4").rename(root / "data" / "Zw2sLmmS1NM.MP4")  # the archive's odd extension
    summary = run_eval("videomme", root, cfg, output_dir=tmp_path / "out", model=tiny_model, protocol="strict",
                       progress=False)
    samples = read_samples(tmp_path / "out")
    assert {s["video_id"]: s["frames_seen"] for s in samples} == {"fFjv93ACGo8": 6, "Zw2sLmmS1NM": 4}
    assert all(s["at_s"] is None and s["prompt"]["user"].endswith("The best answer is:") for s in samples)
    assert summary["protocol"] == "offline"
    assert summary["coverage"]["missing_videos"] == ["xxLong601ab"]
    assert "long" in summary["accuracy"]["official"]["per_category"]


@pytest.mark.slow
def test_offline_mvbench_windows_and_frame_folders(tiny_model, tmp_path):
    root = tmp_path / "mvbench"
    shutil.copytree(FIXTURES / "mvbench", root)
    for placeholder in [p for p in (root / "video").rglob("*") if p.is_file()]:
        placeholder.unlink()
    write_synthetic_video(root / "video/star/Charades_v1_480/3MSZA.mp4", duration_s=20.0, fps=2.0, size=(64, 48))
    frames = root / "video/tvqa/frames_fps3_hq/s01e02_seg02_clip_03"
    frames.mkdir(parents=True, exist_ok=True)
    for i in range(36):  # 12 s at 3 fps, the official frame rate of these folders
        cv2.imwrite(str(frames / f"{i + 1:05d}.jpg"), make_frame(i / 3, (32, 24))[:, :, ::-1])
    cfg = build_config(model="tiny-llava-onevision", overrides=["stream.fps=1", "model.max_new_tokens=3"])
    summary = run_eval("mvbench", root, cfg, output_dir=tmp_path / "out", model=tiny_model, protocol="strict",
                       progress=False)
    seen = {s["qid"]: (s["frames_seen"], s["last_frame_t_s"]) for s in read_samples(tmp_path / "out")}
    assert seen["mvbench-action_sequence-0"] == (9, 19.0)  # 11.1 .. 19.6 at 1 fps
    assert seen["mvbench-action_sequence-1"] == (9, 8.0)  # 0 .. 8.5
    assert seen["mvbench-episodic_reasoning-0"] == (8, 9.0)  # frames 2 .. 9 s of the folder
    assert summary["coverage"]["questions_missing"] == 1  # fine-grained pose: no video


def run_cli(*argv: str) -> int:
    """Parse and run `eval` as the hermes-video entry point does; its exit code."""
    parser = argparse.ArgumentParser(prog="hermes-video")
    add_eval_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["eval", *argv])
    try:
        return args.func(args)
    except HermesError as exc:
        assert "\n" not in str(exc)
        return exc.exit_code


def test_cli_eval(ovo_root, tmp_path, capsys):
    base = ["ovo-bench", "--data-root", str(ovo_root), "--output", str(tmp_path / "out"), "--quiet"]
    assert run_cli(*base, "--model", "tiny-llava-onevision", *[a for s in SETTINGS for a in ("--set", s)],
                   "--tasks", "EPM", "STU", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["coverage"]["questions_expected"] == 2
    assert run_cli(*base, "--strict-videos") == 3  # gone.mp4
    assert run_cli("ovo-bnch", "--data-root", str(ovo_root)) == 2  # unknown benchmark
    assert run_cli(*base, "--tasks", "EMP") == 2  # unknown task



def test_cli_eval_limits_questions_as_lmms_eval_does_and_says_which_limit(ovo_root, tmp_path, capsys):
    """--limit counts videos (a.mp4 holds 4 questions); --limit-questions counts questions, and the summary
    line names the cut that made its denominator."""
    settings = [a for s in SETTINGS for a in ("--set", s)]
    base = ["ovo-bench", "--data-root", str(ovo_root), "--model", "tiny-llava-onevision", *settings, "--quiet"]
    assert run_cli(*base, "--output", str(tmp_path / "q"), "--limit-questions", "3") == 0
    headline = capsys.readouterr().out
    assert "(3/3 questions answered; limited to the first 3 questions (--limit-questions))" in headline, headline
    samples = read_samples(tmp_path / "q")
    assert sorted(s["qid"] for s in samples) == ["ovo-1", "ovo-2", "ovo-3-0"]  # entries 1, 2, 3's first probe
    assert json.loads((tmp_path / "q" / "summary.json").read_text())["limit"] == {"videos": None, "questions": 3}
    assert run_cli(*base, "--output", str(tmp_path / "v"), "--limit", "1") == 0
    assert "(4/4 questions answered; limited to the first video (--limit))" in capsys.readouterr().out
    assert run_cli(*base, "--output", str(tmp_path / "z"), "--limit-questions", "0") == 2


@pytest.mark.slow
def test_ovo_official_protocol_feeds_the_clip_up_to_ceil_t(ovo_root, cfg, tiny_model, tmp_path):
    summary = run_eval("ovo-bench", ovo_root, cfg, output_dir=tmp_path, model=tiny_model, progress=False)
    assert summary["protocol_variant"] == "official" and summary["settings"]["protocol_variant"] == "official"
    assert summary["settings"]["fps"] == FPS and summary["settings"]["pixels_per_frame"] == tiny_model.image_size ** 2
    for s in read_samples(tmp_path):
        # frames up to and including ceil(t) (HLD at 3.2 s sees the frame at 4.0 s); never beyond
        assert s["last_frame_t_s"] == min(math.ceil(s["t_s"]), VIDEO_S - 1 / FPS)
        assert s["frames_seen"] == min(int(math.ceil(s["t_s"]) * FPS) + 1, int(VIDEO_S * FPS))


@pytest.mark.slow
def test_streamingbench_official_protocol_answers_from_the_last_60_s(cfg, tiny_model, tmp_path):
    root = tmp_path / "sb"
    write_synthetic_video(root / "videos" / "long.mp4", duration_s=70.0, fps=1.0, size=(32, 24))
    segment = {"time": "[0:00:00 - 0:01:10]", "video_path": "./videos/long.mp4", "questions": [
        {"task_type": "Object Perception", "question": "What?", "time_stamp": "00:00:10", "answer": "A",
         "options": ["A. x", "B. y", "C. z", "D. w"]},
        {"task_type": "Object Perception", "question": "What now?", "time_stamp": "00:01:05", "answer": "B",
         "options": ["A. x", "B. y", "C. z", "D. w"]}]}
    (root / "questions_real.json").write_text(json.dumps([segment]))
    one_fps = build_config(model="tiny-llava-onevision", overrides=["stream.fps=1", "stream.chunk_frames=16",
                                                                    "model.max_new_tokens=2"])
    for variant, expected in (("official", {10.0: 10, 65.0: 60}), ("strict", {10.0: 10, 65.0: 65})):
        run_eval("streamingbench", root, one_fps, output_dir=tmp_path / variant, model=tiny_model,
                 protocol=variant, progress=False)
        assert {s["t_s"]: s["frames_seen"] for s in read_samples(tmp_path / variant)} == expected


@pytest.mark.slow
def test_shards_merge_to_the_single_run(reference, ovo_root, cfg, tiny_model, tmp_path, monkeypatch):
    from hermes.datasets.runner import merge_shards
    from hermes.datasets.shards import Shard

    parts = []
    for i in (1, 2):
        part = tmp_path / f"part{i}"
        run_eval("ovo-bench", ovo_root, cfg, output_dir=part, model=tiny_model, protocol="strict",
                 progress=False, shard=Shard(i, 2))
        parts.append(str(part))
    shard_videos = [{s["video_id"] for s in read_samples(Path(p))} for p in parts]
    assert shard_videos == [{"a.mp4"}, {"b.mp4"}]  # every 2nd video from the i-th (gone.mp4 has no samples)

    def no_model(*args, **kwargs):
        raise AssertionError("merge must not load a model")

    monkeypatch.setattr("hermes.models.loading.load_model", no_model)
    merged = merge_shards(parts, str(tmp_path / "merged"), str(ovo_root))
    _, whole = reference
    assert comparable(merged) == comparable(whole)
    with pytest.raises(UsageError, match="shards 1/2 .. 2/2 once each"):
        merge_shards(parts[:1], str(tmp_path / "merged2"), str(ovo_root))


@pytest.mark.slow
def test_shards_of_a_limited_run_merge_to_that_limited_run(ovo_root, cfg, tiny_model, tmp_path):
    """`--limit` is part of the run the shards split: the merge scores the same first videos, not all."""
    from hermes.datasets.runner import merge_shards
    from hermes.datasets.shards import Shard

    whole = run_eval("ovo-bench", ovo_root, cfg, output_dir=tmp_path / "whole", model=tiny_model, protocol="strict",
                     progress=False, limit=1)
    assert whole["coverage"]["questions_expected"] == 4  # the first video only
    parts = [str(tmp_path / f"part{i}") for i in (1, 2)]
    for i, part in enumerate(parts, start=1):
        run_eval("ovo-bench", ovo_root, cfg, output_dir=part, model=tiny_model, protocol="strict", progress=False,
                 limit=1, shard=Shard(i, 2))
    merged = merge_shards(parts, str(tmp_path / "merged"), str(ovo_root))
    assert merged["coverage"] == whole["coverage"]
    assert comparable(merged) == comparable(whole)


def test_finished_resume_does_not_load_the_model(reference, ovo_root, cfg, tmp_path, monkeypatch):
    out, whole = reference
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)

    def no_model(*args, **kwargs):
        raise AssertionError("nothing is left to run: the model must not load")

    monkeypatch.setattr("hermes.models.loading.load_model", no_model)
    resumed = run_eval("ovo-bench", ovo_root, cfg, output_dir=copy, resume=True, protocol="strict", progress=False)
    assert comparable(resumed) == comparable(whole)


@pytest.mark.parametrize("memory", ["recent-frames", "rekv"])
def test_baselines_run_a_benchmark_and_keep_the_protocol(memory, ovo_root, tiny_model, tmp_path):
    cfg = build_config(model="tiny-llava-onevision", memory=memory, overrides=SETTINGS)
    summary = run_eval("ovo-bench", ovo_root, cfg, output_dir=tmp_path, model=tiny_model, protocol="strict",
                       progress=False)
    assert summary["config"]["memory"]["policy"] == memory and summary["coverage"]["questions_answered"] == 7
    assert all(s["last_frame_t_s"] < s["t_s"] for s in read_samples(tmp_path))
