"""Runs the authors' HERMES reference pipeline (a checkout the user gives) on a random-weight model.

`hermes-video bench reference` starts this file as a script under the reference's own interpreter
(`--ref-python`: the reference needs transformers 4.57.1); it imports nothing from hermes, so it runs
in that environment. No reference code is copied: the checkout's `inference/llavaov_hermes.py` is
imported from `--ref-dir` at run time and its own methods are called, chunk by chunk, as its
`video_qa/hermes_vqa.py` loop calls them: `encode_video_chunk`, then `predict_and_compress`; a
question is `question_answering`.

What is adapted, and why (the measurement needs it; the method is untouched):
- The reference's LLaVA file was written for a transformers 4.45 build, where `language_model` was
  the causal LM and pooling lived on the outer model. `_Adapted` points `language_model` at a
  causal LM over the same decoder and head, and `apply_pooling` at the inner model's.
- It keeps its cache as a list of (key, value) tuples, which 4.45 accepted: `LegacyCacheLM` converts
  them to a `DynamicCache` on the way in.
- Its rotary calls use the 4.45 signature `rotary(x, seq_len)`: the decoder's rotary module is
  wrapped to answer it too (`_table_rotary`).
- Its processor: a resize-and-normalise of our own at the model's image size, and a stand-in tokenizer that gives each text a fixed number of token ids, so that pseudo-queries and
  the question have exactly the lengths ours have (`predict_next_question` returns two marker texts
  whose lengths are those of our local and global pseudo-queries; its third, concatenated query gets
  their sum).

Input: one JSON file (`--spec`): the model config kwargs, seed, frames (.npy), chunk size, budget,
token counts, repeats. Output: one JSON line on stdout: per-chunk encode / maintenance ms and
whether the chunk evicted, TTFT ms per repeat, peak KV bytes, device peak bytes (CUDA).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import types


class _StandInTokenizer:
    """`tokenizer(text).input_ids` is `lengths[text]` ids (`lengths["prefix"]` for any other text), never
    the end-of-answer id `eos_token_id`."""

    def __init__(self, lengths: dict[str, int], vocab_size: int, eos_token_id: int) -> None:
        self.lengths, self.vocab_size, self.eos_token_id = lengths, vocab_size, eos_token_id

    def __call__(self, text: str, return_tensors: str | None = None, **_):
        n = self.lengths.get(text, self.lengths["prefix"])  # the one other text is the reference's system prompt
        ids = [(7 + i) % self.vocab_size for i in range(n)]
        ids = [i if i != self.eos_token_id else (i + 1) % self.vocab_size for i in ids]
        if return_tensors == "pt":
            import torch

            ids = torch.tensor([ids])
        return types.SimpleNamespace(input_ids=ids)

    def decode(self, ids, **_) -> str:
        return ""


class _VideoProcessor:
    """What the reference reads of a video processor, `(video (F, 3, H, W) uint8).pixel_values_videos`:
    a bicubic, antialiased resize to the tower's square input and SigLIP's normalisation, done as
    hermes does it (transformers' own processor would need torchvision and Pillow in that environment)."""

    def __init__(self, side: int, mean: float = 0.5, std: float = 0.5) -> None:
        self.side, self.mean, self.std = side, mean, std

    def __call__(self, video, return_tensors: str = "pt"):
        import torch.nn.functional as F

        pixels = F.interpolate(video.float(), size=(self.side, self.side), mode="bicubic", antialias=True,
                               align_corners=False).clamp_(0.0, 255.0) / 255.0
        return types.SimpleNamespace(pixel_values_videos=((pixels - self.mean) / self.std)[None])


def _table_rotary(inner):
    """The decoder's rotary module, also answering the 4.45 call `rotary(x, seq_len)` with (seq_len, D)
    cos/sin tables, which the reference's manual probe and re-rotation use."""
    import torch

    class TableOrPositions(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x, position_ids=None, seq_len=None):
            if seq_len is None and not isinstance(position_ids, torch.Tensor):
                seq_len = position_ids
            if seq_len is None:
                return self.inner(x, position_ids)
            cos, sin = self.inner(x, torch.arange(int(seq_len), device=x.device)[None])
            return cos[0], sin[0]

    return TableOrPositions()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref-dir", required=True)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args()
    spec = json.loads(open(args.spec).read())
    sys.path.insert(0, args.ref_dir)

    import numpy as np
    import torch
    from transformers import DynamicCache, LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration, Qwen2ForCausalLM

    class LegacyCacheLM(Qwen2ForCausalLM):
        """Takes the (key, value) tuples per layer the reference keeps its cache as (4.45 converted them)."""

        def forward(self, *args, past_key_values=None, **kwargs):
            if isinstance(past_key_values, (list, tuple)):
                past_key_values = DynamicCache.from_legacy_cache(past_key_values)
            return super().forward(*args, past_key_values=past_key_values, **kwargs)

    with contextlib.redirect_stdout(sys.stderr):  # the reference prints progress; stdout carries the result
        import inference.llavaov_hermes as reference

        # written for transformers 4.45, where `language_model` was the causal LM and pooling lived here
        reference.LlavaOneVision_Hermes.language_model = property(lambda self: self._causal_lm)
        reference.LlavaOneVision_Hermes.apply_pooling = lambda self, features: self.model.apply_pooling(features)

        torch.set_num_threads(spec.get("threads", 1))
        device = torch.device(spec.get("device", "cpu"))
        dtype = getattr(torch, spec.get("dtype", "float32"))
        config = LlavaOnevisionConfig(**spec["config"])
        torch.manual_seed(spec["seed"])
        net = LlavaOnevisionForConditionalGeneration(config).eval().to(device, dtype)
        decoder = net.model.language_model
        decoder.rotary_emb = _table_rotary(decoder.rotary_emb)
        causal = LegacyCacheLM(config.text_config)
        causal.model, causal.lm_head = net.model.language_model, net.lm_head  # shared, not copied
        object.__setattr__(net, "_causal_lm", causal.eval().to(device, dtype))  # a plain attribute, copied by load_model
        n_local, n_global = spec["pseudo_query_tokens"]
        lengths = {"local": n_local, "global": n_global, "local; global": n_local + n_global,
                   "question": spec["question_tokens"], "prefix": spec["prefix_tokens"]}
        processor = types.SimpleNamespace(
            tokenizer=_StandInTokenizer(lengths, config.text_config.vocab_size, spec["eos_token_id"]),
            video_processor=_VideoProcessor(config.vision_config.image_size))
        # the reference's own loader, with our random model and processor in place of downloaded ones
        reference.AutoProcessor = types.SimpleNamespace(from_pretrained=lambda *a, **k: processor)
        reference.LlavaOnevisionForConditionalGeneration = types.SimpleNamespace(from_pretrained=lambda *a, **k: net)
        model, _ = reference.load_model("random", kv_size=spec["budget"], device=str(device))
        model.predict_next_question = lambda: ("local", "global")  # pseudo-queries of our lengths

        frames = torch.from_numpy(np.load(spec["frames"]))  # (N, H, W, 3) uint8
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        model.encode_init_prompt()
        chunks, peak_kv = [], 0
        for start in range(0, frames.shape[0], spec["chunk_frames"]):
            sync()
            t0 = time.perf_counter()
            model.encode_video_chunk(frames[start:start + spec["chunk_frames"]])
            sync()
            t1 = time.perf_counter()
            before = model.kv_cache[0][0].shape[2]
            peak_kv = max(peak_kv, sum(k.nbytes + v.nbytes for k, v in model.kv_cache))
            model.predict_and_compress()
            sync()
            t2 = time.perf_counter()
            chunks.append({"encode_ms": (t1 - t0) * 1e3, "maintain_ms": (t2 - t1) * 1e3,
                           "evicted": model.kv_cache[0][0].shape[2] < before})
        ttfts = []
        for _ in range(spec["repeats"]):
            marks = []
            hook = net.model.language_model.register_forward_pre_hook(lambda *_: marks.append(time.perf_counter()))
            try:
                sync()
                t0 = time.perf_counter()
                model.question_answering({"prompt": "question", "question": "question"}, max_new_tokens=2,
                                         pseudo_forward=True)
            finally:
                hook.remove()
            ttfts.append((marks[1] - t0) * 1e3)  # the first decode step starts once the first token is read
        peak_device = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    print(json.dumps({"chunks": chunks, "ttft_ms": ttfts, "peak_kv_bytes": peak_kv,
                      "peak_device_bytes": peak_device, "transformers": __import__("transformers").__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
