"""The command line: answers for good input; one line and the documented exit code for bad input."""

import json
import os
import subprocess
import sys

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
    (None, ["--ask", "q", "--set", "stream.fsp=2"], 2, "unknown config key 'stream.fsp' (did you mean 'fps'?)"),
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
