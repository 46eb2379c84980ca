"""Every loader turns its hand-made fixture (official format, odd cases included) into the
unified records written out by hand below."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from hermes.datasets.benchmarks import (
    egoschema,
    longvideobench,
    lvbench,
    mlvu,
    mvbench,
    ovo_bench,
    rvs,
    streamingbench,
    videomme,
)
from hermes.datasets.common import missing_videos
from hermes.datasets.registry import get_benchmark
from hermes.errors import SourceError, UsageError

FIXTURES = Path(__file__).parent / "fixtures"


def rel(path: Path | None, root: Path) -> str | None:
    """A found path relative to the fixture root, for readable expectations."""
    return None if path is None else path.relative_to(root).as_posix()


def summary(records, root: Path):
    """(video_id, video path, [(qid, task, t_s, gt_index, answer)]) per record."""
    return [
        (r.video_id, rel(r.video_path, root), [(q.qid, q.task, q.t_s, q.gt_index, q.answer) for q in r.questions])
        for r in records
    ]


def fixture_records(module, **kwargs):
    """(records, fixture root): what a loader reads from its fixture folder, named after the module."""
    root = FIXTURES / module.__name__.rsplit(".", 1)[-1]
    return module.load(root, **kwargs), root


def test_ovo_bench():
    records, root = fixture_records(ovo_bench)
    assert summary(records, root) == [
        (
            "Ego4D/clips/aaa.mp4",
            "src_videos/Ego4D/clips/aaa.mp4",
            [
                # REC probes become questions at their own time, sorted before the MC ones.
                ("ovo-1558-0", "REC", 17.0, None, "1"),
                ("ovo-1558-1", "REC", 32.0, None, "2"),
                # `answer` paraphrases option D; `gt` (3) is the reference.
                ("ovo-1210", "ACR", 54.2, 3, "He is inflating a tire."),
                ("ovo-0", "EPM", 215.0, 2, "a person with blue shirt"),
            ],
        ),
        ("Ego4D/clips/bbb.mp4", None, [("ovo-297", "HLD", 371.0, 1, "Unable to answer")]),
        (
            "COIN/ccc.mp4",
            "src_videos/COIN/ccc.mp4",
            [
                # SSR probes are unsorted in the file (27 then 26).
                ("ovo-1516-1", "SSR", 26.0, 0, "No"),
                ("ovo-1516-0", "SSR", 27.0, 1, "Yes"),
                ("ovo-1468-0", "CRR", 297.0, 0, "No"),
                ("ovo-1468-1", "CRR", 310.0, 1, "Yes"),
            ],
        ),
    ]
    first = records[0].questions
    assert first[0].question == "How many times did they breaking something?"
    assert first[0].kind == "count" and first[0].options == []
    assert first[2].raw["answer"] == "He is inflating the tire with the tool."
    assert first[2].labels == ("ACR", "realtime")
    assert records[2].questions[0].question == "put on the hair extensions"
    assert records[2].questions[0].options == ["No", "Yes"]
    assert missing_videos(records) == ["Ego4D/clips/bbb.mp4"]


def test_streamingbench():
    records, root = fixture_records(streamingbench)
    assert summary(records, root) == [
        (
            "sample_1_real",
            "videos/sample_1_real.mp4",
            [
                ("sb-real-sample_1_real-0", "Object Perception", 50.0, 1, "A map."),  # "00:00:50"
                ("sb-real-sample_1_real-2", "Object Perception", 65.0, 0, "An umbrella."),  # "0:01:05"
                ("sb-real-sample_1_real-1", "Counting", 150.0, 3, "Four."),  # "02:30"
            ],
        ),
        (
            "sample_2_Source_Discrimination",
            "videos/sample_2_Source_Discrimination.mp4",
            [
                (
                    "sb-omni-sample_2_Source_Discrimination-0",
                    "Source Discrimination",
                    120.0,
                    2,
                    "A man wearing a purple blazer.",
                )
            ],
        ),
        (
            "sample_17_sqa",
            "sqa/sample_17_sqa.mp4",  # found in the subset folder
            [
                ("sb-sqa-sample_17_sqa-0", "Sequential Question Answering", 36.0, 0, "Wang chuqin."),
                ("sb-sqa-sample_17_sqa-1", "Sequential Question Answering", 182.0, 2, "7."),
            ],
        ),
        ("sample_17_proactive", None, [("sb-proactive-sample_17_proactive-0", "Proactive Output", 20.0, None, "3")]),
    ]
    omni = records[1].questions[0]
    assert omni.options == [  # "A.A man ..." lost its letter but kept its text
        "A man wearing a black blazer.",
        "A man wearing a black leather jacket.",
        "A man wearing a purple blazer.",
        "A fair-skinned man wearing an orange jumper.",
    ]
    assert records[2].questions[1].options == ["2.", "6.", "7.", "4."]  # SQA: no letters
    proactive = records[3].questions[0]
    assert proactive.kind == "proactive" and proactive.meta["gt_time_s"] == 29.0


def test_rvs_both_subsets_and_npy():
    records, root = fixture_records(rvs)
    assert summary(records, root) == [
        (
            "ego_1",
            "ego/videos/ego_1.mp4",
            [
                # Asked at end_time; conversation 1 ends first.
                ("rvs-ego-ego_1-1", "ego", 45.0, None, "On the shelf by the door."),
                ("rvs-ego-ego_1-0", "ego", 130.5, None, "A blue towel."),
            ],
        ),
        # The annotation says data/rvs/movie/videos/tt0000001.mp4; the archive has the .npy.
        (
            "tt0000001",
            "movie/videos/tt0000001.npy",
            [("rvs-movie-tt0000001-0", "movie", 2.0, None, "A man in a grey coat.")],
        ),
    ]
    assert records[0].duration == 3600.0 and records[0].frame_fps is None
    assert records[1].frame_fps == 1.0
    assert records[0].questions[0].meta == {"kind": "open", "start_s": 30.0}
    frames = rvs.load_npy_frames(records[1].video_path)
    assert frames.shape == (2, 2, 2, 3) and frames.dtype == np.uint8 and int(frames[1, 1, 1, 2]) == 23


def test_rvs_registry_subsets():
    assert [r.video_id for r in get_benchmark("rvs-ego").loader(FIXTURES / "rvs")] == ["ego_1"]
    assert [r.video_id for r in get_benchmark("RVS_Movie").loader(FIXTURES / "rvs")] == ["tt0000001"]


def test_rvs_npy_refuses_pickles_and_bad_shapes(tmp_path):
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(SourceError, match="pickle"):
        rvs.load_npy_frames(objects)
    flat = tmp_path / "flat.npy"
    np.save(flat, np.zeros((4, 4), dtype=np.uint8))
    with pytest.raises(SourceError, match=r"\(T, H, W, 3\)"):
        rvs.load_npy_frames(flat)
    with pytest.raises(SourceError, match="does not exist"):
        rvs.load_npy_frames(tmp_path / "absent.npy")


def test_mvbench():
    records, root = fixture_records(mvbench)
    assert summary(records, root) == [
        (
            "action_sequence/3MSZA.mp4@11.1-19.6",
            "video/star/Charades_v1_480/3MSZA.mp4",
            [("mvbench-action_sequence-0", "Action Sequence", None, 0, "Ate the medicine.")],
        ),
        (
            "action_sequence/3MSZA.mp4@0-8.5",
            "video/star/Charades_v1_480/3MSZA.mp4",
            [("mvbench-action_sequence-1", "Action Sequence", None, 1, "Opened the door.")],
        ),
        # The json names an .avi; the converted archive holds an .mp4 of the same stem.
        (
            "fine_grained_pose/S001C001P001R001A001_rgb.avi",
            "video/nturgbd/S001C001P001R001A001_rgb.mp4",
            [("mvbench-fine_grained_pose-0", "Fine-grained Pose", None, 1, "stand up")],
        ),
        (
            "episodic_reasoning/s01e02_seg02_clip_03@2-10",
            None,
            [("mvbench-episodic_reasoning-0", "Episodic Reasoning", None, 2, "He was tired.")],
        ),
    ]
    assert (records[0].start_s, records[0].end_s) == (11.1, 19.6)
    assert (records[2].start_s, records[2].end_s) == (None, None)
    frames = records[3]
    assert rel(frames.frames_dir, root) == "video/tvqa/frames_fps3_hq/s01e02_seg02_clip_03"
    assert frames.frame_fps == 3.0 and frames.available


def test_mvbench_task_selection():
    assert len(fixture_records(mvbench, tasks=["fine_grained_pose"])[0]) == 1
    assert len(fixture_records(mvbench, tasks=["Action Sequence"])[0]) == 2


def test_egoschema_subset_default_and_full():
    records, root = fixture_records(egoschema)
    assert summary(records, root) == [
        ("00aa-1", "videos/00aa-1.mp4", [("egoschema-00aa-1", "egoschema", None, 3, "c is painting a wall.")]),
        ("00cc-3", "videos/00cc-3.MP4", [("egoschema-00cc-3", "egoschema", None, 0, "A knife.")]),
    ]
    full, _ = fixture_records(egoschema, tasks=["full"])
    assert summary(full, root)[1] == ("00bb-2", None, [("egoschema-00bb-2", "egoschema", None, None, None)])
    assert full[1].questions[0].options[4] == "By how often they are used."


def test_videomme_resolves_mp4_MP4_and_mkv():
    records, root = fixture_records(videomme)
    assert summary(records, root) == [
        (
            "fFjv93ACGo8",
            "data/fFjv93ACGo8.mp4",
            [
                ("videomme-001-1", "Counting Problem", None, 2, "Berries."),
                ("videomme-001-2", "Information Synopsis", None, 1, "It is a documentary."),
            ],
        ),
        ("Zw2sLmmS1NM", "data/Zw2sLmmS1NM.MP4", [("videomme-301-1", "Object Recognition", None, 0, "A fox.")]),
        ("xxLong601ab", "data/xxLong601ab.mkv", [("videomme-601-1", "Action Reasoning", None, 3, "A foul.")]),
    ]
    assert records[0].questions[0].options == [
        "Apples.", "Candles.", "Berries.", "The three kinds are of the same number.",
    ]


def test_videomme_parquet(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed: the parquet path is untested here")
    import pyarrow as pa

    rows = [json.loads(line) for line in (FIXTURES / "videomme" / "videomme.jsonl").read_text().splitlines()]
    (tmp_path / "videomme").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "videomme" / "test-00000-of-00001.parquet")
    shutil.copytree(FIXTURES / "videomme" / "data", tmp_path / "data")
    expected = summary(*fixture_records(videomme))
    assert summary(videomme.load(tmp_path), tmp_path) == expected


def test_videomme_parquet_without_reader_is_a_usage_error(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_parquet(name, *args, **kwargs):
        if name.startswith(("pyarrow", "pandas")):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_parquet)
    (tmp_path / "videomme").mkdir()
    (tmp_path / "videomme" / "test-00000-of-00001.parquet").write_bytes(b"PAR1")
    with pytest.raises(UsageError, match="pip install pyarrow"):
        videomme.load(tmp_path)


def test_mlvu_task_folders_duplicate_gold_and_generation():
    records, root = fixture_records(mlvu)
    assert summary(records, root) == [
        (
            "1_plotQA/movie101_66.mp4",
            "video/1_plotQA/movie101_66.mp4",
            [("mlvu-1_plotQA-0", "plotQA", None, 0, "Yellow"), ("mlvu-1_plotQA-1", "plotQA", None, 1, "A book")],
        ),
        # Same file name in another task folder is a different video.
        ("4_count/movie101_66.mp4", "video/4_count/movie101_66.mp4", [("mlvu-4_count-0", "count", None, 2, "Three")]),  # last match is gold, as official
    ]
    assert records[1].questions[0].meta["ambiguous_gold"] is True
    assert records[0].duration == 246.0
    both, _ = fixture_records(mlvu, tasks=["count", "9_summary"])
    assert summary(both, root)[1] == (
        "9_summary/summary_1.mp4",
        None,
        [("mlvu-9_summary-0", "summary", None, None, "A man walks his dog through the park.")],
    )
    assert both[1].questions[0].kind == "open"


def test_longvideobench():
    records, root = fixture_records(longvideobench)
    assert summary(records, root) == [
        (
            "86CxyhFV9MI",
            "videos/86CxyhFV9MI.mp4",
            [
                ("lvb-86CxyhFV9MI_0", "TOS", None, 4, "See you tomorrow."),  # five candidates
                ("lvb-86CxyhFV9MI_1", "S2E", None, 1, "The lights go off."),  # three candidates
            ],
        ),
        ("abc123", None, [("lvb-abc123_0", "S2A", None, 0, "Red")]),
    ]
    assert records[0].duration == 1380.5


def test_lvbench_inline_options_and_multilabel_types():
    records, root = fixture_records(lvbench)
    assert summary(records, root) == [
        (
            "Cm73ma6Ibcs",
            "videos/Cm73ma6Ibcs.mp4",
            [
                ("lvbench-55", "key information retrieval", None, 3, "1633"),
                ("lvbench-56", "reasoning", None, 1, "It is a trade route"),
            ],
        ),
        ("missingVid1", None, [("lvbench-77", "entity recognition", None, 1, "Jerry")]),
    ]
    first, second = records[0].questions
    assert first.question == "What year appears in the opening caption of the video?"
    assert first.options == ["1636", "1366", "1363", "1633"]
    assert first.meta["time_reference_s"] == (15.0, 19.0)
    assert second.meta["question_types"] == ["reasoning", "event understanding"]
    assert records[0].duration == 61.5 * 60


@pytest.mark.parametrize(
    ("module", "kwargs", "video_ids"),
    [
        (ovo_bench, {"tasks": "EPM,HLD"}, ["Ego4D/clips/aaa.mp4", "Ego4D/clips/bbb.mp4"]),
        (ovo_bench, {"limit": 1}, ["Ego4D/clips/aaa.mp4"]),
        (streamingbench, {"tasks": ["sqa"]}, ["sample_17_sqa"]),
        (videomme, {"tasks": ["long"]}, ["xxLong601ab"]),
        (longvideobench, {"tasks": ["3600"]}, ["86CxyhFV9MI"]),
    ],
)
def test_selection_keeps_these_videos(module, kwargs, video_ids):
    assert [r.video_id for r in fixture_records(module, **kwargs)[0]] == video_ids


@pytest.mark.parametrize(
    ("module", "kwargs", "qids"),
    [
        (
            ovo_bench,
            {"tasks": ["forward"]},
            ["ovo-1558-0", "ovo-1558-1", "ovo-1516-1", "ovo-1516-0", "ovo-1468-0", "ovo-1468-1"],
        ),
        (streamingbench, {"tasks": ["Counting"]}, ["sb-real-sample_1_real-1"]),
        # A question matches a filter on any of its types.
        (lvbench, {"tasks": ["event understanding"]}, ["lvbench-56"]),
    ],
)
def test_selection_keeps_these_questions(module, kwargs, qids):
    assert [q.qid for r in fixture_records(module, **kwargs)[0] for q in r.questions] == qids


@pytest.mark.parametrize(
    ("module", "kwargs", "error", "match"),
    [
        (ovo_bench, {"tasks": ["EMP"]}, UsageError, "did you mean 'EPM'"),
        (ovo_bench, {"tasks": ["OCR"]}, UsageError, "no questions selected"),  # known, not in the fixture
        (ovo_bench, {"limit": 0}, UsageError, "positive integer"),
        (ovo_bench, {"tasks": ["HLD"]}, SourceError, "none of the 1 videos"),  # its only video is not on disk
        (streamingbench, {"tasks": ["Countin"]}, UsageError, "did you mean 'Counting'"),
        (mvbench, {"tasks": ["Action Count"]}, UsageError, "expected .*action_count.json"),  # real, file absent
        (mvbench, {"tasks": ["Action Sequense"]}, UsageError, "did you mean 'Action Sequence'"),
        (egoschema, {"tasks": ["subsets"]}, UsageError, "did you mean 'subset'"),
        (mlvu, {"tasks": ["summary"]}, SourceError, None),  # its only video is absent
    ],
)
def test_bad_selection_fails(module, kwargs, error, match):
    with pytest.raises(error, match=match):
        fixture_records(module, **kwargs)


ALL_LOADERS = [ovo_bench, streamingbench, rvs, mvbench, egoschema, videomme, mlvu, longvideobench, lvbench]


@pytest.mark.parametrize("module", ALL_LOADERS)
def test_missing_data_root_and_annotations_are_usage_errors(module, tmp_path):
    with pytest.raises(UsageError, match="not a directory"):
        module.load(tmp_path / "absent")
    with pytest.raises(UsageError):
        module.load(tmp_path)  # a directory without the annotation files


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b'[{"task": "EPM"', "not valid JSON"),
        (b'[{"task": "EPM", "video": "x.mp4"}]', "expected field 'options'"),
        (b"\xff\xfe\x00binary", "not UTF-8"),
        (b'{"task": "EPM"}', "JSON array"),
    ],
)
def test_malformed_annotation_is_a_one_line_usage_error(tmp_path, content, match):
    (tmp_path / "ovo_bench_new.json").write_bytes(content)
    with pytest.raises(UsageError, match=match) as info:
        ovo_bench.load(tmp_path)
    assert "\n" not in str(info.value)
