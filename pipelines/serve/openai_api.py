"""The OpenAI chat protocol over `serve`'s streams: a thin translation, no question logic of its own.

`GET /v1/models` lists the streams as models; `POST /v1/chat/completions` asks one (``model``: its id
or name) through the native question path (`app`'s routes call `parse_chat`, then the same
`check_question` and scheduler as ``POST /v1/streams/{id}/questions``, then shape the answer here):

- the last ``user`` message's text is the question (earlier turns and system messages are not
  context: the stream's memory is); its ``image_url`` parts (``data:`` URIs, JPEG or PNG) are
  frames pushed to a push stream before the question is asked;
- decoding is greedy: ``temperature`` must be 0 or absent, ``n`` 1 (400 otherwise); ``max_tokens``
  (or ``max_completion_tokens``) above the native limit is lowered to it; ``stop`` cuts the answer
  before its first stop string;
- ``hermes``: the native fields ``at`` (stream seconds), ``options`` (multiple choice, answered with
  a letter) and ``recall``;
- ``stream: true``: ``chat.completion.chunk`` events, then ``data: [DONE]``; the deltas join to the
  plain answer;
- errors: ``{"error": {"message", "type", "param", "code"}}``, the native status but 400 for 422.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from hermes.errors import UsageError, did_you_mean

HERMES_KEYS = ("at", "options", "recall")
IMAGE_TYPES = ("image/jpeg", "image/jpg", "image/png")
MAX_STOPS = 4  # as OpenAI's API
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 409: "invalid_request_error", 413: "invalid_request_error",
               429: "rate_limit_error"}
ERROR_CODES = {401: "invalid_api_key", 404: "model_not_found", 413: "request_too_large",
               429: "rate_limit_exceeded", 503: "unavailable"}


def is_openai_path(path: str) -> bool:
    """Whether `path` is one of the OpenAI routes (their errors take OpenAI's shape)."""
    return path == "/v1/chat/completions" or path == "/v1/models" or path.startswith("/v1/models/")


def error_body(status: int, message: str) -> tuple[int, dict[str, Any]]:
    """(status, body) of an error in OpenAI's shape; a native 422 (bad input) is OpenAI's 400."""
    status = 400 if status == 422 else status
    return status, {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": None,
                              "code": ERROR_CODES.get(status)}}


def model_json(stream) -> dict[str, Any]:
    """A stream as an OpenAI model object, with its state (`status`: running, ended, error, ...)."""
    return {"id": stream.id, "object": "model", "created": int(stream.created_at), "owned_by": "hermes-video",
            "status": stream.status}


@dataclass
class ChatRequest:
    """A chat completion request, translated: the stream, the native question body and what shapes the reply."""

    model: str
    question: dict[str, Any]  # a native `POST /v1/streams/{id}/questions` body
    images: list[bytes]  # JPEG or PNG files of the last user message, in order
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with `usage`
    stop: tuple[str, ...]


def parse_chat(body: Any, max_new_tokens: int) -> ChatRequest:
    """Translate a `POST /v1/chat/completions` body (see the module docstring).

    Args:
        body: the decoded JSON body.
        max_new_tokens: the native limit on answer tokens; a larger ``max_tokens`` is lowered to it.

    Raises:
        UsageError: a body the translation cannot serve (400), naming the field.
    """
    if not isinstance(body, dict):
        raise UsageError('expected a JSON object with "model" and "messages"')
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise UsageError('"model" must be a stream id or name (GET /v1/models lists them)')
    if body.get("n") not in (None, 1):
        raise UsageError('"n" must be 1: a stream gives one answer per question')
    if body.get("temperature") not in (None, 0):
        raise UsageError('"temperature" must be 0: this server decodes greedily')
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise UsageError('"messages" must be a non-empty list of {"role", "content"}')
    last = next((m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), None)
    if last is None:
        raise UsageError('no "user" message: the last one is the question')
    text, images = user_content(last.get("content"))
    if not text.strip():
        raise UsageError("the last user message has no text: it is the question")
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else [] if stop is None else stop
    if not isinstance(stop, list) or len(stop) > MAX_STOPS or not all(isinstance(s, str) and s for s in stop):
        raise UsageError(f'"stop" must be a string or a list of at most {MAX_STOPS} non-empty strings')
    extra = body.get("hermes") or {}
    if not isinstance(extra, dict):
        raise UsageError(f'"hermes" must be an object with any of {", ".join(HERMES_KEYS)}')
    for key in extra:
        if key not in HERMES_KEYS:
            raise UsageError(f'unknown "hermes" key {key!r}{did_you_mean(key, HERMES_KEYS)}; it takes '
                             f'{", ".join(HERMES_KEYS)}')
    tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise UsageError('"max_tokens" must be a whole number >= 1')
    tokens = None if tokens is None else min(tokens, max_new_tokens)
    question = {"question": text, **extra, **({"max_new_tokens": tokens} if tokens is not None else {})}
    options = body.get("stream_options") or {}
    return ChatRequest(model, question, images, body.get("stream") is True,
                       isinstance(options, dict) and options.get("include_usage") is True, tuple(stop))


def user_content(content: Any) -> tuple[str, list[bytes]]:
    """(text, images) of a message's content: a string, or ``text`` and ``image_url`` parts."""
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise UsageError('a message\'s "content" must be a string or a list of parts')
    texts, images = [], []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            url = part.get("image_url")
            images.append(data_uri_bytes(url.get("url") if isinstance(url, dict) else url))
        else:
            raise UsageError(f'a content part of type {kind!r}: expected "text" or "image_url"')
    return "\n".join(texts), images


def data_uri_bytes(url: Any) -> bytes:
    """The file in a ``data:image/jpeg;base64,...`` (or PNG) URI; this server fetches no URL."""
    head, comma, data = url.partition(",") if isinstance(url, str) else ("", "", "")
    if not (comma and head.startswith("data:") and head.endswith(";base64") and head[5:-7].lower() in IMAGE_TYPES):
        raise UsageError('an "image_url" must be a base64 data: URI of a JPEG or PNG '
                         '(data:image/jpeg;base64,...); this server fetches no URL')
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise UsageError("an image's data: URI is not valid base64") from None


class TextCut:
    """The answer as sent: whitespace stripped at both ends (as the plain answer is), cut before the first
    stop string. `feed` takes each generated piece; it returns what may be sent now, holding back a tail
    that may still become whitespace at the end or the start of a stop string."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.hold = max((len(s) - 1 for s in stops), default=0)
        self.text = ""
        self.sent = 0
        self.stopped = False  # a stop string was found

    def feed(self, piece: str, last: bool = False) -> str:
        """The text that may be sent after `piece` (`last`: the answer is complete, hold nothing back)."""
        if self.stopped:
            return ""
        self.text = (self.text + piece).lstrip()
        ends = [i for s in self.stops if (i := self.text.find(s)) >= 0]
        self.stopped = bool(ends)
        cut = self.text[:min(ends)] if ends else self.text[:len(self.text) - (0 if last else self.hold)]
        cut = cut.rstrip()  # the text sent always ends with a non-space: a final strip takes nothing back
        out = cut[self.sent:]
        self.sent = max(self.sent, len(cut))
        return out


def usage(answer) -> dict[str, int]:
    """OpenAI's ``usage``: the tokens the answer attended to (memory, recall, question) and generated."""
    return {"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.completion_tokens,
            "total_tokens": answer.prompt_tokens + answer.completion_tokens}


def finish_reason(answer, stopped: bool, max_tokens: int) -> str:
    """``length`` when the answer ran to `max_tokens` (and no stop string cut it), else ``stop``."""
    return "length" if not stopped and answer.completion_tokens >= max_tokens else "stop"


def completion(chat: ChatRequest, answer, max_tokens: int) -> dict[str, Any]:
    """The ``chat.completion`` object of a plain (not streamed) answer."""
    cut = TextCut(chat.stop)
    text = cut.feed(answer.answer, last=True)
    return {"id": f"chatcmpl-{secrets.token_hex(12)}", "object": "chat.completion", "created": int(time.time()),
            "model": chat.model, "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                              "finish_reason": finish_reason(answer, cut.stopped, max_tokens)}],
            "usage": usage(answer)}


def data(obj: Any) -> str:
    """One server-sent event as OpenAI streams them: a ``data:`` line of JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def chunks(chat: ChatRequest, pieces: AsyncIterator, max_tokens: int) -> AsyncIterator[str]:
    """The server-sent events of a streamed answer.

    Args:
        chat: the request.
        pieces: the native path's answer text pieces as they are generated, then the `Answer`.
        max_tokens: the answer's token limit (for ``finish_reason``).
    """
    head = {"id": f"chatcmpl-{secrets.token_hex(12)}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": chat.model}

    def event(delta: dict, finish: str | None = None) -> str:
        return data({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    yield event({"role": "assistant", "content": ""})
    cut = TextCut(chat.stop)
    try:
        async for item in pieces:
            text = cut.feed(item) if isinstance(item, str) else cut.feed("", last=True)
            if text:
                yield event({"content": text})
            if not isinstance(item, str):
                yield event({}, finish_reason(item, cut.stopped, max_tokens))
                if chat.include_usage:
                    yield data({**head, "choices": [], "usage": usage(item)})
    except Exception as exc:  # noqa: BLE001 - the status line is sent: the error goes in the stream
        yield data(error_body(500, " ".join(str(exc).split()))[1])
    yield "data: [DONE]\n\n"
