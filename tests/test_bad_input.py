"""Bad input to every subcommand and flag: one line on stderr, the documented exit code (2 usage or
config, 3 source, 4 model), no traceback, never "internal error"; and usage, file and config errors
are raised before torch is imported (checked in a fresh interpreter at the moment of the raise)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hermes.cli import main
from hermes.pipelines.synthetic import write_synthetic_video

TINY = ["--model", "tiny-llava-onevision", "--quiet"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Paths the table refers to by name: a real video, a folder, a plain file, non-UTF-8 bytes."""
    root = tmp_path_factory.mktemp("bad")
    paths = {
        "video": write_synthetic_video(root / "clip.mp4", duration_s=4.0, fps=5.0),
        "dir": root / "folder",
        "file": root / "plain.txt",
        "latin1": root / "latin1.jsonl",
        "badkey": root / "badkey.jsonl",
        "yaml_dir": root / "yaml_dir",
        "bad_yaml": root / "bad.yaml",
        "latin1_yaml": root / "latin1.yaml",
        "mp4_dir": root / "dir.mp4",
        "missing": root / "missing.mp4",
        "text_mp4": root / "notes.mp4",
        "nowhere": root / "no" / "such" / "folder" / "out.json",
    }
    paths["dir"].mkdir()
    paths["yaml_dir"].mkdir()
    paths["mp4_dir"].mkdir()
    paths["file"].write_text("not a directory\n")
    paths["text_mp4"].write_text("this is not a video\n" * 20)
    paths["latin1"].write_bytes('{"question": "caf\xe9?"}\n'.encode("latin-1"))
    paths["badkey"].write_text('{"question": "what?", "at": 2}\n')
    paths["bad_yaml"].write_text("memory: [unclosed\n")
    paths["latin1_yaml"].write_bytes("memory:\n  global_query: caf\xe9\n".encode("latin-1"))
    return paths


R = ["run", "{video}", *TINY, "--ask", "q"]  # a run that would succeed, for flags to spoil

CASES = [
    # (argv, exit code, text the one line must hold)
    # ---- top level and argparse
    ([], 2, "a COMMAND is required"),
    (["bogus"], 2, "invalid choice: 'bogus'"),
    (["--log-level", "loud", "info"], 2, "invalid choice: 'loud'"),
    (["run"], 2, "the following arguments are required: source"),
    (["run", "{video}", "--frobnicate"], 2, "unrecognized arguments: --frobnicate"),
    (["run", "\udcff\udcfe.mp4", "--ask", "q"], 2, "is not UTF-8 text"),
    # ---- run: SOURCE
    (["run", "", "--ask", "q"], 2, "SOURCE is empty"),
    (["run", "{missing}", "--ask", "q"], 3, "video file not found"),
    (["run", "{file}", "--ask", "q"], 3, "not a readable video"),
    (["run", "{mp4_dir}", *TINY, "--ask", "q"], 3, "no images"),
    (["run", "ftp://host/clip.mp4", *TINY, "--ask", "q"], 3, "unsupported source scheme 'ftp'"),
    # ---- run: memory directory in an object store
    (["run", "{video}", *TINY, "--ask", "q", "--memory-dir", "s3://Not_A_Bucket/x"], 2, "is not an S3 bucket name"),
    (["run", "{video}", *TINY, "--ask", "q", "--memory-dir", "gs://bucket/x"], 2, "gs:// is not supported"),
    (["run", "{video}", *TINY, "--ask", "q", "--memory-dir", "s3://mem/x", "--read-only"], 2,
     "--read-only answers from the stream another process writes"),
    # ---- run: questions
    (["run", "{video}", *TINY], 2, "no question to answer"),
    (["run", "{video}", *TINY, "--at", "1", "--ask", "q"], 2, "--at 1 comes before any --ask"),
    ([*R, "--at", "1", "--at", "2"], 2, "already has --at 1"),
    ([*R, "--at", "nan"], 2, "--at expects a non-negative number of seconds, found 'nan'"),
    ([*R, "--at", "-2"], 2, "--at expects a non-negative number of seconds"),
    ([*R, "--at", "soon"], 2, "--at expects a number of seconds, found 'soon'"),
    ([*R, "--at", "99"], 2, "past the end of the video"),
    ([*R, "--questions", "{dir}"], 2, "--questions expects a JSONL file, found a directory"),
    ([*R, "--questions", "{missing}"], 2, "questions file not found"),
    ([*R, "--questions", "{latin1}"], 2, "latin1.jsonl:1: not UTF-8 text"),
    ([*R, "--questions", "{badkey}"], 2, "unknown key 'at' (did you mean 'at_s'?)"),
    ([*R, "--ask", "word " * 1500], 2, "more than the 1024 positions kept for a question"),
    (["run", "{video}", *TINY, "--ask-every", "2"], 2, "--ask-every S repeats the --ask questions"),
    # ---- run: numeric flags (sugar for config keys) and time flags
    ([*R, "--fps", "0"], 2, "stream.fps: expected a positive number, found 0"),
    ([*R, "--fps", "-1"], 2, "stream.fps: expected a positive number"),
    ([*R, "--fps", "nan"], 2, "stream.fps: expected float, found 'nan'"),
    ([*R, "--fps", ".inf"], 2, "stream.fps: expected a finite number"),
    ([*R, "--chunk-frames", "0"], 2, "stream.chunk_frames: expected a positive whole number"),
    ([*R, "--chunk-frames", "1.5"], 2, "stream.chunk_frames: expected int, found 1.5"),
    ([*R, "--max-new-tokens", "0"], 2, "model.max_new_tokens: expected a positive whole number"),
    ([*R, "--max-new-tokens", "-3"], 2, "model.max_new_tokens: expected a positive whole number"),
    ([*R, "--ask-every", "0"], 2, "--ask-every expects a positive number of seconds"),
    ([*R, "--ask-every", "inf"], 2, "--ask-every expects a positive number of seconds"),
    ([*R, "--reconnect-timeout", "-1"], 2, "--reconnect-timeout expects a positive number"),
    ([*R, "--device", "gpu"], 2, "model.device: expected auto, cpu, cuda or cuda:N, found 'gpu'"),
    # ---- run: configuration (enumerations come from the dataclasses' Literal types)
    ([*R, "--set", "memory.dram_dtype=int4"], 2, "memory.dram_dtype: expected one of int8, fp16, found 'int4'"),
    ([*R, "--set", "memory.recall_share=0.5"], 2, "memory.recall_share=0.5 applies only with memory.recall=true"),
    ([*R, "--memory", "hermes-plus", "--set", "memory.recall=false"], 2,
     "memory.recall_gate=question, memory.recall_share=0.5 applies only with memory.recall=true"),
    ([*R, "--set", "memory.policy=hermse"], 2, "expected one of full, hermes, sliding, uniform, recent-frames, rekv, "
                                              "dscache, found 'hermse' (did you mean 'hermes'?)"),
    ([*R, "--set", "memory.reindex=fast"], 2, "memory.reindex: expected one of lazy, eager"),
    ([*R, "--set", "stream.backend=ffmpeg"], 2, "stream.backend: expected one of auto, decord, opencv"),
    ([*R, "--set", "model.dtype=int3"], 2, "model.dtype: expected one of auto"),
    ([*R, "--set", "model.attn_implementation=flash"], 2, "model.attn_implementation: expected one of sdpa, eager"),
    ([*R, "--set", "model.family=qwen9_vl"], 2, "model.family: expected one of , llava_onevision, qwen2_vl"),
    ([*R, "--set", "memory.budget=0"], 2, "memory.budget: expected a positive whole number, found 0"),
    ([*R, "--set", "memory.budget=-5"], 2, "memory.budget: expected a positive whole number"),
    ([*R, "--set", "memory.recall_top_k=0"], 2, "memory.recall_top_k: expected a positive whole number"),
    ([*R, "--set", "memory.sink_tokens=-1"], 2, "memory.sink_tokens: expected at least 0"),
    ([*R, "--set", "memory.checkpoint_every=0"], 2, "memory.checkpoint_every: expected a positive whole number"),
    ([*R, "--set", "memory.disk_bytes=0"], 2, "memory.disk_bytes: expected a positive whole number"),
    ([*R, "--set", "memory.dram_bytes=-1"], 2, "memory.dram_bytes: expected at least 0"),
    ([*R, "--set", "memory.w0=1.5"], 2, "memory.w0: expected between 0 and 1, found 1.5"),
    ([*R, "--set", "memory.recency_k=.nan"], 2, "memory.recency_k: expected a finite number"),
    ([*R, "--set", "memory.bands=[0.5, 0.6, 0.3]"], 2, "memory.bands: expected three fractions summing to 1"),
    ([*R, "--set", "memory.budget=40000"], 2, "does not fit the 32768 positions"),
    ([*R, "--set", "memory.budgit=4"], 2, "unknown config key 'memory.budgit' (did you mean 'memory.budget'?)"),
    ([*R, "--set", "budget"], 2, "--set expects key=value"),
    ([*R, "--memory", "hermes-5k"], 2, "unknown memory preset 'hermes-5k'"),
    ([*R, "--config", "{missing}"], 2, "config file not found"),
    ([*R, "--config", "{yaml_dir}"], 2, "--config expects a YAML file, found a directory"),
    ([*R, "--config", "{bad_yaml}"], 2, "not valid YAML"),
    ([*R, "--config", "{latin1_yaml}"], 2, "not UTF-8 text"),
    ([*R, "--config", "smolvlm2-50m"], 2, "did you mean 'smolvlm2-500m'?"),
    ([*R, "--memory-dir", "{file}"], 2, "--memory-dir expects a directory, found a file"),
    ([*R, "--resume"], 2, "--resume continues a stream saved in a memory directory"),
    # ---- run: model (exit 4), refused before anything loads
    (["run", "{video}", "--model", "llava-onevison-7b", "--ask", "q"], 4,
     "unknown model 'llava-onevison-7b' (did you mean 'llava-onevision-7b'?)"),
    (["run", "{video}", "--model", "./no/such/checkpoint", "--ask", "q"], 4, "local directory not found"),
    # ---- demo
    (["demo", "--output", "{file}"], 2, "--output expects a directory, found a file"),
    (["demo", "--memory", "nope"], 2, "unknown memory preset 'nope'"),
    (["demo", "--set", "memory.budget=0"], 2, "memory.budget: expected a positive whole number"),
    (["demo", "--set", "stream.fps=0"], 2, "stream.fps: expected a positive number"),
    (["demo", "--device", "gpu"], 2, "model.device: expected auto, cpu, cuda or cuda:N"),
    (["demo", "--set", "memory.dram_dtype=int4"], 2, "memory.dram_dtype: expected one of int8, fp16"),
    # ---- bench memory / sweep / tiers: checked before a model is built or anything measured
    (["bench"], 2, "the following arguments are required: SUITE"),
    (["bench", "memory", "--lengths", "0,64"], 2, "--lengths expects positive integers"),
    (["bench", "memory", "--lengths", "a"], 2, "--lengths expects comma-separated integers"),
    (["bench", "memory", "--budget", "0"], 2, "memory.budget: expected a positive whole number"),
    (["bench", "memory", "--budget", "x"], 2, "argument --budget: invalid int value: 'x'"),
    (["bench", "memory", "--chunk-frames", "0"], 2, "stream.chunk_frames: expected a positive whole number"),
    (["bench", "memory", "--output", "{dir}"], 2, "--output expects a file, found a directory"),
    (["bench", "memory", "--output", "{nowhere}"], 2, "does not exist (create it first)"),
    (["bench", "reference", "--ref-dir", "{missing}"], 2, "no such directory (give a checkout of the HERMES"),
    (["bench", "reference", "--ref-dir", "{dir}"], 2, "is not a HERMES reference checkout: inference/llavaov_hermes.py"),
    (["bench", "reference", "--ref-dir", "{dir}", "--geometries", "4by64"], 2, "--geometries expects LAYERSxWIDTH"),
    (["bench", "reference", "--ref-dir", "{dir}", "--frames", "0"], 2, "argument --frames: expected a positive whole number"),
    (["bench", "reference", "--ref-dir", "{dir}", "--rounds", "0"], 2, "argument --rounds: expected a positive whole number"),
    (["bench", "memory", "--stream-repeats", "0"], 2, "argument --stream-repeats: expected a positive whole number"),
    (["bench", "overhead", "--frames", "0"], 2, "argument --frames: expected a positive whole number"),
    (["bench", "overhead", "--output", "{dir}"], 2, "--output expects a file, found a directory"),
    (["bench", "memory", "--arch", "gpt-9"], 2, "argument --arch: invalid choice: 'gpt-9'"),
    (["bench", "memory", "--arch", "cpu-small", "--model", "tiny-llava-onevision"], 2, "not both"),
    (["bench", "memory", "--num-layers", "0"], 2, "argument --num-layers: expected a positive whole number"),
    (["bench", "memory", "--set", "memory.dram_dtype=int4"], 2, "memory.dram_dtype: expected one of"),
    (["bench", "sweep", "--decode-tokens", "0"], 2, "argument --decode-tokens: expected a positive whole number"),
    (["bench", "sweep", "--repeats", "0"], 2, "argument --repeats: expected a positive whole number"),
    (["bench", "sweep", "--chunk-frames", "8,x"], 2, "--chunk-frames expects comma-separated integers"),
    (["bench", "sweep", "--markdown", "{dir}"], 2, "--markdown expects a file, found a directory"),
    (["bench", "sweep", "--dtype", "int4"], 2, "model.dtype: expected one of"),
    (["bench", "tiers", "--records", "0"], 2, "--records expects positive integers"),
    (["bench", "tiers", "--write-mib", "0"], 2, "argument --write-mib: expected a positive whole number"),
    (["bench", "tiers", "--output", "{dir}"], 2, "--output expects a file, found a directory"),
    (["bench", "serve", "--stream-fps", "inf"], 2, "argument --stream-fps: expected a positive number, found 'inf'"),
    (["bench", "chaos", "--kills", "0"], 2, "argument --kills: expected a positive whole number, found '0'"),
    # ---- eval (its own checks live in hermes.datasets.cli)
    (["eval"], 2, "the following arguments are required"),
    (["eval", "ovo-bench"], 2, "eval needs --data-root DIR"),
    (["eval", "ovo-bench", "--data-root", "{dir}", "--set", "memory.dram_dtype=int4"], 2,
     "memory.dram_dtype: expected one of int8, fp16"),
    (["eval", "ovo-bench", "--data-root", "{dir}", "--device", "gpu"], 2, "model.device: expected auto"),
    # ---- memory inspect / verify
    (["memory"], 2, "the following arguments are required: ACTION"),
    (["memory", "inspect", "{dir}"], 2, "is not a memory directory"),
    (["memory", "verify", "{file}"], 2, "is not a memory directory"),
    (["memory", "inspect", "{dir}", "--records", "0"], 2, "expected a positive whole number, found '0'"),
    # ---- serve: refused before the model loads (and before anything listens)
    (["serve", *TINY[:2], "--host", "0.0.0.0"], 2, "--host 0.0.0.0 listens beyond this machine: give --api-key"),
    (["serve", *TINY[:2], "--port", "0"], 2, "expected a TCP port 1-65535, found '0'"),
    (["serve", *TINY[:2], "--port", "70000"], 2, "expected a TCP port 1-65535, found '70000'"),
    (["serve", *TINY[:2], "--port", "http"], 2, "expected a TCP port 1-65535, found 'http'"),
    (["serve", *TINY[:2], "--memory", "hermes-5k"], 2, "unknown memory preset 'hermes-5k'"),
    (["serve", *TINY[:2], "--api-key", "short"], 2, "the API key is 5 characters; use at least 16"),
    (["serve", *TINY[:2], "--memory-root", "{file}"], 2, "--memory-root expects a directory, found a file"),
    (["serve", *TINY[:2], "--memory-root", "s3://Not_A_Bucket/x"], 2, "--memory-root s3://Not_A_Bucket/x: 'Not_A_B"),
    (["serve", *TINY[:2], "--allow-source", "videos"], 2, "--allow-source videos: expected a URL pattern"),
    (["serve", *TINY[:2], "--allow-source", "ftp://host/*"], 2, "unknown scheme 'ftp'"),
    (["serve", *TINY[:2], "--max-streams", "0"], 2, "expected a positive whole number, found '0'"),
    (["serve", *TINY[:2], "--max-push-fps", "-1"], 2, "expected a positive number, found '-1'"),
    (["serve", *TINY[:2], "--set", "memory.budget=0"], 2, "memory.budget: expected a positive whole number"),
    (["serve", "--model", "llava-onevison-7b"], 4, "unknown model 'llava-onevison-7b' (did you mean"),
    # ---- pull / models / info
    (["pull"], 2, "the following arguments are required: MODEL"),
    (["pull", "smolvlm-500m"], 4, "unknown model 'smolvlm-500m' (did you mean"),
    (["pull", "org/model", "--local-dir", "{file}"], 2, "--local-dir expects a directory, found a file"),
    (["models", "--bogus"], 2, "unrecognized arguments: --bogus"),
    (["info", "--bogus"], 2, "unrecognized arguments: --bogus"),
]


def fill(argv, files) -> list[str]:
    return [a.format(**files) if "{" in a else a for a in argv]


@pytest.mark.parametrize("argv, code, message", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_input_is_one_line_and_its_exit_code(files, capsys, argv, code, message):
    got = main(fill(argv, files))
    out, err = capsys.readouterr()
    assert got == code, err
    assert message in err, err
    assert err.count("\n") == 1 and err.startswith("hermes-video: error: "), err
    assert "Traceback" not in err and "internal error" not in err


def test_yaml_1_1_exponents_are_numbers_not_strings():
    """PyYAML reads `1e-9` (no dot) as a string; a numeric key takes it as the number it spells."""
    from hermes.config import build_config

    cfg = build_config(model="tiny-llava-onevision", overrides=["memory.recency_k=1e-9", "memory.budget=2e3"])
    assert cfg.memory.recency_k == 1e-9 and cfg.memory.budget == 2000


@pytest.mark.slow
def test_non_utf8_typed_questions_are_exit_2(files, tmp_path):
    result = subprocess.run([sys.executable, "-m", "hermes", "run", str(files["video"]), *TINY, "--interactive"],
                            input=b"what is there?\n\xff\xfe\n", capture_output=True, env=offline_env())
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert "standard input line 2 is not UTF-8 text" in err and "Traceback" not in err


def offline_env() -> dict:
    return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


# What the subprocess runs: `main(argv)`, recording at each HermesError whether torch or transformers
# had been imported at that moment.
PROBE = """
import json, sys
import hermes.errors as errors
seen = []
init = errors.HermesError.__init__
def record(self, *args):
    seen.append(sorted(m for m in ("torch", "transformers") if m in sys.modules))
    init(self, *args)
errors.HermesError.__init__ = record
from hermes.cli import main
code = main(json.loads(sys.argv[1]))
print(json.dumps({"code": code, "heavy_at_raise": seen}))
"""

EARLY = [
    (["run", "{missing}", "--ask", "q"], 3),
    (["run", "{text_mp4}", "--ask", "q"], 3),
    (["run", "{file}", "--ask", "q"], 3),
    (["run", "", "--ask", "q"], 2),
    (["run", "{video}", "--ask", "q", "--fps", "0"], 2),
    (["run", "{video}", "--ask", "q", "--ask", "r", "--at", "-1"], 2),
    (["run", "{video}", "--ask", "q", "--set", "memory.dram_dtype=int4"], 2),
    (["run", "{video}", "--ask", "q", "--memory", "hermes-5k"], 2),
    (["run", "{video}", "--ask", "q", "--config", "{missing}"], 2),
    (["run", "{video}", "--questions", "{badkey}"], 2),
    (["run", "{video}"], 2),
    (["run", "{video}", "--ask", "q", "--model", "llava-onevison-7b"], 4),
    (["demo", "--output", "{file}"], 2),
    (["demo", "--set", "memory.dram_dtype=int4"], 2),
    (["eval", "ovo-bench", "--data-root", "{dir}", "--set", "memory.dram_dtype=int4"], 2),
    (["bench", "memory", "--set", "model.family=qwen9_vl"], 2),
    (["bench", "memory", "--output", "{dir}"], 2),
    (["bench", "sweep", "--set", "memory.budget=0"], 2),
    (["serve", "--host", "0.0.0.0"], 2),
    (["serve", "--memory", "hermes-5k"], 2),
    (["serve", "--allow-source", "ftp://host/*"], 2),
    (["serve", "--model", "llava-onevison-7b"], 4),
    (["serve", "--replicas", "2"], 2),
    (["serve", "--engine", "ray"], 2),
    (["bench", "reference", "--ref-dir", "{dir}"], 2),
    (["bench", "device", "--sections", "gpu"], 2),
    (["bench", "gc", "--frames", "1"], 2),
    (["bench", "ingest", "--fps", "0"], 2),
]


@pytest.mark.parametrize("argv, code", EARLY, ids=[" ".join(c[0])[:50] for c in EARLY])
def test_errors_are_raised_before_torch_is_imported(files, argv, code):
    result = subprocess.run([sys.executable, "-c", PROBE, json.dumps(fill(argv, files))],
                            capture_output=True, text=True, env=offline_env(), cwd=Path(__file__).parents[1])
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["code"] == code, result.stderr
    assert report["heavy_at_raise"] and report["heavy_at_raise"][0] == [], report


@pytest.mark.slow
def test_decoder_noise_stays_off_stderr(tmp_path):
    """FFmpeg inside decord prints hundreds of lines on a damaged file; the user sees one (fd-level check)."""
    pytest.importorskip("av")
    from tests.pipelines import video_fixtures as vf

    video = vf.write_corrupted_video(tmp_path / "corrupt.mp4")
    argv = [sys.executable, "-m", "hermes", "run", str(video), *TINY, "--ask", "q"]
    result = subprocess.run(argv, capture_output=True, text=True, env=offline_env())
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1 and "truncated or corrupt" in result.stderr, result.stderr[:500]
    debug = subprocess.run(argv + ["--log-level", "debug"], capture_output=True, text=True, env=offline_env())
    assert debug.returncode == 3 and debug.stderr.count("\n") > 1  # asked for: the decoder's own messages


def test_a_text_file_named_mp4_is_one_line_with_no_decoder_log(files):
    """Refused before the model (and decord) load: stderr, read at the descriptor, is our line alone;
    decord's own "ERROR opening" line leaked there when the file reached it."""
    result = subprocess.run([sys.executable, "-m", "hermes", "run", str(files["text_mp4"]), *TINY, "--ask", "q"],
                            capture_output=True, text=True, env=offline_env())
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith("hermes-video: error: not a readable video:"), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


def test_more_bad_values_are_one_line_errors(tmp_path, capsys, monkeypatch):
    # found by review: each gave an internal error or failed only after the model had loaded
    from hermes.config import build_config
    from hermes.errors import ConfigError

    with pytest.raises(ConfigError, match="accumulate_decay: expected below 1 with memory.accumulation=ema"):
        build_config(overrides=["memory.accumulation=ema", "memory.accumulate_decay=1"])
    cache_file = tmp_path / "not-a-cache"
    cache_file.write_text("x")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache_file))
    assert main(["models"]) == 4
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "cannot read the Hugging Face cache" in err
    assert main(["run", "http://127.0.0.1:abc/x.mp4", "--model", "tiny-llava-onevision", "--ask", "q"]) == 3
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "invalid URL" in err and "internal error" not in err


def test_serve_refuses_a_port_in_use_before_the_model_loads(capsys, monkeypatch):
    import socket

    monkeypatch.delenv("HERMES_API_KEY", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--model", "tiny-llava-onevision", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in err
