"""`bench sweep` and `bench memory`: rows, formulas, reports, random real-size models and the device script."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hermes.config import MemoryConfig
from hermes.models.base import Generation
from hermes.pipelines.bench import memory as bench
from hermes.pipelines.bench.common import synthetic_frames
from hermes.pipelines.bench.memory import (
    MEMORY_COLUMNS, SWEEP_COLUMNS, PolicySpec, StreamRow, checkpointed_stream, ingest_fps,
    markdown_table, measure_stream, report_markdown, resolve_policies, rows_as_dicts, rows_from_dicts, run_sweep,
    time_per_output_token_ms,
)

REPO = Path(__file__).resolve().parents[2]
ROW_FIELDS = {"policy", "chunk_frames", "frames", "budget", "cache_tokens", "peak_kv_mb", "peak_device_mb", "ttft_ms",
              "recall_ms", "tpot_ms", "decode_tokens", "encode_ms_per_chunk", "maintain_ms_per_chunk", "maintain_ratio",
              "ingest_fps", "ttft_vs_full", "peak_kv_vs_full", "peak_device_vs_full", "ingest_fps_vs_full",
              "amortised_maintain_ratio", "ingest_ms_per_evicting_chunk", "answer_ms", "stream_repeats", "ttft_vs_full_min",
              "ttft_vs_full_max", "ingest_fps_vs_full_min", "ingest_fps_vs_full_max"}
HAS_RECALL = "recall" in {f.name for f in dataclasses.fields(MemoryConfig)}


@pytest.fixture(scope="module", autouse=True)
def one_cpu_thread():
    """These tests check rows and plumbing, not speed: one thread avoids OpenMP oversubscription, which on
    a shared 2-core machine slows the tiny model's matmuls by 50x or more."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def sweep(tiny_model):
    """The sweep on the tiny model (196 tokens per frame): 3 lengths, 2 chunk sizes, budget of 2 frames."""
    policies = resolve_policies("full,sliding,hermes,hermes+recall", MemoryConfig(), budget=2 * 196)
    return run_sweep(tiny_model, policies, [2, 4, 6], [2, 4], decode_tokens=3, repeats=1, frame_px=32, warmup=False)


def test_sweep_rows_have_the_documented_fields(sweep):
    rows = sweep.rows
    assert {f.name for f in dataclasses.fields(StreamRow)} == ROW_FIELDS
    ran = ["full", "sliding", "hermes"] + (["hermes+recall"] if HAS_RECALL else [])
    assert len(rows) == len(ran) * 3 * 2
    assert [(r.chunk_frames, r.policy, r.frames) for r in rows] == \
        [(c, p, n) for c in (2, 4) for p in ran for n in (2, 4, 6)]
    for r in rows:
        assert r.ttft_ms > 0 and r.tpot_ms is not None and r.tpot_ms > 0 and r.decode_tokens == 3
        assert r.encode_ms_per_chunk > 0 and r.ingest_fps > 0 and r.peak_kv_mb > 0
        assert r.peak_device_mb is None  # CPU: no device memory counter
        assert r.ttft_vs_full is not None and r.ingest_fps_vs_full is not None
        assert (r.recall_ms is not None) == r.policy.endswith("+recall")
        assert r.answer_ms >= r.ttft_ms  # the whole answer holds its first token (and recall, when on)
    full = [r for r in rows if r.policy == "full"]
    assert all(r.budget is None and r.ttft_vs_full == 1.0 and r.ingest_ms_per_evicting_chunk is None for r in full)
    assert [r.cache_tokens for r in full[:3]] == [full[0].cache_tokens + 196 * k for k in (0, 2, 4)]
    for r in rows:
        if r.policy != "full":
            assert r.budget == 392
            prefix = full[0].cache_tokens - 2 * 196
            assert r.cache_tokens <= prefix + 392
            if r.frames == 6:  # past the budget: eviction ran and was timed
                assert r.maintain_ms_per_chunk > 0 and r.maintain_ratio > 0 and r.peak_kv_vs_full < 1
                # the evicting chunks' mean encode (their maintenance over its ratio to it) plus their maintenance
                assert r.ingest_ms_per_evicting_chunk == pytest.approx(
                    r.maintain_ms_per_chunk / r.maintain_ratio + r.maintain_ms_per_chunk)
            # once full, every chunk evicts (no headroom): averaged over all of them is the same sum
            assert r.amortised_maintain_ratio == r.maintain_ratio


def test_with_headroom_the_amortised_maintenance_counts_the_chunks_that_fit(tiny_model, monkeypatch):
    """Budget 2 frames, headroom 0.5: evict to 1 frame, so every other one-frame chunk evicts once full.

    A made-up bench clock (1 ms per reading, 10 ms more for a maintenance that evicts) keeps the machine's
    speed out of it: the chunks that fit dilute the amortised ratio to about half the evicting chunks' one."""
    from hermes.memory import HermesPolicy

    clock = [0.0]

    def perf_counter():
        clock[0] += 1e-3
        return clock[0]

    maintain = HermesPolicy.maintain

    def slow_when_evicting(self, cache, *args, **kwargs):
        before = cache.num_tokens
        evictions = maintain(self, cache, *args, **kwargs)
        clock[0] += 10e-3 if cache.num_tokens < before else 0.0
        return evictions

    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=perf_counter))
    monkeypatch.setattr(HermesPolicy, "maintain", slow_when_evicting)
    policy = resolve_policies("hermes", MemoryConfig(evict_headroom=0.5), budget=2 * 196)[0]
    rows, _ = measure_stream(tiny_model, policy, [8], chunk_frames=1, decode_tokens=1, repeats=1, frame_px=32)
    row = rows[0]
    assert row.maintain_ratio > 0 and 0 < row.amortised_maintain_ratio < 0.6 * row.maintain_ratio


def test_answer_time_counts_a_policys_retrieval_before_the_prefill(tiny_model, monkeypatch):
    """rekv retrieves its blocks before the question's prefill: TTFT leaves that out, the answer's time does not
    (a bench clock that moves 1 ms per reading, and one second per retrieval)."""
    from hermes.baselines.rekv import ReKVPolicy

    clock = [0.0]

    def perf_counter():
        clock[0] += 1e-3
        return clock[0]

    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=perf_counter))
    retrieve = ReKVPolicy.answer_cache

    def slow_retrieval(self, *args, **kwargs):
        clock[0] += 1.0
        return retrieve(self, *args, **kwargs)

    monkeypatch.setattr(ReKVPolicy, "answer_cache", slow_retrieval)
    policy = resolve_policies("rekv", MemoryConfig(), budget=2 * 196)[0]
    rows, note = measure_stream(tiny_model, policy, [4], chunk_frames=2, decode_tokens=2, repeats=2, frame_px=32)
    assert note is None and rows[0].answer_ms == pytest.approx(1001.0) and rows[0].ttft_ms < 1000.0


def made_up_row(policy: str, frames: int, ttft_ms: float) -> StreamRow:
    """A bench memory row at chunks of 2 whose only measured value that matters is its TTFT."""
    return StreamRow(policy=policy, chunk_frames=2, frames=frames, budget=None, cache_tokens=1, peak_kv_mb=1.0,
                     peak_device_mb=None, ttft_ms=ttft_ms, recall_ms=None, tpot_ms=None, decode_tokens=1,
                     encode_ms_per_chunk=1.0, maintain_ms_per_chunk=0.0, maintain_ratio=0.0, ingest_fps=1.0)


def test_bench_memory_warms_up_then_alternates_the_order_and_reports_the_ratios_spread(monkeypatch):
    """Made-up TTFTs per stream: the warm-up's never reach the rows; the policies' order flips every repeat;
    TTFT vs full is taken within a repeat, then its min / median / max over repeats."""
    streams = []
    ttfts = {"full": iter([10.0, 20.0, 10.0]), "hermes": iter([5.0, 5.0, 8.0])}  # per repeat

    def fake_stream(model, policy, checkpoints, **kwargs):
        streams.append((policy.label, checkpoints))
        warm_up = checkpoints == [3 * 2]
        ttft = 1e6 if warm_up else next(ttfts[policy.label])
        return [made_up_row(policy.label, checkpoints[-1], ttft)], None

    monkeypatch.setattr(bench, "measure_stream", fake_stream)
    model = type("Model", (), {"tokens_per_frame": 196})()
    policies = resolve_policies("full,hermes", MemoryConfig(), budget=392)
    result = bench.bench_memory(model, policies, [8], chunk_frames=2, stream_repeats=3)
    assert [label for label, _ in streams] == ["full", "hermes"] + ["full", "hermes", "hermes", "full", "full", "hermes"]
    assert [c for _, c in streams[:2]] == [[6], [6]] and all(c == [8] for _, c in streams[2:])
    hermes = next(r for r in result.rows if r.policy == "hermes")
    assert [r.policy for r in result.rows] == ["full", "hermes"] and hermes.stream_repeats == 3
    assert (hermes.ttft_vs_full_min, hermes.ttft_vs_full, hermes.ttft_vs_full_max) == (0.25, 0.5, 0.8)
    assert hermes.ttft_ms == 5.0  # the median over repeats, the warm-up's left out
    table = markdown_table(result.rows, MEMORY_COLUMNS)
    assert "TTFT vs full, min / median / max" in table and "0.25 / 0.50 / 0.80" in table


def test_bench_memory_skips_a_policy_whose_optional_package_is_missing_as_the_sweep_does(monkeypatch):
    def fake_stream(model, policy, checkpoints, **kwargs):
        if policy.label == "hermes":
            raise ModuleNotFoundError("No module named 'faiss'", name="faiss")
        return [made_up_row(policy.label, checkpoints[-1], 1.0)], None

    monkeypatch.setattr(bench, "measure_stream", fake_stream)
    model = type("Model", (), {"tokens_per_frame": 196})()
    policies = resolve_policies("full,hermes", MemoryConfig(), budget=392)
    result = bench.bench_memory(model, policies, [8], chunk_frames=2, stream_repeats=2)
    assert [r.policy for r in result.rows] == ["full"] and result.rows[0].stream_repeats == 2
    assert result.notes == ["hermes: skipped, it needs faiss (not installed here)"]


# ---- bench overhead: a policy's whole ingest over a baseline's, paired chunk by chunk ----------------------


def test_overhead_pairs_every_chunk_alternating_which_goes_first_after_a_warm_up(tiny_model, monkeypatch):
    ingests = []
    real_ingest = bench.StreamingSession.ingest

    def logged(session, frames):
        ingests.append((session.memory.name, session.memory.cfg.budget))
        return real_ingest(session, frames)

    monkeypatch.setattr(bench.StreamingSession, "ingest", logged)
    budget = 3 * 196  # chunks of 2 frames (392 tokens): the second chunk and every later one evicts
    hermes, sliding = resolve_policies("hermes,sliding", MemoryConfig(), budget=budget)
    row = bench.paired_overhead(tiny_model, hermes, sliding, 8, chunk_frames=2, repeats=2, frame_px=32)
    warm, measured = ingests[:6], ingests[6:]
    assert all(b == 2 * 196 for _, b in warm)  # the warm-up's budget is one chunk, so that it evicts too
    # 2 repeats x 4 chunks x both policies, the order flipped every chunk, at the budget asked for
    assert measured == [("hermes", budget), ("sliding", budget), ("sliding", budget), ("hermes", budget)] * 4
    assert row.paired_chunks == 3 and row.repeats == 2  # the first chunk fits: no pair
    assert row.overhead_min <= row.overhead_median <= row.overhead_max
    assert row.policy == "hermes" and row.baseline == "sliding" and row.maintain_ms > 0


def test_overhead_is_the_median_ratio_over_chunks_that_evicted_in_both(tiny_model, monkeypatch):
    """Made-up chunk times: the statistic is the per-repeat median of policy / baseline over the chunks
    both evicted, minus one; its min / median / max over repeats; chunks that fit do not count."""
    repeat_ratios = iter([[1.5, 1.2, 1.1], [1.3, 1.4, 2.0], [1.0, 1.1, 1.2]])  # per repeat, per evicting chunk

    def fake_ingest(session, timer, chunk):
        i = session.fake_chunk_index = getattr(session, "fake_chunk_index", -1) + 1
        if session.memory.name == "sliding":
            if i == 0:
                ratios[:] = next(repeat_ratios)
            return bench.ChunkTiming(len(chunk), 90.0, 10.0, i > 0)
        # the first chunk fits: a huge time there would move every median if it counted
        return bench.ChunkTiming(len(chunk), 1e6 if i == 0 else 100.0 * ratios[i - 1] - 5.0, 5.0, i > 0)

    ratios = []
    monkeypatch.setattr(bench, "timed_ingest", fake_ingest)
    hermes, sliding = resolve_policies("hermes,sliding", MemoryConfig(), budget=3 * 196)
    row = bench.paired_overhead(tiny_model, hermes, sliding, 8, chunk_frames=2, repeats=3, warmup=False)
    assert row.paired_chunks == 3
    assert (row.overhead_min, row.overhead_median, row.overhead_max) == pytest.approx((0.1, 0.2, 0.4))


def test_cli_overhead_reports_the_paired_overhead(tmp_path, capsys):
    from hermes.cli import main

    out = tmp_path / "o.json"
    assert main(["bench", "overhead", "--geometries", "2x64", "--tokens-per-frame", "16", "--frames", "32",
                 "--chunk-frames", "4", "--budget", "128", "--repeats", "2", "--quiet", "--output", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["suite"] == "overhead" and len(data["rows"]) == 1
    r = data["rows"][0]
    assert (r["policy"], r["baseline"], r["budget"], r["repeats"]) == ("hermes", "sliding", 128, 2)
    assert r["paired_chunks"] == 6  # 8 chunks of 64 tokens; the third is the first past 128
    assert r["overhead_min"] <= r["overhead_median"] <= r["overhead_max"]
    assert "over sliding, min / median / max" in capsys.readouterr().out


def test_cli_overhead_floor_rides_hermes_pseudo_query_unrecorded_in_sliding_and_keeps_its_selection(monkeypatch, capsys):
    """`--floor`: a second row per geometry whose policy evicts as sliding does, with hermes's pseudo-query
    riding (unrecorded) in exactly the chunks hermes probes."""
    import hermes.pipelines.session as session_module
    from hermes.cli import main

    rides = []  # (policy, pseudo-query rows or 0, recorded)
    real = session_module.prefill_chunk

    def logged(model, cache, embeds, positions, probe_embeds=None, *, record=True, **kwargs):
        rides.append((CURRENT[0].name, type(CURRENT[0]).__name__,
                      0 if probe_embeds is None else probe_embeds.shape[0], record))
        return real(model, cache, embeds, positions, probe_embeds, record=record, **kwargs)

    CURRENT = [None]
    real_ingest = bench.StreamingSession.ingest

    def ingest(session, frames):
        CURRENT[0] = session.memory
        return real_ingest(session, frames)

    monkeypatch.setattr(session_module, "prefill_chunk", logged)
    monkeypatch.setattr(bench.StreamingSession, "ingest", ingest)
    kept = []  # (policy class, kept indices) per eviction, in order
    real_select = bench.SlidingPolicy.choose

    def choose(policy, cache, prefix_len, probe=None):
        choice = real_select(policy, cache, prefix_len, probe)
        kept.append((type(policy).__name__, choice.keep.clone()))
        return choice

    monkeypatch.setattr(bench.SlidingPolicy, "choose", choose)
    assert main(["bench", "overhead", "--geometries", "2x64", "--tokens-per-frame", "16", "--frames", "32",
                 "--chunk-frames", "4", "--budget", "128", "--repeats", "1", "--quiet", "--json", "--floor"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["policy"] for r in rows] == ["hermes", "pseudo-query rows alone (floor)"]
    hermes_rides = [n for name, _, n, rec in rides if name == "hermes"]
    floor_rides = [(n, rec) for _, kind, n, rec in rides if kind == "ProbeRowsFloor"]
    assert floor_rides and [n for n, _ in floor_rides][-8:] == hermes_rides[-8:]  # the same chunks, the same rows
    assert any(n for n, _ in floor_rides) and not any(rec for n, rec in floor_rides if n)  # riding, never recorded
    # the floor's measured stream: it and sliding evict chunk by chunk (either first), keeping the same entries
    paired = kept[-12:]
    assert sorted(kind for kind, _ in paired) == ["ProbeRowsFloor"] * 6 + ["SlidingPolicy"] * 6
    for (kind_a, a), (kind_b, b) in zip(paired[::2], paired[1::2]):
        assert kind_a != kind_b and torch.equal(a, b)


def test_cli_overhead_set_reaches_both_policies(monkeypatch, capsys):
    from hermes.cli import main

    seen = []

    def fake(model, policy, baseline, *args, **kwargs):
        seen.append((policy.memory.policy, policy.memory.probe_text, baseline.memory.policy,
                     baseline.memory.probe_text, policy.memory.budget))
        raise SystemExit(0)

    monkeypatch.setattr(bench, "paired_overhead", fake)
    with pytest.raises(SystemExit):
        main(["bench", "overhead", "--geometries", "2x64", "--set", "memory.probe_text=bare", "--budget", "64"])
    assert seen == [("hermes", "bare", "sliding", "bare", 64)]


def test_cli_overhead_floor_needs_the_sliding_baseline(capsys):
    from hermes.cli import main

    assert main(["bench", "overhead", "--floor", "--baseline", "uniform"]) == 2
    assert "--floor pairs the floor with --baseline sliding" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--geometries", "4x65"], "--geometries expects LAYERSxWIDTH"),
    (["--repeats", "0"], "argument --repeats: expected a positive whole number"),
    (["--baseline", "sliding+nosuchflag"], "sliding+nosuchflag: skipped"),
    (["--set", "model.dtype=float16"], "bench overhead takes memory.KEY=VALUE"),
    (["--set", "memory.probe_text=raw"], "memory.probe_text: expected one of question, bare, found 'raw'"),
])
def test_cli_overhead_bad_input_is_one_line(argv, message, capsys):
    from hermes.cli import main

    assert main(["bench", "overhead", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_recall_is_skipped_with_a_note_until_it_exists(sweep):
    if HAS_RECALL:
        assert any(r.policy == "hermes+recall" for r in sweep.rows)
    else:
        assert any("hermes+recall: skipped, memory.recall is not a known config key yet" in n for n in sweep.notes)


def test_markdown_and_json_round_trip(sweep, tmp_path):
    table = markdown_table(sweep.rows)
    lines = table.splitlines()
    assert len(lines) == len(sweep.rows) + 2
    assert lines[0].count("|") == len(SWEEP_COLUMNS) + 1 and "TPOT ms" in lines[0] and "ingest fps" in lines[0]
    assert "| - |" in lines[2]  # peak device memory is "-" off CUDA
    assert len(markdown_table(sweep.rows, MEMORY_COLUMNS).splitlines()[0].split("|")) == len(MEMORY_COLUMNS) + 2
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"rows": rows_as_dicts(sweep.rows), "notes": sweep.notes}))
    assert rows_from_dicts(json.loads(path.read_text())["rows"]) == sweep.rows
    report = report_markdown({"model": "tiny", "date": "2026-11-29"}, sweep)
    assert "- model: tiny" in report and table in report


def test_tpot_from_a_known_fake_generation(tiny_model, monkeypatch):
    def fake_generate(prompt, cache, max_new_tokens, on_text=None, stop_ids=None):  # 10 ms, then 5 ms per token
        assert stop_ids is not None and not stop_ids  # answers are forced to full length while measured
        return Generation("x", [7] * max_new_tokens, torch.zeros(4), 10.0, 10.0 + 5.0 * (max_new_tokens - 1))

    monkeypatch.setattr(tiny_model, "generate_greedy", fake_generate)
    eos = set(tiny_model.eos_token_ids)
    rows, note = measure_stream(tiny_model, PolicySpec("full", MemoryConfig()), [2], chunk_frames=2,
                                decode_tokens=9, repeats=2, frame_px=32)
    assert note is None and rows[0].ttft_ms == 10.0 and rows[0].tpot_ms == pytest.approx(5.0)
    assert tiny_model.eos_token_ids == eos
    assert time_per_output_token_ms(30.0, 30.0 + 15 * 24.0, 16) == pytest.approx(24.0)
    assert time_per_output_token_ms(30.0, 30.0, 1) is None


def test_ingest_fps_formula():
    assert ingest_fps(16, encode_ms=1500.0, maintain_ms=500.0) == pytest.approx(8.0)
    assert ingest_fps(1024, encode_ms=60_000.0, maintain_ms=4_000.0) == pytest.approx(16.0)


def test_checkpoints_end_chunks():
    assert list(checkpointed_stream(24, [16, 24], 16)) == [(16, True), (8, True)]
    assert list(checkpointed_stream(20, [4, 20], 8)) == [(4, True), (8, False), (8, True)]


def test_policies_are_data():
    base = MemoryConfig(sink_tokens=2)
    specs = resolve_policies("full, hermes+condition_on_question,hermes+budget,sliding+nope", base, budget=100)
    assert [s.label for s in specs] == ["full", "hermes+condition_on_question", "hermes+budget", "sliding+nope"]
    assert specs[0].memory.policy == "full" and specs[0].memory.sink_tokens == 2
    assert specs[1].memory.condition_on_question is True and specs[1].memory.budget == 100
    assert specs[2].memory is None and "not an on/off setting" in specs[2].note
    assert specs[3].memory is None and "memory.nope is not a known config key yet" in specs[3].note


def test_recall_only_is_sliding_with_recall_under_its_own_label():
    (spec,) = resolve_policies("recall-only", MemoryConfig(), budget=64)
    assert spec.label == "recall-only"
    assert (spec.memory.policy, spec.memory.recall, spec.memory.budget) == ("sliding", True, 64)



def test_a_memory_preset_is_a_policy_at_the_bench_budget_on_top_of_the_base():
    """`--policies hermes-4k,hermes-plus` compares the presets in one run: each preset's settings (here as
    configs/memory/hermes-plus.yaml sets them) at the bench's budget, over the base's other settings."""
    full, paper, plus = resolve_policies("full,hermes-4k,hermes-plus", MemoryConfig(sink_tokens=2), budget=64)
    assert [full.label, paper.label, plus.label] == ["full", "hermes-4k", "hermes-plus"]
    assert (paper.memory.policy, paper.memory.budget, paper.memory.recall) == ("hermes", 64, False)
    assert (plus.memory.policy, plus.memory.budget, plus.memory.recall, plus.memory.recall_gate,
            plus.memory.recall_share) == ("hermes", 64, True, "question", 0.5)
    assert plus.memory.sink_tokens == 2


def test_bench_memory_asks_its_question_and_a_recall_it_fires_counts_in_ttft(tiny_model, monkeypatch):
    """A question about the start makes `hermes-plus` recall: the question asked is the one given, and the
    row's TTFT holds the recall's time (1 s on the bench's clock) beside the prefill's."""
    from hermes.lower import LowerLevels
    from hermes.pipelines.session import StreamingSession

    clock, asked = [0.0], []

    def perf_counter():
        clock[0] += 1e-3
        return clock[0]

    recall, ask = LowerLevels.recall, StreamingSession.ask

    def slow_recall(self, *args, **kwargs):
        stats = recall(self, *args, **kwargs)
        stats.recall_ms += 1000.0 if stats.tokens else 0.0
        return stats

    def asking(self, question, *args, **kwargs):
        asked.append(question)
        return ask(self, question, *args, **kwargs)

    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=perf_counter))
    monkeypatch.setattr(LowerLevels, "recall", slow_recall)
    monkeypatch.setattr(StreamingSession, "ask", asking)
    (policy,) = resolve_policies("hermes-plus", MemoryConfig(), budget=2 * 196)
    first = "What colour was the first object?"
    rows, note = measure_stream(tiny_model, policy, [6], chunk_frames=2, decode_tokens=1, repeats=2, frame_px=32,
                                question=first)
    assert note is None and asked == [first, first]
    assert rows[0].recall_ms > 1000.0 and rows[0].ttft_ms > rows[0].recall_ms
    now, = measure_stream(tiny_model, policy, [6], chunk_frames=2, decode_tokens=1, repeats=1, frame_px=32)[0]
    assert asked[-1] == bench.BENCH_QUESTION and now.recall_ms < 1000.0  # the present: nothing recalled

# ---- random models at published sizes ------------------------------------------------------------------


def test_published_sizes_on_the_meta_device():
    """Whole published configs, built without memory: widths and the hub's parameter counts."""
    from transformers import AutoModelForImageTextToText

    from hermes.models.realsize import random_config

    expected_params = {"llava-ov-7b": 8.03e9, "llava-ov-0.5b": 0.894e9, "qwen2.5-vl-7b": 8.29e9}
    for arch, params in expected_params.items():
        config = random_config(arch)
        with torch.device("meta"):
            model = AutoModelForImageTextToText._model_mapping[type(config)]._from_config(config)
        assert sum(p.numel() for p in model.parameters()) == pytest.approx(params, rel=0.005), arch
    text = random_config("llava-ov-7b").text_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads,
            text.intermediate_size, text.max_position_embeddings) == (3584, 28, 28, 4, 18944, 32768)
    vision = random_config("llava-ov-7b").vision_config
    assert (vision.hidden_size, vision.intermediate_size, vision.num_attention_heads, vision.image_size,
            vision.patch_size) == (1152, 4304, 16, 384, 14)
    qwen = random_config("qwen2.5-vl-7b")
    assert qwen.text_config.rope_parameters["mrope_section"] == [16, 24, 24]
    assert (qwen.vision_config.depth, qwen.vision_config.hidden_size, qwen.vision_config.out_hidden_size) == \
        (32, 1280, 3584)


def test_build_random_llava_0_5b_reduced_runs_a_chunk():
    from hermes.config import ModelConfig
    from hermes.models.loading import build_random_model
    from hermes.pipelines.session import StreamingSession

    model = build_random_model("llava-ov-0.5b", ModelConfig(device="cpu", dtype="float32"), num_layers=2,
                               vision_layers=1)
    text, vision = model.text_config, model.model.config.vision_config
    attention = model.language_model.layers[0].self_attn
    assert (text.hidden_size, text.num_attention_heads, text.num_key_value_heads, attention.head_dim) == \
        (896, 14, 2, 64)
    assert (text.num_hidden_layers, text.vocab_size) == (2, 152000)
    assert (vision.hidden_size, vision.num_attention_heads, vision.intermediate_size, vision.image_size,
            vision.patch_size, vision.num_hidden_layers) == (1152, 16, 4304, 384, 14, 1)
    assert model.tokens_per_frame == 196 and next(model.model.parameters()).device.type == "cpu"
    session = StreamingSession(model, "full", max_new_tokens=2)
    prefix = session.cache.num_tokens
    session.ingest(list(synthetic_frames(1, side_px=64)))
    assert session.cache.num_tokens == prefix + 196
    assert all(torch.isfinite(k).all() for k, _ in session.cache.layer_tensors())


# ---- the command line and the device script ------------------------------------------------------------


def test_cli_sweep_writes_json_and_markdown(tmp_path, capsys):
    from hermes.cli import main

    out, md = tmp_path / "s.json", tmp_path / "s.md"
    assert main(["bench", "sweep", "--device", "cpu", "--lengths", "4,8", "--chunk-frames", "4", "--budget", "64",
                 "--policies", "full,hermes", "--decode-tokens", "2", "--repeats", "1", "--frame-px", "32",
                 "--quiet", "--output", str(out), "--markdown", str(md)]) == 0
    data = json.loads(out.read_text())
    assert data["suite"] == "sweep" and data["model"].startswith("random cpu-small") and "partial" not in data
    assert [(r["policy"], r["frames"]) for r in data["rows"]] == [("full", 4), ("full", 8), ("hermes", 4),
                                                                   ("hermes", 8)]
    assert capsys.readouterr().out.strip() in md.read_text()


def test_a_failed_results_rewrite_keeps_the_previous_file(tmp_path, monkeypatch):
    """The bench rewrites --output and --markdown as results come in: a stop mid-rewrite (here the rename
    fails) leaves the previous complete file, never a truncated one."""
    import os
    from types import SimpleNamespace

    from hermes.pipelines.bench import cli as bench_cli

    out, md = tmp_path / "s.json", tmp_path / "s.md"
    args = SimpleNamespace(output=str(out), markdown=str(md))
    monkeypatch.setattr(bench_cli, "bench_record", lambda meta, result: {"rows": result})
    monkeypatch.setattr("hermes.pipelines.bench.memory.report_markdown", lambda meta, result, columns: f"{result}\n")
    bench_cli.write_bench_files(args, {}, [1, 2], None)
    assert json.loads(out.read_text()) == {"rows": [1, 2]} and md.read_text() == "[1, 2]\n"

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bench_cli.write_bench_files(args, {}, [1, 2, 3] * 1000, None)
    assert json.loads(out.read_text()) == {"rows": [1, 2]} and md.read_text() == "[1, 2]\n"


def test_target_check_reads_a_sweep_json(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_targets", REPO / "scripts" / "check_targets.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)

    def row(frames, ttft_ms, device_mb, ingest_ms, policy="hermes"):
        # maintenance alone stays at 0.05 of encode: the probe rides in the prefill, so only the whole
        # ingest (against sliding's) says what remembering costs
        return {"policy": policy, "chunk_frames": 16, "frames": frames, "ttft_ms": ttft_ms, "peak_kv_mb": 200.0,
                "peak_device_mb": device_mb, "maintain_ratio": 0.05 if ingest_ms else 0.0,
                "encode_ms_per_chunk": 900.0, "maintain_ms_per_chunk": 45.0 if ingest_ms else 0.0,
                "ingest_ms_per_evicting_chunk": ingest_ms}

    sliding = [row(16, 27.0, 16900.0, None, "sliding"), row(1024, 27.0, 16900.0, 1000.0, "sliding")]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"rows": [row(16, 27.0, 16900.0, None), row(1024, 28.5, 17500.0, 1080.0)] + sliding}))
    assert check.main([str(path)]) == 0 and capsys.readouterr().out.count("| yes |") == 5
    path.write_text(json.dumps({"rows": [row(16, 27.0, 16900.0, None), row(1024, 45.0, 19000.0, 1200.0)] + sliding}))
    out = check.main([str(path)]), capsys.readouterr().out
    assert out[0] == 1 and out[1].count("| NO |") == 4 and "worst +0.200" in out[1]
    path.write_text(json.dumps({"rows": [row(16, 27.0, 16900.0, None), row(1024, 28.5, 17500.0, 1080.0)]}))
    out = check.main([str(path)]), capsys.readouterr().out  # no sliding row: the overhead is not measured
    assert out[0] == 1 and "no length where both evicted" in out[1]
    assert check.main([str(path), "--chunk", "8"]) == 2


def test_device_script_parses():
    for script in ("device_bench.sh", "prepare_wheels.sh"):
        subprocess.run(["bash", "-n", str(REPO / "scripts" / script)], check=True)


@pytest.mark.slow
def test_device_script_cpu_dry_run(tmp_path):
    """The device script end to end on a CPU, at the smallest sizes."""
    env = dict(os.environ, DEVICE="cpu", OUT=str(tmp_path), PYTHON=sys.executable, LENGTHS="4", CHUNKS="4",
               OMP_NUM_THREADS="1",
               BUDGET="32", POLICIES="full,hermes", DECODE_TOKENS="2", REPEATS="1")
    done = subprocess.run(["bash", str(REPO / "scripts" / "device_bench.sh")], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:]
    for name in ("cpu-small", "tiny-qwen2.5-vl"):
        rows = json.loads((tmp_path / f"{name}.json").read_text())["rows"]
        assert [r["policy"] for r in rows] == ["full", "hermes"]
    assert (tmp_path / "env.txt").is_file() and "done;" in (tmp_path / "log.txt").read_text()
    extras = (tmp_path / "extras.md").read_text()
    assert "| random cpu-small (512 wide) | 2" in extras  # bench device's probe row
    assert "| recall | 200 |" in extras and "| best_frames_per_s |" in extras  # bench tiers, bench ingest
    assert "bench reference: skipped" in extras
    assert "device / host: host CPU" in extras  # bench device's preprocess section ran


@pytest.mark.slow
def test_device_script_extras_stay_inside_the_total_time_budget(tmp_path):
    """With TOTAL_S spent by the set-up steps, every sweep and every extra is skipped, none started."""
    env = dict(os.environ, DEVICE="cpu", OUT=str(tmp_path), PYTHON=sys.executable, TOTAL_S="15", OMP_NUM_THREADS="1")
    done = subprocess.run(["bash", str(REPO / "scripts" / "device_bench.sh")], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:]
    log, extras = (tmp_path / "log.txt").read_text(), (tmp_path / "extras.md").read_text()
    assert log.count("skipped, only") == 2 and "sweep (limit" not in log
    assert extras.count("skipped (time budget spent)") == 4 and "extra:" not in log


def test_only_the_command_line_imports_the_bench_package():
    """Measurement code has one home (`pipelines/bench/`) beside the runtime: no runtime module imports it."""
    import ast

    importers = []
    for folder in ("hermes", "models", "pipelines", "datasets"):
        for path in sorted((REPO / folder).rglob("*.py")):
            # the command line, and `bench day`'s command, which lives in datasets/ beside its synthetic world
            # (pipelines/ may not import datasets/) and hands that world to pipelines/bench/day.py
            if (REPO / "pipelines" / "bench") in path.parents or path in (REPO / "hermes" / "cli.py",
                                                                          REPO / "datasets" / "day.py"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                importers += [f"{path.relative_to(REPO)}: {n}" for n in names
                              if n == "hermes.pipelines.bench" or n.startswith("hermes.pipelines.bench.")]
    assert importers == []
    assert not (REPO / "hermes" / "tiers" / "bench.py").exists()
