"""Ingest rate of a 1080p video file, end to end: decode, preprocess, encode, maintenance.

Writes a 1920x1080 mp4 (25 fps, moving content; OpenCV's mp4v encoder) once, then streams it at
`--fps` through `hermes` on the random cpu-small geometry (8 layers, 512 wide, 16 tokens per frame)
in chunks of 8, one torch thread, and prints frames per second of wall time from the first frame to
the end of the last chunk. Uses only APIs older than the reader thread, so the same command
measures an older checkout too (run it with that checkout's python).

    python scripts/bench_ingest_1080p.py [--seconds 12] [--video PATH] [--fps 2]
"""

import argparse
import time
from pathlib import Path

import cv2
import numpy as np
import torch

from hermes.config import MemoryConfig, ModelConfig
from hermes.models.loading import make_adapter
from hermes.models.tiny import tiny_llava_onevision
from hermes.pipelines.session import StreamingSession
from hermes.pipelines.sources import open_source


def write_1080p(path: Path, seconds: float = 12.0, fps: float = 25.0) -> None:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (1920, 1080))
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (1080, 1920, 3), dtype=np.uint8)
    for i in range(int(seconds * fps)):
        writer.write(np.roll(base, 8 * i, axis=1))  # moving texture: real inter-frame work for the decoder
    writer.release()


parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=12.0, help="length of the video written (default: 12)")
parser.add_argument("--video", help="the 1080p file (default: /tmp/hermes-1080p-<seconds>s.mp4, written if missing)")
parser.add_argument("--fps", type=float, default=2.0)
args = parser.parse_args()
video = Path(args.video or f"/tmp/hermes-1080p-{args.seconds:g}s.mp4")
if not video.exists():
    write_1080p(video, seconds=args.seconds)
torch.set_num_threads(1)
net, tokenizer = tiny_llava_onevision(seed=0, image_size=28, hidden_size=512, num_layers=8)
model = make_adapter("llava_onevision", "cpu-small", net, tokenizer, ModelConfig(device="cpu", dtype="float32"))
rates = []
for _ in range(2):
    source = open_source(str(video), fps=args.fps)
    session = StreamingSession(model, MemoryConfig(policy="hermes", budget=64), source, chunk_frames=8)
    start = time.perf_counter()
    session.advance()
    rates.append(len(session.encoded_t_s) / (time.perf_counter() - start))
    session.close()
    source.close()
print(f"1080p ingest at {args.fps:g} fps sampling: {max(rates):.2f} frames/s (best of 2: {rates})")
