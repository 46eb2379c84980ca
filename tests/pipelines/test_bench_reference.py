"""`bench reference` drives a reference checkout under another interpreter and compares it with ours.

CI has no reference environment, so the checkout is a stand-in the test writes: it offers the names
the driver uses (`load_model`, the model's `encode_video_chunk` / `predict_and_compress` /
`question_answering`, a cache kept as (key, value) tuples per layer) and logs what it was given.
The stand-in runs under this interpreter; the driver must work with whatever it finds there.
"""

import json
import sys

import numpy as np
import pytest

from hermes.config import MemoryConfig
from hermes.errors import HermesError
from hermes.pipelines.bench.common import synthetic_frames
from hermes.pipelines.bench.reference import Geometry, compare

STAND_IN = '''
import json, os, torch

AutoProcessor = LlavaOnevisionForConditionalGeneration = None  # replaced by the driver
TOKENS_PER_FRAME, DIM = 4, 2


class LlavaOneVision_Hermes:
    def encode_init_prompt(self):
        n = len(self.processor.tokenizer("system prompt").input_ids)
        self.kv_cache = [(torch.zeros(1, 1, n, DIM), torch.zeros(1, 1, n, DIM)) for _ in range(2)]
        self.log = {"prefix": n, "chunks": [], "pixel_shapes": [], "frame_sums": [], "queries": []}

    def encode_video_chunk(self, chunk):
        if os.environ.get("STAND_IN_FAIL"):
            raise RuntimeError("stand-in failure on purpose")
        self.log["chunks"].append(int(chunk.shape[0]))
        self.log["frame_sums"].append(int(chunk.to(torch.int64).sum()))
        pixels = self.processor.video_processor(chunk.permute(0, 3, 1, 2), return_tensors="pt").pixel_values_videos
        self.log["pixel_shapes"].append(list(pixels.shape))
        n = chunk.shape[0] * TOKENS_PER_FRAME
        self.kv_cache = [(torch.cat([k, torch.ones(1, 1, n, DIM)], 2), torch.cat([v, torch.ones(1, 1, n, DIM)], 2))
                         for k, v in self.kv_cache]

    def predict_and_compress(self):
        local, global_ = self.predict_next_question()
        tok = self.processor.tokenizer
        self.log["queries"].append([len(tok(t).input_ids) for t in (local, global_, local + "; " + global_)])
        keep = self.log["prefix"] + self.kv_size
        self.kv_cache = [(torch.cat([k[:, :, :self.log["prefix"]], k[:, :, -self.kv_size:]], 2),
                          torch.cat([v[:, :, :self.log["prefix"]], v[:, :, -self.kv_size:]], 2))
                         if k.shape[2] > keep else (k, v) for k, v in self.kv_cache]

    def question_answering(self, input_text, max_new_tokens=128, pseudo_forward=False, **_):
        ids = torch.tensor([self.processor.tokenizer(input_text["prompt"]).input_ids])
        self.log["question"] = ids.shape[1]
        self.log["kv_size"] = self.kv_size
        for _ in range(2):  # prefill, then one decode step
            self.language_model(input_ids=ids[:, -1:], use_cache=False)
        with open(os.environ["STAND_IN_LOG"], "w") as f:
            json.dump(self.log, f)
        return ""


def load_model(model_path, kv_size=None, device="cuda", **_):
    processor = AutoProcessor.from_pretrained(model_path)
    base = LlavaOnevisionForConditionalGeneration.from_pretrained(model_path)
    model = LlavaOneVision_Hermes.__new__(LlavaOneVision_Hermes)
    model.__dict__ = base.__dict__.copy()
    model.processor, model.kv_size = processor, kv_size
    return model, processor
'''


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    root = tmp_path / "HERMES"
    (root / "inference").mkdir(parents=True)
    (root / "inference" / "llavaov_hermes.py").write_text(STAND_IN)
    (root / "inference" / "reindex_1d.py").write_text("")
    log = tmp_path / "stand_in.json"
    monkeypatch.setenv("STAND_IN_LOG", str(log))
    return root, log


@pytest.mark.slow
def test_both_sides_get_the_same_frames_chunks_budget_and_query_lengths(checkout, tiny_model):
    root, log = checkout
    frames, chunk, budget, px = 12, 4, 8, 32
    rows = compare(str(root), sys.executable, [Geometry(4, 64)], frames=frames, chunk_frames=chunk, budget=budget,
                   repeats=1, rounds=1, frame_px=px)
    seen = json.loads(log.read_text())
    expected = np.stack([f.rgb for f in synthetic_frames(frames, side_px=px)]).astype(np.int64)
    assert seen["chunks"] == [chunk] * (frames // chunk)
    assert seen["frame_sums"] == [int(expected[i:i + chunk].sum()) for i in range(0, frames, chunk)]
    assert seen["pixel_shapes"] == [[1, chunk, 3, 108, 108]] * (frames // chunk)  # the tower's input size
    memory = MemoryConfig()
    n_local = tiny_model.question_embeds(memory.local_query).shape[0]
    n_global = tiny_model.question_embeds(memory.global_query).shape[0]
    assert seen["queries"] == [[n_local, n_global, n_local + n_global]] * (frames // chunk)
    assert seen["prefix"] == tiny_model.embed_text(tiny_model.prefix_text()).shape[0]
    assert seen["kv_size"] == budget

    by_metric = {r["metric"]: r for r in rows}
    # our probe is in our encode, not in our maintenance: the maintenance rows say so in their names
    assert set(by_metric) == {"ttft_ms", "maintain_ms_per_chunk_ours_without_probe",
                              "maintain_over_encode_ours_without_probe", "ingest_ms_per_evicting_chunk", "peak_kv_mb"}
    # a chunk's encode and maintenance together: more than its maintenance alone, on both sides
    for side in ("ours", "reference"):
        assert by_metric["ingest_ms_per_evicting_chunk"][side] > by_metric["maintain_ms_per_chunk_ours_without_probe"][side]
    # the stand-in's cache: 2 layers of K and V, (prefix + 2 chunks of 4 x 4 tokens) x 2 floats at its peak
    peak_tokens = seen["prefix"] + min(budget, 4 * chunk) + 4 * chunk
    assert by_metric["peak_kv_mb"]["reference"] == pytest.approx(2 * 2 * peak_tokens * 2 * 4 / 2**20)
    for row in rows:
        assert row["ratio"] == pytest.approx(row["ours"] / row["reference"])


def test_a_failing_reference_is_one_line_naming_its_error(checkout, monkeypatch):
    root, _ = checkout
    monkeypatch.setenv("STAND_IN_FAIL", "1")
    with pytest.raises(HermesError) as excinfo:
        compare(str(root), sys.executable, [Geometry(2, 64)], frames=4, chunk_frames=4, budget=4, repeats=1,
                rounds=1, frame_px=16)
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith("the reference pipeline failed (exit 1): RuntimeError: stand-in failure on purpose")


def test_rounds_alternate_which_side_goes_first_and_the_ratio_is_taken_within_each(checkout, monkeypatch):
    """Made-up values per side and round: the order flips every round, ours is warmed up once, and the
    ratio is the median of the per-round ratios (with their min and max), not a ratio of medians."""
    import hermes.pipelines.bench.memory as bench
    import hermes.pipelines.bench.reference as reference_bench

    root, _ = checkout
    calls = []
    ours_ttft, ref_ttft = iter([10.0, 20.0, 10.0]), iter([20.0, 20.0, 40.0])
    monkeypatch.setattr(bench, "_warm_up", lambda *args: calls.append("warm-up"))

    def ours(*args):
        calls.append("ours")
        return {"ttft_ms": next(ours_ttft), **{m: 1.0 for m in ("maintain_ms_per_chunk_ours_without_probe",
                "maintain_over_encode_ours_without_probe", "ingest_ms_per_evicting_chunk", "peak_kv_mb")}}

    def reference(*args):
        calls.append("reference")
        chunk = {"evicted": True, "encode_ms": 1.0, "maintain_ms": 1.0}
        return {"chunks": [chunk] * 3, "ttft_ms": [next(ref_ttft)], "peak_kv_bytes": 2**20}

    monkeypatch.setattr(reference_bench, "_ours", ours)
    monkeypatch.setattr(reference_bench, "run_reference", reference)
    rows = compare(str(root), sys.executable, [Geometry(2, 64)], frames=8, chunk_frames=4, budget=4, rounds=3,
                   frame_px=16)
    assert calls == ["warm-up", "ours", "reference", "reference", "ours", "ours", "reference"]
    ttft = next(r for r in rows if r["metric"] == "ttft_ms")
    assert (ttft["ratio_min"], ttft["ratio"], ttft["ratio_max"]) == (0.25, 0.5, 1.0)  # 10/20, 20/20, 10/40
    assert (ttft["ours"], ttft["reference"], ttft["rounds"]) == (10.0, 20.0, 3)
