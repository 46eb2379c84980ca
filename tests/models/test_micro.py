"""The micro model: shipped weights verify, load without unpickling, and answer synthetic streams."""

import json
import shutil
import struct

import numpy as np
import pytest
import torch

from hermes.config import build_config
from hermes.datasets import synthetic_bench as sb
from hermes.datasets.parsing import parse_strict
from hermes.errors import ModelError
from hermes.models import micro
from hermes.models.llava_onevision import LlavaOnevisionAdapter
from hermes.pipelines.frames import Frame
from hermes.pipelines.session import StreamingSession


@pytest.fixture(scope="module")
def micro_model():
    model, tokenizer = micro.load_micro()
    return LlavaOnevisionAdapter("micro-llava-onevision", model, tokenizer, device=torch.device("cpu"),
                                 dtype=torch.float32, system_prompt="You are a helpful assistant.")


def test_shipped_weights_match_the_recorded_checksum_and_are_safetensors():
    assert micro.file_sha256(micro.WEIGHTS_FILE) == micro.WEIGHTS_SHA256
    raw = micro.WEIGHTS_FILE.read_bytes()
    header_len = struct.unpack("<Q", raw[:8])[0]  # safetensors: a length, then a JSON header, then raw tensors
    header = json.loads(raw[8:8 + header_len])
    assert "__metadata__" in header and micro.META_CONFIG in header["__metadata__"]
    assert len(raw) < 8 * 2**20  # a few MB at most


def test_a_changed_file_is_refused(tmp_path):
    copy = tmp_path / "micro.safetensors"
    shutil.copy(micro.WEIGHTS_FILE, copy)
    data = bytearray(copy.read_bytes())
    data[-1] ^= 0xFF  # flip one bit pattern in the last tensor
    copy.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="sha256"):
        micro.load_micro(path=copy, sha256=micro.WEIGHTS_SHA256)
    with pytest.raises(ModelError, match="not found"):
        micro.load_micro(path=tmp_path / "missing.safetensors")


def test_builtin_id_loads_the_verified_weights_at_one_frame_per_second():
    from hermes.models.loading import load_model

    cfg = build_config(model="micro-llava-onevision")
    assert cfg.stream.fps == micro.MICRO_STREAM_FPS and cfg.model.family == "llava_onevision"
    adapter = load_model(cfg.model)
    shipped, _ = micro.load_micro()
    for (name, tensor), expected in zip(adapter.model.state_dict().items(), shipped.state_dict().values()):
        assert torch.equal(tensor, expected), name


def test_trained_model_has_the_built_architecture(micro_model):
    built, tokenizer = micro.build_micro(seed=0)
    trained = micro_model.model.state_dict()
    assert {k: v.shape for k, v in built.state_dict().items()} == {k: v.shape for k, v in trained.items()}
    assert micro_model.tokens_per_frame == 16
    assert micro_model.tokenizer.encode("What colour is the object on screen now?") == \
        tokenizer.encode("What colour is the object on screen now?")


def test_answers_real_time_questions_with_full_memory(micro_model):
    """Real-time colour questions on fresh streams: far above chance (1/6)."""
    rng = np.random.default_rng(12345)
    right = asked = 0
    for stream in range(4):
        timeline = sb.random_timeline(rng, 24)
        frames = [Frame(float(i), f, i) for i, f in enumerate(sb.render_frames(timeline))]
        session = StreamingSession(micro_model, "full", frames, chunk_frames=8, max_new_tokens=3)
        for at_s in (9.5, 15.5, 21.5, 23.5):
            q = sb.make_question(rng, timeline, timeline.frames_before(at_s), "realtime_colour", at_s)
            if q is None:  # nothing on screen at that moment
                continue
            answer = session.ask(q.question, q.options, at=at_s)
            right += parse_strict(answer.answer, q.options) == q.gt  # the benchmarks' strict rule
            asked += 1
    assert asked >= 8
    assert right / asked >= 0.9, f"{right}/{asked} right"


def test_eval_ovo_bench_on_a_generated_folder_scores_real_time_questions_right(micro_model, tmp_path):
    """The official OVO-Bench path end to end: every question answered, real-time answers right."""
    from hermes.datasets.runner import run_eval

    root = sb.write_benchmark(tmp_path / "bench", seed=5, num_videos=3, duration_s=30, per_family=1)
    expected = sum(len(e.get("test_info", [None])) for e in json.loads((root / sb.ANNOTATION_FILE).read_text()))
    cfg = build_config(model="micro-llava-onevision")
    summary = run_eval("ovo-bench", root, cfg, output_dir=tmp_path / "out", progress=False, model=micro_model)
    assert summary["coverage"]["questions_answered"] == summary["coverage"]["questions_expected"] == expected
    realtime = summary["accuracy"]["official"]["per_task"]["ATR"]
    assert realtime["scored"] == 3 and realtime["correct"] >= 2
