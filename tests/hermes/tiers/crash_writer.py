"""Crash-test helper: a fork server whose children write records into a DiskStore until killed.

Run by tests/hermes/tiers/test_tier_crash.py:

    python crash_writer.py DIR CAPACITY_BYTES SEGMENT_BYTES

It imports torch once, then for every ``go`` line on stdin forks a writer and prints
``pid <pid>``. The writer opens the store, prints ``ready``, then writes records forever, printing
each record id only after `flush` has returned (so every printed id is committed). The test kills
the writer with SIGKILL; the server reaps it and prints ``done``. Forking skips the second of
interpreter and torch start-up per trial; the server itself runs no torch ops before forking, so
the children inherit no thread pools. Record content is `crash_record(id)`, which the test
regenerates to check what it reads back.
"""

import os
import sys

from hermes.pipelines.bench.tiers import synthetic_record
from hermes.tiers.disk import DiskStore

FINGERPRINT = {"model": "crash-test", "family": "synthetic", "num_layers": 3}


def crash_record(record_id: int):
    """Record `record_id` as the writer stores it: sizes vary so kills land at many offsets."""
    return synthetic_record(record_id, layers=3, heads=2, tokens=4 + record_id % 29, head_dim=32,
                            embed_dim=16).compress("int8")


def _say(line: str) -> None:
    """One line in one write(2): a kill can't leave half of it in the pipe.

    `print` writes the text and the newline separately when Python runs unbuffered
    (PYTHONUNBUFFERED=1, as on CI), and a SIGKILL between the two once left "1783" glued to the
    server's next "done" line. A pipe write under PIPE_BUF bytes is atomic.
    """
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def write_forever(directory: str, capacity: int, segment: int) -> None:
    store = DiskStore(directory, capacity, FINGERPRINT, segment_bytes=segment)
    _say("ready")
    rid = store.next_id
    while True:
        store.add(crash_record(rid))
        store.flush()
        _say(str(rid))
        rid += 1


def main() -> None:
    directory, capacity, segment = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for line in sys.stdin:
        if line.strip() != "go":
            break
        sys.stdout.flush()  # nothing buffered may be written twice, by parent and child
        pid = os.fork()
        if pid == 0:
            try:
                write_forever(directory, capacity, segment)
            finally:
                os._exit(1)  # never return into the server's loop
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"done {status}", flush=True)


if __name__ == "__main__":
    main()
