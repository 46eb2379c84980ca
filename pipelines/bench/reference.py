"""`hermes-video bench reference`: the authors' HERMES pipeline and ours, side by side, in one run.

The reference runs as a subprocess in its own environment (`reference_driver.py`), ours in this
process, on the same random geometry, frames, chunks, budget and token lengths, in rounds that
alternate which goes first. What is measured and compared: README.md, "Against the authors' reference".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hermes.errors import HermesError, UsageError
from hermes.markdown import spread_cell, table

DRIVER = Path(__file__).with_name("reference_driver.py")
# Our probe rides in the chunk's prefill, so it is in our encode and in the reference's maintenance: these two
# rows compare unlike things, and say so (`ingest_ms_per_evicting_chunk` compares like with like).
MAINTAIN_MS = "maintain_ms_per_chunk_ours_without_probe"
MAINTAIN_OVER_ENCODE = "maintain_over_encode_ours_without_probe"
REQUIRED = ("inference/llavaov_hermes.py", "inference/reindex_1d.py")  # what the driver imports


@dataclass(frozen=True)
class Geometry:
    """A random LLaVA-OneVision: decoder layers x width, and visual tokens per frame (196 or 16)."""

    num_layers: int
    hidden_size: int
    tokens_per_frame: int = 196

    @property
    def image_size(self) -> int:
        return {196: 108, 16: 28}[self.tokens_per_frame]  # 4 px patches, 2x2 pooling

    @property
    def label(self) -> str:
        return f"{self.num_layers}x{self.hidden_size}, {self.tokens_per_frame} tok/frame"


def parse_geometries(text: str, tokens_per_frame: int) -> list[Geometry]:
    """"4x64,8x512" -> geometries. Raises UsageError (one line) on anything else."""
    out = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        layers, _, width = item.partition("x")
        if not (layers.isdigit() and width.isdigit()) or int(layers) < 1 or int(width) < 32 or int(width) % 32:
            raise UsageError(f"--geometries expects LAYERSxWIDTH items (width a multiple of 32), found {item!r}")
        out.append(Geometry(int(layers), int(width), tokens_per_frame))
    if not out:
        raise UsageError("--geometries needs at least one LAYERSxWIDTH item, e.g. 4x64,8x512")
    return out


def geometry_model(geo: Geometry, seed: int = 0):
    """(adapter, tokenizer) of `geo`'s random weights on the CPU in float32, the same for the same seed."""
    from hermes.config import ModelConfig
    from hermes.models.loading import make_adapter
    from hermes.models.tiny import tiny_llava_onevision

    net, tokenizer = tiny_llava_onevision(seed=seed, image_size=geo.image_size, hidden_size=geo.hidden_size,
                                          num_layers=geo.num_layers)
    model = make_adapter("llava_onevision", f"random llava-onevision {geo.label}", net, tokenizer,
                         ModelConfig(device="cpu", dtype="float32"))
    return model, tokenizer


def check_reference(ref_dir: str, ref_python: str) -> tuple[Path, str]:
    """The checkout and interpreter, checked before anything loads.

    Raises:
        UsageError: the directory is missing, is not a HERMES checkout, or the interpreter is not found.
    """
    root = Path(ref_dir).expanduser()
    if not root.is_dir():
        raise UsageError(f"--ref-dir {ref_dir}: no such directory (give a checkout of the HERMES reference code)")
    missing = [p for p in REQUIRED if not (root / p).is_file()]
    if missing:
        raise UsageError(f"--ref-dir {ref_dir} is not a HERMES reference checkout: {', '.join(missing)} missing")
    python = shutil.which(ref_python) or (ref_python if os.access(ref_python, os.X_OK) else None)
    if python is None or not Path(python).is_file():
        raise UsageError(f"--ref-python {ref_python}: no such interpreter")
    return root.resolve(), python


def run_reference(root: Path, python: str, spec: dict, workdir: Path, timeout_s: float) -> dict:
    """Run the driver under the reference's interpreter; its JSON result.

    Raises:
        HermesError: the reference failed (its last stderr line) or printed no result.
    """
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "PYTHONPATH": str(root)}
    try:
        proc = subprocess.run([python, str(DRIVER), "--ref-dir", str(root), "--spec", str(spec_path)],
                              capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise HermesError(f"the reference pipeline ran past {timeout_s:g} s") from None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        lines = proc.stderr.strip().splitlines() or ["(no output)"]
        errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b", line)]  # a traceback's last line
        last = (errors or lines)[-1]
        raise HermesError(f"the reference pipeline failed (exit {proc.returncode}): {last}")
    return json.loads(lines[-1])


def _ours(model, cfg, frames: list, chunk_frames: int, repeats: int) -> dict:
    """Our side's values (`compare`'s metrics), from one stream (warmed up by the caller)."""
    from hermes.pipelines.bench.memory import PolicySpec, measure_stream

    rows, note = measure_stream(model, PolicySpec("hermes", cfg), [len(frames)], chunk_frames=chunk_frames,
                                decode_tokens=1, repeats=repeats, frame_px=frames[0].rgb.shape[0])
    if note or not rows:
        raise HermesError(note or "our pipeline measured nothing")
    ours = rows[-1]
    # ours carries the probe in the chunk's forward (`hermes.probe.prefill_chunk`): its cost is in our
    # encode, in the reference's maintenance; a chunk's encode plus maintenance compares across both
    return {"ttft_ms": ours.ttft_ms, MAINTAIN_MS: ours.maintain_ms_per_chunk, MAINTAIN_OVER_ENCODE: ours.maintain_ratio,
            "ingest_ms_per_evicting_chunk": ours.ingest_ms_per_evicting_chunk or 0.0, "peak_kv_mb": ours.peak_kv_mb}


def _reference_values(ref: dict) -> dict:
    """The reference driver's result as `compare`'s metrics."""
    # its first chunk carries the one-off costs our warm-up absorbs: left out
    evicting = [c for c in ref["chunks"][1:] if c["evicted"]] or ref["chunks"][-1:]
    return {
        "ttft_ms": statistics.median(ref["ttft_ms"]),
        MAINTAIN_MS: statistics.fmean(c["maintain_ms"] for c in evicting),
        MAINTAIN_OVER_ENCODE: sum(c["maintain_ms"] for c in evicting) / sum(c["encode_ms"] for c in evicting),
        "ingest_ms_per_evicting_chunk": statistics.fmean(c["encode_ms"] + c["maintain_ms"] for c in evicting),
        "peak_kv_mb": ref["peak_kv_bytes"] / 2**20,
    }


def compare(ref_dir: str, ref_python: str, geometries: list[Geometry], *, frames: int, chunk_frames: int,
            budget: int, repeats: int = 3, rounds: int = 3, frame_px: int = 64, seed: int = 0, threads: int = 1,
            timeout_s: float = 1800.0, memory=None) -> list[dict]:
    """Both pipelines at every geometry, `rounds` times each, which goes first alternating (a change of
    load between the halves then moves the ratio both ways).

    Returns:
        Rows ``{"geometry", "metric", "ours", "reference", "ratio", "ratio_min", "ratio_max", "rounds"}``:
        medians over rounds; the ratio taken within each round.
    """
    import dataclasses

    import torch

    from hermes.config import MemoryConfig
    from hermes.models.tiny import tiny_llava_onevision_config
    from hermes.pipelines.bench.common import synthetic_frames
    from hermes.pipelines.bench.memory import BENCH_QUESTION, PolicySpec, _warm_up
    from hermes.pipelines.session import format_prompt

    root, python = check_reference(ref_dir, ref_python)
    torch.set_num_threads(threads)
    memory = dataclasses.replace(memory or MemoryConfig(), policy="hermes", budget=budget, recall=False,
                                 recall_gate="off", recall_share=0.0, recall_gate_margin=0.0, recall_max_ratio=0.0)
    stream = list(synthetic_frames(frames, side_px=frame_px, seed=seed))
    rows = []
    with tempfile.TemporaryDirectory(prefix="hermes-bench-reference-") as tmp:
        workdir = Path(tmp)
        np.save(workdir / "frames.npy", np.stack([f.rgb for f in stream]))
        for geo in geometries:
            model, tokenizer = geometry_model(geo, seed)
            _warm_up(model, PolicySpec("hermes", memory), chunk_frames, 1, frame_px)
            spec = {"config": tiny_llava_onevision_config(tokenizer, geo.image_size, geo.hidden_size, geo.num_layers),
                    "seed": seed, "frames": str(workdir / "frames.npy"), "chunk_frames": chunk_frames,
                    "budget": budget, "repeats": repeats, "threads": threads, "device": "cpu", "dtype": "float32",
                    "pseudo_query_tokens": [model.question_embeds(memory.local_query).shape[0],
                                            model.question_embeds(memory.global_query).shape[0]],
                    "question_tokens": model.question_embeds(format_prompt(BENCH_QUESTION)).shape[0],
                    "prefix_tokens": model.embed_text(model.prefix_text()).shape[0],
                    "eos_token_id": tokenizer.eos_token_id}
            measured = []  # per round: {"ours": values, "reference": values}
            for r in range(rounds):
                sides = {}
                for side in (("ours", "reference") if r % 2 == 0 else ("reference", "ours")):
                    sides[side] = _ours(model, memory, stream, chunk_frames, repeats) if side == "ours" else \
                        _reference_values(run_reference(root, python, spec, workdir, timeout_s))
                measured.append(sides)
            for metric in measured[0]["reference"]:
                ratios = [m["ours"][metric] / m["reference"][metric] for m in measured if m["reference"][metric]]
                rows.append({"geometry": geo.label, "metric": metric,
                             "ours": statistics.median(m["ours"][metric] for m in measured),
                             "reference": statistics.median(m["reference"][metric] for m in measured),
                             "ratio": statistics.median(ratios) if ratios else None,
                             "ratio_min": min(ratios, default=None), "ratio_max": max(ratios, default=None),
                             "rounds": rounds})
    return rows


def ratio_table(rows: list[dict]) -> str:
    """`compare`'s rows as a markdown table."""
    return table(["geometry", "metric", "ours", "reference", "ours / reference, min / median / max"],
                 [[r["geometry"], r["metric"], f"{r['ours']:.3f}", f"{r['reference']:.3f}",
                   spread_cell([r.get(k) for k in ("ratio_min", "ratio", "ratio_max")])] for r in rows],
                 right=[False, False, True, True, True])
