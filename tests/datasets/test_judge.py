"""Judges of open-ended replies: the HTTP judge against a stub server on 127.0.0.1 (never any other
address), the local judge with a tiny random Qwen2, and RVS end to end. The verdict parser's rules:
test_judge_rekv_rules.py."""

from __future__ import annotations

import json
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hermes.config import build_config
from hermes.datasets.judge import JUDGE_SYSTEM, HttpJudge, JudgeConfig, LocalJudge
from hermes.datasets.runner import run_eval
from hermes.errors import ModelError, UsageError

FIXTURES = Path(__file__).parent / "fixtures"
SECRET = "sk-test-secret-1234"


class StubServer:
    """An OpenAI-compatible endpoint on 127.0.0.1 answering from a script of (status, body, delay_s)."""

    def __init__(self, script):
        self.script = list(script)
        self.requests = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                stub.requests.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
                status, payload, delay_s = stub.script.pop(0) if len(stub.script) > 1 else stub.script[0]
                time.sleep(delay_s)
                data = json.dumps(payload).encode()
                self.send_response(status)
                if status in (301, 302):
                    self.send_header("Location", f"http://127.0.0.1:{stub.port}/elsewhere")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (the timeout test): nothing to answer

            def log_message(self, *args):  # keep test output quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def completion(content: str) -> dict:
    return {"choices": [{"message": {"role": "assistant", "content": content}}]}


@pytest.fixture
def stub(monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)  # the stub is local: no proxy in between
    monkeypatch.setenv("JUDGE_TEST_KEY", SECRET)
    servers = []

    def start(*script):
        servers.append(StubServer(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def http_config(url: str, **kwargs) -> JudgeConfig:
    defaults = {"kind": "http", "base_url": url, "model": "judge-model", "api_key_env": "JUDGE_TEST_KEY",
                "timeout_s": 5.0, "max_retries": 2, "retry_backoff_s": 0.0}
    return JudgeConfig(**{**defaults, **kwargs})


@pytest.mark.parametrize("suffix", ["", "/v1"])
def test_http_judge_sends_the_prompt_and_reads_the_verdict(stub, suffix):
    server = stub((200, completion("{'pred': 'yes', 'score': 4}"), 0))
    result = HttpJudge(http_config(server.url + suffix)).judge("Who came in?", "A man.", "A man in a coat.")
    assert result == {"verdict": True, "score": 4.0, "raw": "{'pred': 'yes', 'score': 4}"}
    request = server.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == f"Bearer {SECRET}"
    body = request["body"]
    assert body["model"] == "judge-model" and body["temperature"] == 0
    assert body["messages"][0] == {"role": "system", "content": JUDGE_SYSTEM}
    assert "Question: Who came in?\nCorrect Answer: A man.\nPredicted Answer: A man in a coat." in \
        body["messages"][1]["content"]


def test_http_judge_retries_transient_errors(stub):
    server = stub((503, {"error": "busy"}, 0), (429, {"error": "slow down"}, 0),
                  (200, completion("{'pred': 'no', 'score': 0}"), 0))
    assert HttpJudge(http_config(server.url)).judge("q", "r", "x")["verdict"] is False
    assert len(server.requests) == 3


def test_http_judge_errors_are_one_line_without_the_key(stub):
    server = stub((401, {"error": f"bad key {SECRET}"}, 0))
    with pytest.raises(ModelError) as info:
        HttpJudge(http_config(server.url)).judge("q", "r", "x")
    message = str(info.value)
    assert "HTTP 401" in message and SECRET not in message and "\n" not in message
    assert len(server.requests) == 1  # an auth error is not retried


def test_http_judge_times_out_and_refuses_redirects(stub):
    delay_s = 2.0  # the server answers after this; the client gives up after its 0.2 s timeout
    slow = stub((200, completion("{}"), delay_s))
    started = time.perf_counter()
    with pytest.raises(ModelError, match="failed"):
        HttpJudge(http_config(slow.url, timeout_s=0.2, max_retries=1)).judge("q", "r", "x")
    # two attempts that waited for the answer would take 2 x delay_s: bounded by the server's delay, not a stopwatch
    assert time.perf_counter() - started < 2 * delay_s
    moved = stub((302, {}, 0))
    with pytest.raises(ModelError, match="302"):
        HttpJudge(http_config(moved.url)).judge("q", "r", "x")
    assert [r["path"] for r in moved.requests] == ["/v1/chat/completions"]  # the key went nowhere else


def test_http_judge_config_checks(stub, monkeypatch):
    server = stub((200, completion("{'pred': 'yes', 'score': 5}"), 0))
    with pytest.raises(UsageError, match="NO_SUCH_KEY_VAR"):
        HttpJudge(http_config(server.url, api_key_env="NO_SUCH_KEY_VAR"))
    with pytest.raises(UsageError, match="--judge-url"):
        HttpJudge(http_config("ftp://127.0.0.1/"))
    with pytest.raises(UsageError, match="--judge-model"):
        HttpJudge(http_config(server.url, model=""))
    HttpJudge(http_config(server.url, api_key_env="")).judge("q", "r", "x")
    assert "Authorization" not in server.requests[-1]["headers"]  # a keyless local server


def tiny_qwen():
    """A random 1-layer Qwen2 causal LM over the tiny tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hermes.models.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval(), tokenizer


def test_local_judge_with_a_tiny_model(monkeypatch):
    model, tokenizer = tiny_qwen()
    judge = LocalJudge(JudgeConfig(max_new_tokens=4), model=model, tokenizer=tokenizer)
    text = judge.render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    result = judge.judge("Who came in?", "A man.", "A man.")
    assert isinstance(result["raw"], str) and result["verdict"] in (True, False, None)  # random weights
    info = judge.describe()
    assert info["template"] == "chatml" and info["pinned"] is False and info["system"] == JUDGE_SYSTEM

    # What the judge reads back is the continuation after the prompt, whatever the model says.
    verdict_ids = tokenizer.encode("{'pred': 'yes', 'score': 5}", add_special_tokens=False)
    original = model.generate

    def generate(input_ids, **kwargs):
        import torch

        return torch.cat([input_ids, torch.tensor([verdict_ids])], dim=1)

    monkeypatch.setattr(model, "generate", generate)
    assert judge.judge("q", "r", "x") == {"verdict": True, "score": 5.0, "raw": "{'pred': 'yes', 'score': 5}"}
    monkeypatch.setattr(model, "generate", original)


def test_local_judge_that_cannot_load_is_a_model_error():
    with pytest.raises(ModelError, match="cannot load judge model") as info:
        LocalJudge(JudgeConfig(model="Qwen/Qwen2.5-7B-Instruct", device="cpu"))
    assert "\n" not in str(info.value)


def test_rvs_replies_recorded_then_judged_on_resume(stub, tiny_model, tmp_path):
    root = tmp_path / "rvs"
    shutil.copytree(FIXTURES / "rvs", root)  # RVS-Movie ships frames as .npy: 2 frames at 1 fps
    cfg = build_config(model="tiny-llava-onevision", overrides=["stream.fps=2", "model.max_new_tokens=4"])
    out = tmp_path / "out"
    first = run_eval("rvs-movie", root, cfg, output_dir=out, model=tiny_model, progress=False)
    assert first["accuracy"]["official"]["overall"] is None  # answered, not scored
    assert any("no judge" in note for note in first["notes"])
    (sample,) = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert (sample["frames_seen"], sample["last_frame_t_s"], sample["at_s"]) == (2, 1.0, 2.0)

    server = stub((200, completion("{'pred': 'yes', 'score': 4}"), 0))
    summary = run_eval("rvs-movie", root, cfg, output_dir=out, model=tiny_model, progress=False, resume=True,
                       judge=http_config(server.url))
    assert summary["accuracy"]["official"]["overall"] == 1.0
    assert summary["accuracy"]["official"]["mean_score"] == 4.0
    assert summary["judge"]["kind"] == "http" and summary["judge"]["api_key_env"] == "JUDGE_TEST_KEY"
    assert summary["judged_by"] == {"http:judge-model": 1} and not summary["notes"]
    lines = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert lines[-1]["judge_raw"] == "{'pred': 'yes', 'score': 4}" and lines[-1]["reply"] == sample["reply"]
    assert server.requests[0]["body"]["messages"][1]["content"].count("A man in a grey coat.") == 1
    for path in out.iterdir():
        assert SECRET not in path.read_text(errors="replace")
