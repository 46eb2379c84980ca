"""Frames decoded on a reader thread ahead of the model: same frames, same order, errors in place, bounded."""

import numpy as np
import pytest

from hermes.errors import SourceError
from hermes.pipelines.frames import Frame, ReadAhead
from hermes.pipelines.sources import open_source
from hermes.pipelines.synthetic import write_synthetic_video
from hermes.pipelines.video import open_video


def counted(n: int, produced: list, fail_at: int | None = None):
    for i in range(n):
        if i == fail_at:
            raise SourceError(f"frame {i} is damaged")
        produced.append(i)
        yield Frame(i * 0.5, np.full((2, 2, 3), i, dtype=np.uint8), i)


def test_frames_arrive_in_order_and_the_reader_stays_within_its_bound():
    produced, consumed = [], 0
    ahead = ReadAhead(counted(40, produced), max_frames=3)
    for frame in ahead:
        assert frame.index == consumed
        consumed += 1
        assert len(produced) <= consumed + 3 + 1  # the queue, plus the one the reader holds
    assert consumed == 40
    ahead.close()


def test_a_readers_error_comes_after_the_frames_before_it():
    got = []
    with pytest.raises(SourceError, match="frame 5 is damaged"):
        for frame in ReadAhead(counted(10, [], fail_at=5), max_frames=2):
            got.append(frame.index)
    assert got == [0, 1, 2, 3, 4]


def test_close_stops_a_reader_blocked_on_a_full_queue():
    ahead = ReadAhead(counted(1000, []), max_frames=2)
    first = next(iter(ahead))
    assert first.index == 0
    ahead.close()
    assert not ahead._thread.is_alive()


def test_a_video_file_source_yields_what_the_file_reader_yields(tmp_path):
    path = write_synthetic_video(tmp_path / "clip.mp4", duration_s=4.0, fps=10.0)
    with open_video(path) as video:
        direct = list(video.frames(fps=2.0))
    source = open_source(str(path), fps=2.0)
    try:
        through = list(source)
    finally:
        source.close()
    assert [f.t_s for f in through] == [f.t_s for f in direct] and len(direct) == 8
    assert all(np.array_equal(a.rgb, b.rgb) for a, b in zip(through, direct))


def test_closing_ends_a_consumer_that_waits_for_frames():
    """`close` from another thread (serve deleting a file stream) ends the consumer's iteration: the reader
    stops without a last item, so a consumer blocked on the queue waited forever (its pump join timed out)."""
    import threading
    import time

    def endless():
        index = 0
        while True:
            yield Frame(index * 0.1, np.zeros((2, 2, 3), np.uint8), index)
            index += 1

    read_ahead, got, first = ReadAhead(endless(), max_frames=1), [], threading.Event()

    def consume():
        for frame in read_ahead:
            got.append(frame)
            first.set()
            time.sleep(0.01)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    assert first.wait(30)
    read_ahead.close()
    consumer.join(timeout=30)
    assert not consumer.is_alive() and got
