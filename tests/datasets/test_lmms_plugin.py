"""The lmms-eval plugin: declared in lmms-eval's entry-point group, answers requests by streaming the
video through a StreamingSession; with lmms-eval installed, `--model hermes` resolves to it, and
lmms-eval's own command runs a task through it end to end (CI's lmms venv: `.ci/run`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def lmms_eval_or_skip():
    """lmms-eval, or a skip where it is not installed; CI's lmms venv sets HERMES_REQUIRE_LMMS=1, where a
    missing or unimportable lmms-eval fails instead of skipping."""
    if os.environ.get("HERMES_REQUIRE_LMMS") == "1":
        import lmms_eval

        return lmms_eval
    return pytest.importorskip("lmms_eval")


def test_with_lmms_eval_installed_model_hermes_resolves_to_the_plugin(tiny_model, video):
    lmms_eval = lmms_eval_or_skip()
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


# A task of lmms-eval's own format over local files: a JSON-lines dataset (datasets' packaged "json"
# builder, no hub), the video path per doc, lmms-eval's exact-match metric.
SMOKE_TASK = """task: hermes_smoke
dataset_path: json
dataset_kwargs:
  data_files:
    test: {docs}
test_split: test
output_type: generate_until
doc_to_visual: !function smoke_utils.doc_to_visual
doc_to_text: question
doc_to_target: answer
generation_kwargs:
  max_new_tokens: 3
  until: ["\\n\\n"]
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


@pytest.mark.slow  # lmms-eval's command imports its whole task registry: about 15 s
def test_lmms_eval_command_runs_a_task_through_the_plugin(tiny_model, video, tmp_path):
    lmms_eval_or_skip()
    prompts = ["What is there?", "What moves?"]
    docs, tasks, out = tmp_path / "docs.jsonl", tmp_path / "tasks", tmp_path / "out"
    docs.write_text("".join(json.dumps({"video": str(video), "question": p, "answer": "x"}) + "\n" for p in prompts))
    tasks.mkdir()
    (tasks / "hermes_smoke.yaml").write_text(SMOKE_TASK.format(docs=docs))
    (tasks / "smoke_utils.py").write_text("def doc_to_visual(doc):\n    return [doc['video']]\n")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "lmms_eval", "--model", "hermes",
         "--model_args", "model=tiny-llava-onevision,memory=sliding,fps=2", "--tasks", "hermes_smoke",
         "--include_path", str(tasks), "--batch_size", "1", "--output_path", str(out), "--log_samples"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    logged = sorted(out.rglob("*_samples_hermes_smoke.jsonl"))
    # lmms-eval logs an evaluation error and may still exit 0: the samples file is the evidence
    assert logged, f"lmms-eval wrote no samples (exit {run.returncode}):\n{run.stderr[-3000:]}"
    samples = sorted((json.loads(line) for line in logged[0].read_text().splitlines()), key=lambda s: s["doc_id"])
    cfg = HermesLMM(model="tiny-llava-onevision", memory="sliding", fps=2, loaded_model=tiny_model).cfg
    assert [s["filtered_resps"] for s in samples] == direct_replies(tiny_model, cfg, video, prompts)
