"""An lmms-eval model plugin: `lmms-eval --model hermes ...` runs our streaming memory inside lmms-eval's
tasks (entry point `lmms_eval.models`, lmms-eval 0.7 `registry_v2`; README shows the command).

Each request's video streams through a `StreamingSession` under the chosen memory, then the task's
prompt is asked; consecutive requests on one video reuse the stream (an answer leaves memory as it was).
Images are frames one second apart. No `loglikelihood`: hermes answers by generation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

try:  # the base class exists only where lmms-eval is installed (it is what imports this module)
    from lmms_eval.api.model import lmms as _LmmsBase
except ImportError:  # pragma: no cover - exercised in the tests without lmms-eval
    _LmmsBase = object

MODEL_ID = "hermes"


def manifest():
    """The entry point's payload: a ModelManifest naming `HermesLMM`."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return ModelManifest(model_id=MODEL_ID, simple_class_path=f"{__name__}.HermesLMM")


def _truncate(text: str, until) -> str:
    stops = [until] if isinstance(until, str) else list(until or [])
    cut = min((text.find(s) for s in stops if s and s in text), default=-1)
    return text if cut < 0 else text[:cut]


class HermesLMM(_LmmsBase):
    """lmms-eval "simple" model over a hermes StreamingSession.

    Args (lmms-eval `--model_args key=value,...`):
        model: hermes model preset, hub id, local directory or builtin tiny-*.
        memory: memory preset (configs/memory), default hermes-4k.
        fps: frames sampled per second of video (default: the model preset's).
        device: auto, cpu, cuda, cuda:N.
        max_new_tokens: answer length cap when the task does not give one.
        config: a hermes YAML config file.
        loaded_model: an adapter already loaded (tests, notebooks) instead of `model`.
    """

    is_simple = True

    def __init__(self, model: str = "auto", memory: str = "hermes-4k", fps: float | str | None = None,
                 device: str | None = None, max_new_tokens: int | str | None = None, config: str | None = None,
                 loaded_model=None, **unused: Any) -> None:
        if _LmmsBase is not object:
            super().__init__()
        else:
            self.task_dict = {}
        from hermes.config import build_config

        overrides = []
        if fps is not None:
            overrides.append(f"stream.fps={float(fps):g}")
        if device:
            overrides.append(f"model.device={device}")
        if max_new_tokens is not None:
            overrides.append(f"model.max_new_tokens={int(max_new_tokens)}")
        self.cfg = build_config(model=model, memory=memory, config_file=config, overrides=overrides)
        if loaded_model is None:
            from hermes.models.loading import load_model

            loaded_model = load_model(self.cfg.model)
        self.model = loaded_model
        self._stream: tuple[str, Any, Any] | None = None  # (video key, session, frame source)

    def generate_until(self, requests) -> list[str]:
        """One reply per request: stream its visuals, then ask its context."""
        replies = []
        for context, gen_kwargs, doc_to_visual, doc_id, task, split in [r.args for r in requests]:
            visuals = doc_to_visual(self.task_dict[task][split][doc_id]) if doc_to_visual is not None else []
            replies.append(self.answer(context, visuals if isinstance(visuals, list) else [visuals], gen_kwargs or {}))
        self._close_stream()
        return replies

    def generate_until_multi_round(self, requests) -> list[str]:
        return self.generate_until(requests)

    def loglikelihood(self, requests):
        raise NotImplementedError("hermes answers by generation; choose a task with output_type generate_until")

    def answer(self, context: str, visuals: list, gen_kwargs: dict) -> str:
        """Stream `visuals` (a video path, or images) through memory and answer `context`."""
        session = self._session(visuals, int(gen_kwargs.get("max_new_tokens") or self.cfg.model.max_new_tokens))
        return _truncate(session.ask(context).answer, gen_kwargs.get("until"))

    def _session(self, visuals: list, max_new_tokens: int):
        from hermes.pipelines.frames import Frame
        from hermes.pipelines.session import StreamingSession

        from .record_frames import open_record_frames
        from .records import VideoRecord

        paths = [v for v in visuals if isinstance(v, (str, Path))]
        key = str(paths[0]) if paths else None  # images carry no identity that outlives the request
        if key is not None and self._stream is not None and self._stream[0] == key:
            session = self._stream[1]
            session.max_new_tokens = max_new_tokens
            return session
        self._close_stream()
        source = None
        if paths:
            record = VideoRecord(video_id=Path(key).stem, video_path=Path(key), duration=None, questions=[])
            source = open_record_frames(record, self.cfg.stream.fps, self.cfg.stream.backend)
            frames = source.frames
        else:  # PIL images (image tasks): one frame a second
            frames = [Frame(index=i, t_s=float(i), rgb=np.asarray(img.convert("RGB"))) for i, img in enumerate(visuals)]
        session = StreamingSession(self.model, self.cfg.memory, frames, chunk_frames=self.cfg.stream.chunk_frames,
                                   max_new_tokens=max_new_tokens)
        session.advance()
        self._stream = (key, session, source)
        return session

    def _close_stream(self) -> None:
        if self._stream is not None:
            _, session, source = self._stream
            session.close()
            if source is not None:
                source.close()
            self._stream = None
