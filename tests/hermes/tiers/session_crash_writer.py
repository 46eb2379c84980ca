"""Crash-test helper: a fork server whose children stream into a memory directory until killed.

Run by tests/hermes/tiers/test_session_crash.py:

    python session_crash_writer.py DIR

It loads the tiny model once (one torch thread, so children inherit no thread pool), then for every
``go MODE N DRAM_BYTES [FRAMES]`` line on stdin forks a child and prints ``pid <pid>``. The child opens a
`StreamingSession` on DIR (resuming when DIR holds a checkpoint), prints ``ready``, then encodes
chunks of synthetic frames forever (FRAMES ``random``, the default, or ``flat``: each frame one grey
level, a blank camera), printing ``chunk <frames> <ids>`` after each chunk (the ids of
the records that chunk's eviction kept). MODE picks where it dies:

- ``random``: never by itself; the test SIGKILLs it at a random moment;
- ``checkpoint``: SIGKILLs itself inside the N-th checkpoint save (tensor file written, JSON not);
- ``manifest``: SIGKILLs itself before the N-th manifest write (either store's, on the writer or
  the syncer thread): a segment's bytes are durable, the line naming them is not;
- ``close``: after N chunks it closes the session and SIGKILLs itself at the second manifest write
  of the close (host memory half moved to disk).

The server reaps the child and prints ``done <status>``. Memory settings are the defaults (only the
level-1 budget is small so that a short stream evicts, and DRAM_BYTES, default 2 GiB, may be
lowered so that host memory spills to disk).
"""

import importlib.util
import os
import signal
import sys
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(1)
torch.set_num_interop_threads(1)
# by path: with tests/ on sys.path, tests/hermes would shadow the hermes package
_spec = importlib.util.spec_from_file_location("fork_server", Path(__file__).resolve().parents[2] / "fork_server.py")
_fork_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fork_server)
serve = _fork_server.serve

from hermes.config import MemoryConfig, ModelConfig  # noqa: E402
from hermes.models.loading import load_model  # noqa: E402
from hermes.pipelines.frames import Frame  # noqa: E402
from hermes.pipelines.session import StreamingSession  # noqa: E402
from hermes.tiers import checkpoint  # noqa: E402
from hermes.tiers.disk import DiskStore  # noqa: E402
from hermes.tiers.fingerprint import weights_digest  # noqa: E402

CHUNK = 4
BUDGET = 64  # tokens per layer: every chunk of 4 x 196 tokens evicts


def _say(line: str) -> None:
    os.write(sys.stdout.fileno(), (line + "\n").encode())  # one write(2): atomic in the pipe


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_on_call(owner, name: str, n: int) -> None:
    """SIGKILL this process at the n-th call of owner.name (before the call does anything)."""
    original = getattr(owner, name)
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            _die()
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def stream(model, directory: str, mode: str, n: int, dram_bytes: int, frames: str = "random") -> None:
    cfg = MemoryConfig(policy="hermes", budget=BUDGET, dram_bytes=dram_bytes)
    resume = os.path.exists(os.path.join(directory, checkpoint.CHECKPOINTS, "session.json"))
    session = StreamingSession(model, cfg, (), chunk_frames=CHUNK, memory_dir=directory, resume=resume)
    ids: list[int] = []
    store = session.lower.store
    add = store.add
    # the id the record is held under: its own, or that of the copy stored before the kill (exactly once)
    store.add = lambda record: (held := add(record), ids.append(held))[0]
    if mode == "checkpoint":
        _kill_on_call(checkpoint, "write_json_atomic", n)  # inside save: after the tensor file
    elif mode == "manifest":
        _kill_on_call(DiskStore, "_write_manifest", n)
    _say("ready")
    rng = np.random.default_rng(len(session.encoded_t_s))
    chunks = 0
    while True:
        first = len(session.encoded_t_s)
        pixels = [rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) if frames == "random"
                  else np.full((32, 32, 3), 50 * ((first + i) % 6), np.uint8) for i in range(CHUNK)]
        session.ingest([Frame((first + i) * 0.5, pixels[i], first + i) for i in range(CHUNK)])
        _say(f"chunk {len(session.encoded_t_s)} {','.join(map(str, ids)) or '-'}")
        ids.clear()
        chunks += 1
        if mode == "close" and chunks == n:
            _kill_on_call(DiskStore, "_write_manifest", 2)
            session.close()
            _say("closed")
            return


def main() -> None:
    directory = sys.argv[1]
    model = load_model(ModelConfig(name="tiny-llava-onevision"))
    weights_digest(model)  # hashed once here, not in every child
    def child(args: list[str]) -> int:
        stream(model, directory, args[0], int(args[1]), int(args[2]), *args[3:])
        return 0

    serve("go", child)

if __name__ == "__main__":
    main()
