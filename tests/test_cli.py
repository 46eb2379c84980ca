"""The command line: answers for good input; one line and the documented exit code for bad input."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hermes.cli import main
from hermes.pipelines.synthetic import write_synthetic_video
from tests.pipelines import video_fixtures as vf

TINY = ["--model", "tiny-llava-onevision", "--set", "model.max_new_tokens=3", "--quiet"]


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    return write_synthetic_video(tmp_path_factory.mktemp("v") / "clip.mp4", duration_s=6.0, fps=10.0)


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_run_answers_in_json_at_the_requested_times(video, capsys):
    code, out, err = run_cli(capsys, "run", video, *TINY, "--fps", "2", "--chunk-frames", "3",
                             "--ask", "What is there?", "--at", "2.0", "--ask", "And now?", "--at", "4.5", "--json")
    assert code == 0, err
    answers = [json.loads(line) for line in out.splitlines()]
    assert [a["at_s"] for a in answers] == [2.0, 4.5]
    assert [a["frames_seen"] for a in answers] == [4, 9]  # frames at 0, 0.5, ... strictly before at_s
    for a in answers:
        assert {"question", "answer", "ttft_ms", "latency_ms", "memory", "config"} <= set(a)
        assert a["config"]["model"]["name"] == "tiny-llava-onevision"


def test_run_reads_a_questions_file_and_prints_human_readable_answers(video, tmp_path, capsys):
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "Which colour?", "at_s": 3, "options": ["red", "blue"]}\n\n'
                         '{"question": "At the end?"}\n')
    code, out, err = run_cli(capsys, "run", video, *TINY, "--fps", "1", "--questions", questions)
    assert code == 0, err
    assert "[3.0s] Q: Which colour?" in out and "A. red" in out and "B. blue" in out
    assert "[end] Q: At the end?" in out
    assert "3 frames seen" in out and "6 frames seen" in out


def test_bounded_memory_preset_from_the_command_line(video, capsys):
    code, out, err = run_cli(capsys, "run", video, *TINY, "--fps", "5", "--memory", "hermes-4k",
                             "--set", "memory.budget=300", "--ask", "q", "--json")
    assert code == 0, err
    answer = json.loads(out)
    prefix = answer["memory"]["hbm_tokens"] - 300
    assert 0 < prefix < 40  # the prompt prefix plus 300 visual tokens, although 30 frames were seen
    assert answer["frames_seen"] == 30


def test_the_recall_only_preset_answers_from_a_window_plus_what_it_recalls(video, capsys):
    code, out, err = run_cli(capsys, "run", video, *TINY, "--fps", "5", "--memory", "recall-only",
                             "--set", "memory.budget=300", "--ask", "q", "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert 0 < answer["memory"]["hbm_tokens"] - 300 < 40  # level 1 holds the sliding window only
    assert answer["recall"]["records"] >= 1 and answer["recall"]["tokens"] > 0  # every evicted token is findable


@pytest.mark.parametrize("make, argv_extra, code, message", [
    (lambda d: d / "missing.mp4", ["--ask", "q"], 3, "video file not found"),
    (lambda d: vf.write_text_as_mp4(d / "notes.mp4"), ["--ask", "q"], 3, "not a readable video"),
    (lambda d: vf.write_truncated_video(d / "cut.mp4", 0.6, moov_first=False), ["--ask", "q"], 3, "truncated"),
    (lambda d: vf.write_empty_file(d / "empty.mp4"), ["--ask", "q"], 3, "contains no frames"),
    (lambda d: vf.write_zero_frame_video(d / "zero.mp4"), ["--ask", "q"], 3, "contains no frames"),
    (None, ["--ask", "q", "--at", "-1"], 2, "--at expects a non-negative number of seconds, found '-1'"),
    (None, ["--ask", "q", "--at", "60"], 2, "past the end of the video (6.00s)"),
    (None, ["--ask", "q", "--at", "1", "--at", "2"], 2, "already has --at 1"),
    (None, ["--at", "1", "--ask", "q"], 2, "--at 1 comes before any --ask"),
    (None, ["--ask", "q", "--set", "stream.fsp=2"], 2, "unknown config key 'stream.fsp' (did you mean 'stream.fps'?)"),
    (None, [], 2, "no question to answer"),
])
def test_bad_input_is_one_line_and_an_exit_code(video, tmp_path, capsys, make, argv_extra, code, message):
    if make is not None:
        pytest.importorskip("av")
        source = make(tmp_path)
    else:
        source = video
    got, out, err = run_cli(capsys, "run", source, *TINY, *argv_extra)
    assert got == code
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert out == ""


def test_unknown_model_is_exit_4(video, capsys):
    code, out, err = run_cli(capsys, "run", video, "--model", "llava-onevison-7b", "--ask", "q")
    assert code == 4
    assert "unknown model 'llava-onevison-7b' (did you mean 'llava-onevision-7b'?)" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("line, message", [
    ('{"question": "ok", "at_s": 1}\n{"question": "broken", \n', "q.jsonl:2: not valid JSON"),
    ('{"question": "ok"}\n{"text": "no question key"}\n', 'q.jsonl:2: expected an object with a "question"'),
    ('{"question": "ok", "at_s": "soon"}\n', 'q.jsonl:1: "at_s" must be a number'),
])
def test_malformed_questions_file_names_the_line(video, tmp_path, capsys, line, message):
    questions = tmp_path / "q.jsonl"
    questions.write_text(line)
    code, out, err = run_cli(capsys, "run", video, *TINY, "--questions", questions)
    assert code == 2
    assert message in err


def test_module_entry_point_exits_with_the_code_and_no_traceback(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-m", "hermes", "run", str(tmp_path / "nope.mp4"), "--ask", "q"],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 3
    assert result.stderr.strip() == f"hermes-video: error: video file not found: {tmp_path / 'nope.mp4'} (check the path)"


def test_demo_answers_with_the_trained_micro_model_offline(tmp_path, capsys):
    """Every planned question is asked and checked against the generator's answer; most come out right."""
    from hermes.datasets.synthetic_bench import write_demo

    _, planned = write_demo(tmp_path / "expected")
    code, out, err = run_cli(capsys, "demo", "--output", tmp_path)
    assert code == 0, err
    assert (tmp_path / "demo.mp4").is_file()
    assert out.count("Q: ") == len(planned) >= 4
    assert out.count("expected: ") == len(planned)
    right = out.count("[right]")
    assert f"{right}/{len(planned)} answers right" in err
    assert right >= len(planned) // 2, out


def test_info_lists_presets_and_backends(capsys):
    code, out, _ = run_cli(capsys, "info")
    assert code == 0
    assert "tiny-llava-onevision" in out and "hermes-4k" in out
    assert "video        decord, opencv" in out


# ---- a video file over HTTP, from servers with and without Range support ------------------------------


def http_handler(directory, ranges: bool):
    """Python's `SimpleHTTPRequestHandler` (it ignores Range headers), or one that honours
    `Range: bytes=a-b` with 206 replies, as most web servers do."""
    import re
    from http.server import SimpleHTTPRequestHandler

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(directory), **kwargs)

        def log_message(self, *args):
            pass

        def do_GET(self):
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if not (ranges and match):
                return super().do_GET()
            data = (directory / self.path.lstrip("/")).read_bytes()
            start = int(match.group(1))
            end = int(match.group(2)) if match.group(2) else len(data) - 1
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(end - start + 1))
            self.end_headers()
            self.wfile.write(data[start:end + 1])

    return Handler


@pytest.fixture(params=["no-range", "range"])
def http_video(request, video):
    """`clip.mp4` (6 s, 10 fps) served on loopback by a server with or without Range support."""
    import threading
    from http.server import ThreadingHTTPServer
    from pathlib import Path

    server = ThreadingHTTPServer(("127.0.0.1", 0), http_handler(Path(video).parent, request.param == "range"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{Path(video).name}"
    server.shutdown()
    server.server_close()


def test_an_mp4_over_http_is_sampled_at_its_timestamps(http_video, capsys):
    from hermes.pipelines.sources import open_source

    with open_source(http_video, fps=0.5) as source:
        times = [round(f.t_s, 3) for f in source]
    assert times == [0.0, 2.0, 4.0]
    code, out, err = run_cli(capsys, "run", http_video, *TINY, "--fps", "0.5", "--ask", "q", "--json")
    assert code == 0, err
    assert json.loads(out)["frames_seen"] == 3


def test_an_unreachable_http_video_is_exit_3(capsys):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = run_cli(capsys, "run", f"http://user:secret@127.0.0.1:{port}/clip.mp4", *TINY, "--ask", "q")
    assert code == 3 and f"cannot download http://127.0.0.1:{port}/clip.mp4" in err and "secret" not in err


# ---- the first hour: bounded by default, schedules as fast as the model, questions kept as given ---------


def test_run_defaults_to_a_bounded_memory_and_every_model_preset_names_one(video, capsys):
    from hermes.config import default_memory_preset, load_preset, preset_names

    code, out, err = run_cli(capsys, "run", video, *TINY, "--ask", "q", "--json")
    assert code == 0, err
    memory = json.loads(out)["config"]["memory"]
    assert memory["policy"] == "hermes" and memory["budget"] == 4096
    for name in preset_names("models"):
        assert load_preset("memory", default_memory_preset(name))["policy"] != "full", name
    assert default_memory_preset("org/any-checkpoint") == "hermes-4k"


def test_full_memory_is_refused_before_encoding_a_stream_it_cannot_hold():
    """`full` on a 2,300 s stream: LLaVA-OV's 196 tokens per frame at 0.5 fps need 225,400 positions."""
    from types import SimpleNamespace

    from hermes.pipelines.run import check_capacity
    from hermes.config import build_config
    from hermes.errors import UsageError

    model = SimpleNamespace(max_position_embeddings=32768, tokens_per_frame=196)
    cfg = build_config(model="llava-onevision-7b", memory="full")
    with pytest.raises(UsageError, match=r"memory 'full' cannot hold this video: 2300 s at 0.5 fps is 1150 frames"):
        check_capacity(model, cfg, 2300.0, live=False)
    assert check_capacity(model, cfg, 300.0, live=False) is None  # 150 frames fit
    assert "will stop after about 161 frames" in check_capacity(model, cfg, None, live=True)
    assert check_capacity(model, build_config(model="llava-onevision-7b", memory="hermes-4k"), 2300.0, False) is None


def test_config_naming_a_model_preset_applies_its_settings(tmp_path):
    from hermes.config import build_config

    by_name = build_config(config_file="smolvlm2-500m")
    assert by_name.model.name == "smolvlm2-500m" and by_name.model.family == "smolvlm"
    assert by_name.model.hub_id == "HuggingFaceTB/SmolVLM2-500M-Video-Instruct" and by_name.stream.fps == 1.0
    preset_file = build_config(config_file=Path(__file__).parents[1] / "configs/models/qwen3-vl-2b.yaml")
    assert preset_file.model.name == "qwen3-vl-2b" and preset_file.model.family == "qwen3_vl"
    assert preset_file.stream.fps == 2.0
    named = tmp_path / "mine.yaml"
    named.write_text("model:\n  name: smolvlm2-500m\n  max_new_tokens: 9\n")
    cfg = build_config(config_file=named)
    assert cfg.model.hub_id == "HuggingFaceTB/SmolVLM2-500M-Video-Instruct" and cfg.model.max_new_tokens == 9
    assert build_config(model="tiny-llava-onevision", config_file=named).model.name == "tiny-llava-onevision"
    assert build_config(config_file="hermes-6k", overrides=["model.device=cpu"]).memory.budget == 6144


def test_ask_every_on_a_file_runs_as_fast_as_the_model(video, capsys, monkeypatch):
    import hermes.pipelines.interactive as interactive

    def no_waiting(_s):
        raise AssertionError("a question schedule on a file must not play it back in real time")

    monkeypatch.setattr(interactive.time, "sleep", no_waiting)
    code, out, err = run_cli(capsys, "run", video, *TINY, "--fps", "2", "--ask-every", "2", "--ask", "q", "--json")
    assert code == 0, err
    answers = [json.loads(line) for line in out.splitlines()]
    assert [(a["at_s"], a["frames_seen"]) for a in answers] == [(2.0, 4), (4.0, 8), (6.0, 12)]


def test_questions_keep_their_ids_and_timed_and_end_questions_mix(video, tmp_path, capsys):
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"id": "late", "question": "What now?", "at_s": 4}\n'
                         '{"id": 7, "question": "And first?", "at_s": 1, "options": ["x", "y"]}\n')
    code, out, err = run_cli(capsys, "run", video, *TINY, "--fps", "2", "--questions", questions,
                             "--ask", "At the end?", "--ask", "At two?", "--at", "2", "--json", "--log-level", "error")
    assert code == 0, err
    answers = [json.loads(line) for line in out.splitlines()]
    assert [(a["question"], a["at_s"], a.get("id")) for a in answers] == [
        ("And first?", 1.0, 7), ("At two?", 2.0, None), ("What now?", 4.0, "late"), ("At the end?", None, None)]
    assert answers[-1]["frames_seen"] == 12
    assert "note: answers come in time order" in err


def test_debug_after_the_subcommand_shows_the_traceback(tmp_path):
    from hermes.errors import SourceError

    with pytest.raises(SourceError):
        main(["run", str(tmp_path / "nope.mp4"), "--ask", "q", "--debug"])


def test_the_progress_bar_ends_at_every_frame_encoded(video, capsys, monkeypatch):
    import re

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, out, err = main(["run", str(video), "--model", "tiny-llava-onevision", "--fps", "5", "--ask", "q"]), \
        *capsys.readouterr()
    assert code == 0, err
    counts = re.findall(r"(\d+)/(\d+) \[", err)
    assert counts and counts[-1] == ("30", "30"), counts[-3:]
    assert "30 frames seen" in out


def test_demo_honours_the_memory_preset_keeps_expected_answers_and_leaves_no_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code, out, err = run_cli(capsys, "demo", "--memory", "sliding", "--json")
    assert code == 0, err
    answers = [json.loads(line) for line in out.splitlines()]
    assert answers and all({"expected", "right"} <= set(a) for a in answers)
    assert f"{sum(a['right'] for a in answers)}/{len(answers)} answers right (memory: sliding, budget 128" in err
    assert list(tmp_path.iterdir()) == []  # the demo video's temporary folder is gone


def test_bench_reads_its_budget_from_the_config_and_prints_json(capsys):
    code, out, err = run_cli(capsys, "bench", "memory", "--memory", "hermes-6k", "--set", "memory.budget=6144",
                             "--policies", "hermes", "--lengths", "8", "--chunk-frames", "4", "--num-layers", "2",
                             "--json")
    assert code == 0, err
    run = json.loads(out)
    assert run["budget"] == 6144 and [r["budget"] for r in run["rows"]] == [6144]
    assert "hermes: 8/8 frames" in err  # progress inside the policy's stream


# ---- models: pull, list, and an error that names the fix ----------------------------------------------


def test_pull_downloads_a_preset_at_a_revision_into_a_folder(tmp_path, capsys, monkeypatch):
    import huggingface_hub

    calls = []

    def fake_snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        folder = Path(kwargs["local_dir"])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text("{}")
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    code, out, err = run_cli(capsys, "pull", "smolvlm2-500m", "--revision", "abc123", "--local-dir", tmp_path / "w",
                             "--quiet")
    assert code == 0, err
    (repo_id, kwargs), = calls
    assert repo_id == "HuggingFaceTB/SmolVLM2-500M-Video-Instruct" and kwargs["revision"] == "abc123"
    assert "*.safetensors" in kwargs["allow_patterns"]
    assert out.strip() == str(tmp_path / "w") and f"--model {tmp_path / 'w'}" in err

    def offline(repo_id, **kwargs):
        raise OSError("We couldn't connect to the hub\nsecond line")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    code, out, err = run_cli(capsys, "pull", "Org/Model")
    assert code == 4 and "cannot download 'Org/Model': OSError (We couldn't connect to the hub)" in err
    assert err.count("hermes-video: error:") == 1 and "second line" not in err and "Traceback" not in err


def test_pull_of_a_builtin_model_is_a_no_op_that_says_so(capsys, monkeypatch):
    """Exit 0 and nothing downloaded (it was exit 4, "nothing to pull", as if the name were wrong)."""
    import huggingface_hub

    def no_download(repo_id, **kwargs):
        raise AssertionError(f"a builtin model was downloaded: {repo_id}")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_download)
    code, out, err = run_cli(capsys, "pull", "micro-llava-onevision")
    assert code == 0, err
    assert out == "" and "micro-llava-onevision is builtin" in err and "error" not in err


def lay_out_hf_cache(cache: Path, repo_id: str, files: dict[str, bytes]) -> None:
    """A Hugging Face hub cache entry as huggingface_hub writes it: blobs, a snapshot of links, refs/main."""
    import hashlib

    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = "0" * 40
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)


def test_models_lists_presets_what_is_on_disk_and_sizes(tmp_path):
    lay_out_hf_cache(tmp_path, "HuggingFaceTB/SmolVLM2-256M-Video-Instruct",
                     {"config.json": b"{}", "model.safetensors": b"\0" * 3 * 2**20})
    lay_out_hf_cache(tmp_path, "someone/other-vlm", {"config.json": b"{}"})
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path))
    result = subprocess.run([sys.executable, "-m", "hermes", "models"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert rows["smolvlm2-256m"].endswith("yes, 3.0 MiB")
    assert rows["smolvlm2-500m"].endswith("no: hermes-video pull smolvlm2-500m")
    assert rows["tiny-llava-onevision"].endswith("builtin")
    assert "someone/other-vlm" in rows
    listed = subprocess.run([sys.executable, "-m", "hermes", "models", "--json"], capture_output=True, text=True,
                            env=env)
    entries = {e["name"]: e for e in map(json.loads, listed.stdout.splitlines())}
    assert entries["smolvlm2-256m"]["on_disk"] and entries["smolvlm2-256m"]["size_bytes"] >= 3 * 2**20


@pytest.mark.slow
def test_a_model_missing_offline_names_the_command_that_fetches_it(video, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path))
    result = subprocess.run([sys.executable, "-m", "hermes", "run", str(video), "--model", "smolvlm2-500m",
                             "--ask", "q"], capture_output=True, text=True, env=env)
    assert result.returncode == 4
    assert "run `hermes-video pull smolvlm2-500m` while online, or pass --model DIR" in result.stderr
    assert result.stderr.count("\n") == 1
