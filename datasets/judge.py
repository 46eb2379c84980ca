"""Scoring open-ended replies (RVS) with a language-model judge, by the Video-ChatGPT prompt that ReKV's
eval/eval_open_ended.py sends, its reply read by ReKV's rules (`parse_judge_reply`), so numbers compare.

`LocalJudge` runs a transformers causal LM (greedy); `HttpJudge` an OpenAI-compatible endpoint over
`urllib`, its API key read from the environment at request time, never stored or logged, and redirects
refused so the key never reaches another host.
"""

from __future__ import annotations

import ast
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Protocol

from hermes.errors import ModelError, UsageError
from hermes.redact import redact_url

# Exactly as ReKV's eval_open_ended.py sends it: its string pieces join without newlines around
# "------" and after "##INSTRUCTIONS: " (Video-ChatGPT's original has them; ReKV's numbers do not).
JUDGE_SYSTEM = (
    "You are an intelligent chatbot designed for evaluating the correctness of generative outputs for "
    "question-answer pairs. Your task is to compare the predicted answer with the correct answer and determine if "
    "they match meaningfully. Here's how you can accomplish the task:------##INSTRUCTIONS: "
    "- Focus on the meaningful match between the predicted answer and the correct answer.\n"
    "- Consider synonyms or paraphrases as valid matches.\n"
    "- Evaluate the correctness of the prediction compared to the answer."
)
JUDGE_USER = (
    "Please evaluate the following video-based question-answer pair:\n\n"
    "Question: {question}\nCorrect Answer: {reference}\nPredicted Answer: {reply}\n\n"
    "Provide your evaluation only as a yes/no and score where the score is an integer value between 0 and 5, "
    "with 5 indicating the highest meaningful match. Please generate the response in the form of a Python "
    "dictionary string with keys 'pred' and 'score', where value of 'pred' is  a string of 'yes' or 'no' and "
    "value of 'score' is in INTEGER, not STRING.DO NOT PROVIDE ANY OTHER OUTPUT TEXT OR EXPLANATION. Only "
    "provide the Python dictionary string. For example, your response should look like this: "
    "{{'pred': 'yes', 'score': 4.8}}."
)

JUDGE_KINDS = ("local", "http")
DEFAULT_LOCAL_JUDGE = "Qwen/Qwen2.5-7B-Instruct"
# HTTP statuses worth retrying: rate limits and transient server trouble.
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


@dataclass
class JudgeConfig:
    """Which judge scores open-ended replies.

    Attributes:
        kind: "local" (transformers model) or "http" (OpenAI-compatible endpoint).
        model: Local: hub id or directory. HTTP: the endpoint's model name (required).
        revision: Local hub models: the commit to load; set it (a commit hash) so the judge
            cannot change under a rerun. "" loads the default branch and is reported unpinned.
        base_url: HTTP: the server, e.g. "https://api.openai.com/v1" or "http://127.0.0.1:8000".
        api_key_env: HTTP: name of the environment variable holding the API key ("" for none).
        timeout_s: HTTP: seconds to wait for one response.
        max_retries: HTTP: further attempts after a timeout, 408/429 or 5xx.
        retry_backoff_s: HTTP: wait before the first retry, doubled for each further one.
        max_new_tokens: Length cap of the judge's reply.
        device: Local: "auto", "cpu", "cuda", ...
    """

    kind: str = "local"
    model: str = ""
    revision: str = ""
    base_url: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 60.0
    max_retries: int = 3
    retry_backoff_s: float = 1.0
    max_new_tokens: int = 64
    device: str = "auto"


class Judge(Protocol):
    """Anything that scores an open-ended reply against a reference."""

    def judge(self, question: str, reference: str, reply: str | None) -> dict:
        """Score one reply.

        Returns:
            {"verdict": True/False/None, "score": 0-5 or None, "raw": the judge's text}; a None verdict
            counts as answered but not scored.
        """

    def describe(self) -> dict:
        """What judged, for the results (never secrets)."""


def judge_messages(question: str, reference: str, reply: str | None) -> list[dict]:
    """The chat messages a judge is sent for one reply."""
    user = JUDGE_USER.format(question=question, reference=reference, reply=reply or "")
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def parse_judge_reply(raw: str | None) -> tuple[bool | None, float | None]:
    """Read a judge's reply by the rules of ReKV's eval_open_ended.py, so RVS numbers compare with ReKV's.

    ReKV keeps a reply only when the whole text is a Python literal (`ast.literal_eval`: literals
    only, nothing runs): a dict in prose or in a code fence, a bare "yes", keys without braces are
    dropped. Its averaging then reads `int(d['score'])` and `d['pred']` (or `d['prev']` when there is
    no 'pred') lower-cased: "yes" anywhere in it is yes, else "no" anywhere is no ("not sure" holds
    "no"), else the reply counts toward neither but its score still counts toward the mean score.
    A reply on which ReKV's averaging would stop with an error (not a dict, no score or one `int()`
    cannot read such as "4.5", no 'pred'/'prev', a 'pred' that is not a string) is dropped here.

    Args:
        raw: The judge's text (None when it produced none).

    Returns:
        (verdict, score): verdict True/False, or None when the reply says neither yes nor no or is
        dropped; score as given (a float; ReKV's mean score casts it to int), or None when dropped.
    """
    try:
        value = ast.literal_eval(raw) if isinstance(raw, str) else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None, None
    if not isinstance(value, dict):
        return None, None
    score, pred = value.get("score"), value["pred"] if "pred" in value else value.get("prev")
    try:
        whole = int(score)  # ReKV's cast: 4.8 -> 4, "4" -> 4, "4.5" fails
    except (TypeError, ValueError, OverflowError):
        return None, None
    if not isinstance(pred, str):
        return None, None
    pred = pred.lower()
    verdict = True if "yes" in pred else False if "no" in pred else None
    return verdict, float(score) if isinstance(score, (int, float)) else float(whole)


def _result(raw: str) -> dict:
    verdict, score = parse_judge_reply(raw)
    return {"verdict": verdict, "score": score, "raw": raw}


class LocalJudge:
    """A transformers causal LM as judge, greedy decoding.

    Args:
        config: The judge config (model id, revision, device, max_new_tokens).
        model: An already built causal LM (tests); None loads `config.model`.
        tokenizer: Its tokenizer; required with `model`.

    Raises:
        ModelError: The model cannot be loaded (offline, unknown id, bad directory).
    """

    def __init__(self, config: JudgeConfig, model=None, tokenizer=None) -> None:
        self.config = config
        if model is None:
            model, tokenizer = _load_causal_lm(config)
        self.model = model.eval()
        self.tokenizer = tokenizer
        # Models without a chat template (tiny test tokenizers) get ChatML, Qwen's format.
        self.template = "chat_template" if getattr(tokenizer, "chat_template", None) else "chatml"

    def render(self, messages: list[dict]) -> str:
        """The exact text the model reads."""
        if self.template == "chat_template":
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return turns + "<|im_start|>assistant\n"

    def judge(self, question: str, reference: str, reply: str | None) -> dict:
        """Score one reply (`Judge.judge`)."""
        import torch

        text = self.render(judge_messages(question, reference, reply))
        inputs = self.tokenizer(text, return_tensors="pt", add_special_tokens=False).to(self.model.device)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=self.config.max_new_tokens, do_sample=False,
                                      pad_token_id=pad)
        raw = self.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()
        return _result(raw)

    def describe(self) -> dict:
        """Kind, model, revision (and whether pinned), template and prompts."""
        return {
            "kind": "local", "model": self.config.model, "revision": self.config.revision or None,
            "pinned": bool(self.config.revision), "template": self.template,
            "max_new_tokens": self.config.max_new_tokens, "system": JUDGE_SYSTEM, "user_template": JUDGE_USER,
        }


def _load_causal_lm(config: JudgeConfig):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hermes.models.loading import resolve_device, resolve_dtype

    name = config.model or DEFAULT_LOCAL_JUDGE
    device = resolve_device(config.device)
    revision = config.revision or None
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, revision=revision)
        model = AutoModelForCausalLM.from_pretrained(name, revision=revision, dtype=resolve_dtype("auto", device))
    except Exception as exc:  # hub and loading errors come in many types; all mean "cannot load"
        offline = " (offline and not in the local cache)" if os.environ.get("HF_HUB_OFFLINE") else ""
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"cannot load judge model {name!r}{offline}: {first}; check --judge-model") from None
    return model.to(device), tokenizer


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuse redirects: one would send the API key to whatever host it names."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to another URL refused ({msg})", headers, fp)


class HttpJudge:
    """An OpenAI-compatible chat-completions endpoint as judge.

    Args:
        config: base_url, model, api_key_env, timeout_s, max_retries, retry_backoff_s.

    Raises:
        UsageError: No base URL or model, a URL that is not http(s), or the named API-key
            variable is not set.
    """

    def __init__(self, config: JudgeConfig) -> None:
        if not config.base_url or urllib.parse.urlsplit(config.base_url).scheme not in ("http", "https"):
            raise UsageError(f"HTTP judge needs --judge-url http(s)://host[:port][/v1], found {config.base_url!r}")
        if not config.model:
            raise UsageError("HTTP judge needs --judge-model (the endpoint's model name, e.g. gpt-4o-mini)")
        if config.api_key_env and not os.environ.get(config.api_key_env):
            raise UsageError(
                f"HTTP judge: environment variable {config.api_key_env} (the API key) is not set; set it, or pass "
                "--judge-api-key-env '' for a server without keys"
            )
        self.config = config
        base = config.base_url.rstrip("/")
        self.url = base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")
        self._opener = urllib.request.build_opener(_NoRedirect())

    def judge(self, question: str, reference: str, reply: str | None) -> dict:
        """Score one reply (`Judge.judge`).

        Raises:
            ModelError: The endpoint stays unreachable or answers an error after the retries.
        """
        body = {"model": self.config.model, "messages": judge_messages(question, reference, reply),
                "temperature": 0, "max_tokens": self.config.max_new_tokens}
        response = self._post(json.dumps(body).encode("utf-8"))
        try:
            raw = response["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            where = redact_url(self.url)
            raise ModelError(f"judge endpoint {where} answered without choices[0].message.content") from None
        return _result(str(raw or ""))

    def _post(self, payload: bytes) -> dict:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.config.api_key_env, "") if self.config.api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        where = redact_url(self.url)
        problem = ""
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                time.sleep(self.config.retry_backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=payload, headers=headers, method="POST")
            try:
                with self._opener.open(request, timeout=self.config.timeout_s) as reply:
                    return json.loads(reply.read().decode("utf-8"))
            except urllib.error.HTTPError as exc:
                problem = f"HTTP {exc.code} {exc.reason}"
                if exc.code not in _RETRY_STATUS:
                    break
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                problem = str(getattr(exc, "reason", exc)) or type(exc).__name__
            except (json.JSONDecodeError, UnicodeDecodeError):
                problem = "a response that is not JSON"
                break
        if key:
            problem = problem.replace(key, "***")
        raise ModelError(f"judge endpoint {where} failed ({problem}); check --judge-url and the server")

    def describe(self) -> dict:
        """Kind, endpoint (credentials removed), model, the key variable's name and prompts."""
        return {
            "kind": "http", "url": redact_url(self.url), "model": self.config.model,
            "api_key_env": self.config.api_key_env or None, "max_new_tokens": self.config.max_new_tokens,
            "system": JUDGE_SYSTEM, "user_template": JUDGE_USER,
        }


def build_judge(config: JudgeConfig) -> Judge:
    """The judge `config` describes.

    Raises:
        UsageError: Unknown kind, or an incomplete HTTP config.
        ModelError: A local judge model that cannot be loaded.
    """
    if config.kind == "local":
        return LocalJudge(config)
    if config.kind == "http":
        return HttpJudge(config)
    raise UsageError(f"unknown judge kind {config.kind!r}; use one of {', '.join(JUDGE_KINDS)}")

