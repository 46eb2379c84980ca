"""`hermes.open`: the one-line Python entry point. `import hermes` stays light; bad arguments are the
project's one-line errors before torch loads; the README's example answers about a stream it knows."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_import_hermes_and_looking_up_open_do_not_import_torch():
    result = run_python("import sys, hermes; f = hermes.open; print(f.__module__, 'torch' in sys.modules, "
                        "'open' in dir(hermes))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["hermes.pipelines.facade", "False", "True"]


BAD_CALLS = [
    ("hermes.open(VIDEO, model='no-such-model')", "ModelError", "unknown model 'no-such-model'"),
    ("hermes.open(VIDEO, model='micro-llava-onevision', memory='hermes-9k')", "ConfigError", "hermes-9k"),
    ("hermes.open('missing.mp4', model='micro-llava-onevision')", "SourceError", "video file not found: missing.mp4"),
    ("hermes.open(VIDEO, model='micro-llava-onevision', budgt=64)", "ConfigError", "did you mean 'budget'"),
    ("hermes.open(VIDEO, model='micro-llava-onevision', budget=-5)", "ConfigError", "memory.budget"),
    ("hermes.open('rtsp://user:pw@127.0.0.1:9/cam', model='micro-llava-onevision')", "UsageError",
     "rtsp://***@127.0.0.1:9/cam is a live source"),
    ("hermes.open(0, model='micro-llava-onevision')", "UsageError", "0 is a live source"),
]


@pytest.mark.parametrize("call, error, message", BAD_CALLS)
def test_bad_arguments_raise_one_line_errors_before_torch_loads(tmp_path, call, error, message):
    from hermes.pipelines.synthetic import write_synthetic_video

    video = write_synthetic_video(tmp_path / "clip.mp4", duration_s=1.0, fps=5.0)
    result = run_python(f"import sys, hermes\nfrom hermes.errors import HermesError\nVIDEO = {str(video)!r}\n"
                        f"try:\n    {call}\nexcept HermesError as exc:\n"
                        f"    print(type(exc).__name__, 'torch' in sys.modules)\n    print(exc)\n", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    kind, message_line = result.stdout.rstrip("\n").split("\n")  # the message is one line
    assert kind == f"{error} False"
    assert message in message_line


def readme_python_api_example() -> str:
    """The first python block of README's "Python API" section."""
    section = (ROOT / "README.md").read_text().split("\n## Python API\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


@pytest.mark.slow
def test_the_readme_example_answers_about_the_synthetic_stream(tmp_path, monkeypatch):
    """The example as printed: the micro model reads the demo's stream through `hermes.open` and gets most
    of its questions right (chance is at most a third per multiple-choice question)."""
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(readme_python_api_example(), "README.md", "exec"), scope)
    questions, answers = scope["questions"], scope["answers"]
    assert len(answers) == len(questions) >= 4
    choice = [(q, a) for q, a in zip(questions, answers) if q.options]
    assert choice and all(a.answer in "ABCDEFGHIJ"[: len(q.options)] for q, a in choice)
    right = sum(a.answer == "ABCDEFGHIJ"[q.gt] if q.options else a.answer.rstrip(".") == q.answer
                for q, a in zip(questions, answers))
    assert right >= len(questions) // 2 + 1, [(q.answer, a.answer) for q, a in zip(questions, answers)]
    # each answer saw exactly the frames before its time (one a second)
    assert [a.frames_seen for a in answers] == [sum(1 for t in range(40) if t < q.t_s) for q in questions]


def test_the_session_releases_its_video_once_and_takes_overrides(tmp_path, monkeypatch):
    import hermes
    from hermes.pipelines.sources import VideoFileSource
    from hermes.pipelines.synthetic import write_synthetic_video

    closed = []
    real_close = VideoFileSource.close
    monkeypatch.setattr(VideoFileSource, "close", lambda self: (closed.append(self), real_close(self)))
    video = write_synthetic_video(tmp_path / "clip.mp4", duration_s=3.0, fps=10.0)
    with hermes.open(video, model="tiny-llava-onevision", memory="hermes-4k", fps=2, budget=600,
                     max_new_tokens=2) as session:
        answer = session.ask("What is there?", at=2.0)
        assert closed == []
    session.close()
    assert len(closed) == 1
    assert answer.frames_seen == 4  # 0, 0.5, 1 and 1.5 s at fps=2
    assert (session.memory.cfg.budget, session.max_new_tokens) == (600, 2)


@pytest.mark.parametrize("spec, live", [
    ("0", True), (2, True), ("rtsp://cam.local/stream", True), ("rtmp://h/app/key", True),
    ("http://h:8080/video.mjpg", True), ("http://h/clip.mp4", False), ("https://h/a.MKV?sig=1", False),
    ("file:///tmp/a.mp4", False), ("clip.mp4", False), ("frames/", False),
])
def test_is_live_tells_streams_from_recordings_as_open_source_opens_them(spec, live):
    from hermes.pipelines.sources import is_live

    assert is_live(spec) is live


def test_the_backend_setting_picks_the_reader_as_run_does(tmp_path, monkeypatch):
    import hermes
    from hermes.pipelines import video as video_module
    from hermes.pipelines.synthetic import write_synthetic_video

    opened = []
    real_open = video_module.open_video
    monkeypatch.setattr(video_module, "open_video", lambda path, backend="auto": (
        opened.append(backend), real_open(path, backend=backend))[1])
    video = write_synthetic_video(tmp_path / "clip.mp4", duration_s=1.0, fps=10.0)
    with hermes.open(video, model="tiny-llava-onevision", memory="sliding", backend="opencv"):
        pass
    assert opened == ["opencv"]
