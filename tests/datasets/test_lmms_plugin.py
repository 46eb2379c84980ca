"""The lmms-eval plugin: declared in lmms-eval's entry-point group, answers requests by streaming the
video through a StreamingSession; with lmms-eval installed, `--model hermes` resolves to it."""

from __future__ import annotations

from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest

from hermes.datasets.lmms_plugin import HermesLMM, _truncate
from hermes.pipelines.session import StreamingSession
from hermes.pipelines.synthetic import write_synthetic_video


def test_entry_point_is_declared_in_lmms_evals_group():
    [ep] = [e for e in entry_points(group="lmms_eval.models") if e.name == "hermes"]
    assert ep.value == "hermes.datasets.lmms_plugin:manifest"


def test_stop_strings_cut_the_reply():
    assert _truncate("B. cat\n\nmore", ["\n\n"]) == "B. cat"
    assert _truncate("B", None) == "B"


@pytest.fixture
def video(tmp_path):
    path = tmp_path / "v.mp4"
    write_synthetic_video(path, duration_s=3.0, fps=4.0, size=(64, 48))
    return path


def requests_for(video, prompts):
    docs = {i: {"video": str(video)} for i in range(len(prompts))}
    reqs = [SimpleNamespace(args=(p, {"max_new_tokens": 3, "until": ["\n\n"]}, lambda d: [d["video"]], i, "t", "test"))
            for i, p in enumerate(prompts)]
    return docs, reqs


def direct_replies(model, cfg, video, prompts):
    """What a hermes session on the same video answers, without the plugin."""
    from hermes.datasets.record_frames import open_record_frames
    from hermes.datasets.records import VideoRecord

    with open_record_frames(VideoRecord("v", video, None, []), cfg.stream.fps, "auto") as source:
        session = StreamingSession(model, cfg.memory, source.frames, chunk_frames=cfg.stream.chunk_frames,
                                   max_new_tokens=3)
        session.advance()
        return [_truncate(session.ask(p).answer, ["\n\n"]) for p in prompts]


def test_generate_until_streams_the_video_and_answers_like_a_session(tiny_model, video):
    lmm = HermesLMM(model="tiny-llava-onevision", memory="sliding", fps=2, loaded_model=tiny_model)
    prompts = ["What is there?", "What moves?"]
    docs, reqs = requests_for(video, prompts)
    lmm.task_dict = {"t": {"test": docs}}
    assert lmm.generate_until(reqs) == direct_replies(tiny_model, lmm.cfg, video, prompts)
    assert lmm.cfg.memory.policy == "sliding" and lmm.cfg.stream.fps == 2.0


def test_with_lmms_eval_installed_model_hermes_resolves_to_the_plugin(tiny_model, video):
    lmms_eval = pytest.importorskip("lmms_eval")
    from lmms_eval.api.instance import Instance
    from lmms_eval.models import get_model

    cls = get_model("hermes")
    assert cls.__name__ == "HermesLMM" and issubclass(cls, lmms_eval.api.model.lmms)
    lmm = cls(model="tiny-llava-onevision", memory="sliding", fps=2, loaded_model=tiny_model)
    docs, reqs = requests_for(video, ["What is there?"])
    lmm.task_dict = {"t": {"test": docs}}
    instances = [Instance(request_type="generate_until", arguments=r.args, idx=0,
                          metadata={"task": "t", "doc_id": 0, "repeats": 1})
                 for r in reqs]
    assert lmm.generate_until(instances) == direct_replies(tiny_model, lmm.cfg, video, ["What is there?"])
