"""The synthetic streaming benchmark: seeded, loadable as OVO-Bench, and right by construction.

Answers are recomputed here from pixels (rendered, and decoded from the mp4 the loader points at),
never from the generator's own bookkeeping.
"""

import json
import math

import numpy as np
import pytest

from hermes.datasets.benchmarks import ovo_bench
from hermes.datasets import synthetic_bench as sb
from hermes.datasets.record_frames import open_record_frames

BACKGROUND = np.array(sb.BACKGROUND_RGB)


def object_pixels(frame: np.ndarray) -> np.ndarray:
    """(H, W) bool: pixels clearly away from the background (mp4 blurs edges a little)."""
    return np.abs(frame.astype(int) - BACKGROUND).sum(-1) > 90


def colour_of(frame: np.ndarray) -> str | None:
    """The palette colour nearest to the frame's object pixels (median), or None for an empty frame."""
    mask = object_pixels(frame)
    if mask.sum() < 20:
        return None
    rgb = np.median(frame[mask].astype(float), axis=0)
    return min(sb.COLOURS_RGB, key=lambda name: np.abs(rgb - np.array(sb.COLOURS_RGB[name])).sum())


def shape_of(frame: np.ndarray) -> str:
    """Circle, square or triangle from how much of its bounding box the object fills (pi/4, 1, 1/2)."""
    ys, xs = np.nonzero(object_pixels(frame))
    fill = len(xs) / ((xs.max() - xs.min() + 1) * (ys.max() - ys.min() + 1))
    return min({"circle": math.pi / 4, "square": 1.0, "triangle": 0.5}.items(), key=lambda kv: abs(kv[1] - fill))[0]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    sb.write_benchmark(root, seed=7, num_videos=3, duration_s=60, per_family=2)
    return root


def test_same_seed_same_benchmark_other_seed_differs(tmp_path, bench):
    again = sb.write_benchmark(tmp_path / "again", seed=7, num_videos=3, duration_s=60, per_family=2)
    other = sb.write_benchmark(tmp_path / "other", seed=8, num_videos=3, duration_s=60, per_family=2)
    for name in (sb.ANNOTATION_FILE, sb.META_FILE):
        assert (again / name).read_text() == (bench / name).read_text()
        assert (other / name).read_text() != (bench / name).read_text()
    same = [sb.render_frames(sb.random_timeline(np.random.default_rng([7, 0]), 60)) for _ in range(2)]
    np.testing.assert_array_equal(same[0], same[1])
    assert not np.array_equal(same[0], sb.render_frames(sb.random_timeline(np.random.default_rng([8, 0]), 60)))


def test_loads_as_ovo_bench_records(bench):
    records = ovo_bench.load(bench)
    assert [r.video_id for r in records] == ["synth_000.mp4", "synth_001.mp4", "synth_002.mp4"]
    for record in records:
        assert record.available
        assert [q.t_s for q in record.questions] == sorted(q.t_s for q in record.questions)
        families = [next(f for f in sb.FAMILIES if f"-{f}-" in q.qid) for q in record.questions]
        assert sorted(set(families)) == sorted(sb.FAMILIES)
        for q in record.questions:
            assert 0 < q.t_s < 60
            if q.task == "REC":
                assert q.gt_index is None and q.answer in {"1", "2", "3", "4"}
            else:
                assert q.task in {"ATR", "EPM", "ASI"}
                assert q.options == list(sb.COLOURS)  # one fixed order
                assert q.options[q.gt_index] == q.answer


def test_answers_match_the_pixels(bench):
    """Real-time answers from the decoded video; episodic and counting answers from the rendered frames."""
    meta = json.loads((bench / sb.META_FILE).read_text())
    for record in ovo_bench.load(bench):
        with open_record_frames(record, fps=1.0) as source:
            decoded = np.stack([f.rgb for f in source.frames])
        timeline = sb.Timeline(60, [sb.Appearance(**a) for a in meta["timelines"][record.video_id]])
        rendered = sb.render_frames(timeline)
        assert decoded.shape == rendered.shape == (60, 64, 64, 3)
        colours = [colour_of(f) for f in rendered]
        for q in record.questions:
            last = math.ceil(q.t_s) - 1  # the newest frame before the question
            seen = colours[: last + 1]
            onsets = [c for i, c in enumerate(seen) if c is not None and (i == 0 or seen[i - 1] != c)]
            if q.task == "ATR":
                assert q.answer == colour_of(decoded[last]) == colours[last]
            elif q.task in ("EPM", "ASI") and "object?" in q.question:  # the first / second / third object
                n = sb.ORDINALS.index(q.question.split()[4])
                assert q.answer == onsets[n]
            elif q.task == "EPM":  # "just before the <colour> <shape>": that object once, by its pixels
                named = q.question.removesuffix("?").split("before the ")[1]
                names = [f"{colours[i]} {shape_of(rendered[i])}" for i, c in enumerate(seen)
                         if c is not None and (i == 0 or seen[i - 1] != c)]
                assert names.count(named) == 1
                assert q.answer == onsets[names.index(named) - 1]
            elif q.task == "REC":
                colour = q.raw["activity"].split()[2]
                assert q.answer == str(onsets.count(colour))


def test_every_appearance_is_its_own_event():
    """Neighbours never share a colour and are apart by an empty frame, so counts and 'before' are well defined."""
    timeline = sb.random_timeline(np.random.default_rng(3), 600)
    apps = timeline.appearances
    assert len(apps) > 50
    assert all(a.colour != b.colour and b.start_s > a.end_s for a, b in zip(apps, apps[1:]))
    assert sum(a.colour == timeline.rare_colour for a in apps) in {1, 2, 3, 4}
    assert sb.render_frames(timeline, 1)[0].tolist() == np.full((64, 64, 3), sb.BACKGROUND_RGB).tolist()


def test_question_from_a_memory_subset_uses_only_those_frames():
    timeline = sb.make_timeline(np.random.default_rng(0), 60)
    first, second = timeline.appearances[:2]
    q = sb.make_question(np.random.default_rng(0), timeline, list(range(second.start_s, 40)), "episodic_first", 40.5)
    assert q.answer == second.colour != first.colour


# ---- the suite: every length, episodic questions balanced over depth ------------------------------


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """Every set of the suite, at the shipped seed, a few streams each (a 1,800 s stream writes in about a second)."""
    base = tmp_path_factory.mktemp("suite")
    counts = {"short": 3, "long": 2, "long600": 1, "long1800": 1, "long900": 1}
    return {name: sb.write_suite_set(base / name, name, num_videos=n) for name, n in counts.items()}


def suite_entries(root):
    return json.loads((root / sb.ANNOTATION_FILE).read_text()), json.loads((root / sb.META_FILE).read_text())


def test_suite_lengths_and_every_family_at_every_length(suite):
    assert {name: json.loads((root / sb.META_FILE).read_text())["duration_s"] for name, root in suite.items()} == \
        {"short": 20, "long": 180, "long600": 600, "long1800": 1800, "long900": 900}
    for name, root in suite.items():
        entries, meta = suite_entries(root)
        for video in meta["timelines"]:
            families = {e["family"] for e in entries if e["video"] == video}
            assert families == set(sb.FAMILIES), (name, video)


def test_suite_episodic_questions_are_balanced_over_depth(suite):
    """Per stream: one 'first object' question and one 'just before X' per depth 10 ... 90 %; on long
    streams X starts within 5 % of the question time of its nominal depth."""
    for name, root in suite.items():
        entries, meta = suite_entries(root)
        for video in meta["timelines"]:
            episodic = [e for e in entries if e["video"] == video and e["family"] == "episodic"]
            assert sorted(e["depth"] for e in episodic) == sorted(["first", "10", "20", "30", "40", "50", "60",
                                                                   "70", "80", "90"])
            for e in episodic:
                assert e["realtime"] >= 0.9 * meta["duration_s"]  # asked late: depth is a share of the stream
                if e["depth"] != "first" and meta["duration_s"] >= 180:
                    assert abs(100 * e["subject_s"] / e["realtime"] - int(e["depth"])) <= 5, e


def test_suite_answers_follow_from_the_timelines(suite):
    """Expected answers recomputed from the recorded world (objects seen before the question), not the planner."""
    for root in suite.values():
        entries, meta = suite_entries(root)
        for e in entries:
            apps = sorted(meta["timelines"][e["video"]], key=lambda a: a["start_s"])
            assert all(a["colour"] != b["colour"] and b["start_s"] > a["end_s"] for a, b in zip(apps, apps[1:]))
            if e["task"] == "REC":
                colour = e["activity"].split()[2]
                for probe in e["test_info"]:
                    assert probe["count"] == sum(a["colour"] == colour and a["start_s"] < probe["realtime"]
                                                 for a in apps)
                continue
            seen = [a for a in apps if a["start_s"] < e["realtime"]]
            if e["task"] == "ATR":
                now = math.ceil(e["realtime"]) - 1
                assert e["answer"] == next(a["colour"] for a in apps if a["start_s"] <= now < a["end_s"])
            elif e["question"].endswith("first object?"):
                assert e["answer"] == seen[0]["colour"] and e.get("subject_s", seen[0]["start_s"]) == seen[0]["start_s"]
            elif e["task"] == "ASI":
                n = sb.ORDINALS.index(e["question"].split()[4])
                assert e["answer"] == seen[n]["colour"]
            else:
                named = e["question"].removesuffix("?").split("before the ")[1]
                names = [f"{a['colour']} {a['shape']}" for a in seen]
                assert names.count(named) == 1  # a long stream repeats names: the generator renamed the others
                i = names.index(named)
                assert seen[i]["start_s"] == e["subject_s"] and seen[i]["end_s"] <= e["realtime"]
                assert e["answer"] == seen[i - 1]["colour"]
            assert e["options"][e["gt"]] == e["answer"]


def test_suite_short_set_answers_match_the_decoded_video(suite):
    """The renamed shapes are what the video shows: names and answers read back from the mp4's pixels."""
    root = suite["short"]
    for record in ovo_bench.load(root):
        with open_record_frames(record, fps=1.0) as source:
            decoded = np.stack([f.rgb for f in source.frames])
        colours = [colour_of(f) for f in decoded]
        for q in record.questions:
            if q.task != "EPM" or "just before" not in q.question:
                continue
            seen = colours[: math.ceil(q.t_s)]
            onsets = [i for i, c in enumerate(seen) if c is not None and (i == 0 or seen[i - 1] != c)]
            # the middle frame of each object: away from the mp4's blur at its first frame
            names = []
            for j, i in enumerate(onsets):
                end = next((k for k in range(i, len(seen)) if seen[k] != seen[i]), len(seen))
                names.append(f"{colours[i]} {shape_of(decoded[(i + end - 1) // 2])}")
            named = q.question.removesuffix("?").split("before the ")[1]
            assert names.count(named) == 1
            assert q.answer == colours[onsets[names.index(named) - 1]]


def test_suite_seed_flag_and_shipped_seed(tmp_path):
    shipped = sb.write_suite_set(tmp_path / "a", "short", num_videos=2)
    assert sb.main([str(tmp_path / "b"), "--suite", "short", "--videos", "2"]) == 0
    assert sb.main([str(tmp_path / "c"), "--suite", "short", "--videos", "2", "--seed", "5"]) == 0
    text = {k: (tmp_path / k / sb.ANNOTATION_FILE).read_text() for k in "abc"}
    assert text["a"] == text["b"] != text["c"]
    assert json.loads((tmp_path / "b" / sb.META_FILE).read_text())["seed"] == sb.SUITE_SEED
    assert shipped == tmp_path / "a"
    with pytest.raises(ValueError, match="unknown suite set"):
        sb.write_suite_set(tmp_path / "d", "hours")


# ---- issue 37's memory kinds: just after X, which of two came first, a rare colour in the last N s ----------


def window_s_of(question: str) -> int:
    """The window a "Did a C object appear in the last ...?" question names, in seconds."""
    text = question.removesuffix("?").split("in the last ")[1]
    if text == "minute":
        return 60
    n, unit = text.split()
    return int(n) * (60 if unit == "minutes" else 1)


@pytest.fixture(scope="module")
def memory_suite(tmp_path_factory):
    base = tmp_path_factory.mktemp("memory-suite")
    return {name: sb.write_suite_set(base / name, name, num_videos=3, memory_kinds=True)
            for name in ("long", "long600", "long1800")}


def test_memory_kinds_leave_the_suite_as_it_was(memory_suite, suite, tmp_path):
    """The memory kinds only add questions: the video and every other question are the set's without them."""
    plain = sb.write_suite_set(tmp_path / "plain", "long", num_videos=3)
    with_memory = memory_suite["long"]
    for v in range(3):
        video = f"src_videos/long_{v:03d}.mp4"
        assert (plain / video).read_bytes() == (with_memory / video).read_bytes()
    old, new = (json.loads((root / sb.ANNOTATION_FILE).read_text()) for root in (plain, with_memory))
    def strip(e: dict) -> dict:  # ids number questions by time: the added ones shift them
        return {k: v for k, v in e.items() if k != "id"}

    kept = [strip(e) for e in new if e.get("kind") not in ("episodic_after", "ordering_pair", "episodic_recent")]
    assert kept == [strip(e) for e in old]
    assert "memory_kinds" not in json.loads((plain / sb.META_FILE).read_text())


def test_memory_kinds_answers_follow_from_the_timelines(memory_suite):
    """Recomputed from the recorded world (objects seen before the question), not the planner."""
    counts = {"episodic_after": 0, "ordering_pair": 0, "episodic_recent": 0}
    answers = {"yes": 0, "no": 0, 0: 0, 1: 0}
    for root in memory_suite.values():
        entries, meta = suite_entries(root)
        for e in entries:
            if e.get("kind") not in counts:
                continue
            counts[e["kind"]] += 1
            apps = sorted(meta["timelines"][e["video"]], key=lambda a: a["start_s"])
            seen = [a for a in apps if a["start_s"] < e["realtime"]]
            names = [f"{a['colour']} {a['shape']}" for a in seen]
            assert e["options"][e["gt"]] == e["answer"]
            if e["kind"] == "episodic_after":
                named = e["question"].removesuffix("?").split("just after the ")[1]
                assert names.count(named) == 1
                i = names.index(named)
                assert seen[i]["start_s"] == e["subject_s"] and seen[i + 1]["end_s"] <= e["realtime"]
                assert e["answer"] == seen[i + 1]["colour"]
            elif e["kind"] == "ordering_pair":
                a, b = e["question"].removesuffix("?").removeprefix("Which came first: the ").split(" or the ")
                assert names.count(a) == names.count(b) == 1 and e["options"] == [a, b]
                assert e["answer"] == min((a, b), key=lambda n: seen[names.index(n)]["start_s"])
                answers[e["gt"]] += 1
            else:
                colour = e["question"].split()[2]
                shown = [t for a in apps if a["colour"] == colour
                         for t in range(a["start_s"], a["end_s"]) if t < e["realtime"]]
                window_s = window_s_of(e["question"])
                assert window_s <= e["realtime"]
                assert e["answer"] == ("yes" if any(t >= e["realtime"] - window_s for t in shown) else "no")
                answers[e["answer"]] += 1
            # depth: the subject's start as a share of the question time; X is the object gone by the question
            # nearest its nominal depth (the "just before X" subject), a pair is asked when both are gone
            depth_pct = 100 * e["subject_s"] / e["realtime"]
            assert abs(depth_pct - int(e["depth"])) <= (3 if e["kind"] == "episodic_recent" else 12), e
    assert min(counts.values()) >= 10, counts
    assert min(answers.values()) >= 5, answers  # both answers of each two-way kind occur


def test_the_memory_kinds_flag_needs_a_suite(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        sb.main([str(tmp_path / "x"), "--memory-kinds"])
    assert exc.value.code == 2 and "--memory-kinds needs --suite" in capsys.readouterr().err
    assert sb.main([str(tmp_path / "y"), "--suite", "long", "--videos", "1", "--memory-kinds"]) == 0
    kinds = {e.get("kind") for e in json.loads((tmp_path / "y" / sb.ANNOTATION_FILE).read_text())}
    assert {"episodic_after", "ordering_pair", "episodic_before"} <= kinds


def test_make_question_memory_kinds_on_a_hand_made_stream():
    app = lambda colour, shape, start, end: sb.Appearance(colour, shape, start, end, 0.5, 0.5, 0.0, 0.0, 0.25)
    timeline = sb.Timeline(400, [app("red", "circle", 1, 4), app("blue", "square", 5, 8), app("green", "circle", 9, 12),
                                 app("white", "triangle", 100, 103), app("green", "square", 200, 203)],
                           rare_colour="white")
    rng = np.random.default_rng(0)
    q = sb.make_question(rng, timeline, timeline.frames_before(300.5), "episodic_after", 300.5, subject_s=5)
    assert q.question == "What colour was the object just after the blue square?" and q.answer == "green"
    q = sb.make_question(rng, timeline, timeline.frames_before(300.5), "ordering_pair", 300.5, subject_s=100)
    assert set(q.options) == {"white triangle", "green square"} and q.answer == "white triangle"
    # the white triangle's last frame is 102: 198 s before a question at 300.5
    for _ in range(20):
        q = sb.make_question(rng, timeline, timeline.frames_before(300.5), "episodic_recent", 300.5)
        assert q.question.startswith("Did a white object appear in the last ")
        assert q.answer == ("yes" if window_s_of(q.question) > 198.5 else "no")
        assert 99 <= window_s_of(q.question) <= 397  # near the edge: within a factor of two of 198.5 s
    q = sb.make_question(rng, timeline, timeline.frames_before(101.5), "realtime_shape", 101.5)
    assert q.options == list(sb.SHAPES) and q.answer == "triangle" and q.task == "ATR"
    # a window that holds nothing seen: no question (no white object before 100)
    assert sb.make_question(rng, timeline, timeline.frames_before(50.5), "episodic_recent", 50.5) is None
