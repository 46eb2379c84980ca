"""The writer queue of the record stores: bounded, FIFO, taken a batch at a time."""

from __future__ import annotations

import queue
import threading

import pytest

from hermes.tiers.batch_queue import BatchQueue


def test_items_come_out_in_order_a_batch_at_a_time_up_to_the_limit():
    q = BatchQueue(10)
    for i in range(5):
        q.put(i)
    assert q.take(2) == [0, 1]
    q.put(5)
    assert q.take(10) == [2, 3, 4, 5] and q.empty()
    with pytest.raises(queue.Empty):  # nothing left to take
        q.take(10, timeout=0)


def test_take_waits_for_an_item_and_times_out_without_one():
    q = BatchQueue(2)
    with pytest.raises(queue.Empty):
        q.take(8, timeout=0.05)
    threading.Timer(0.05, q.put, args=("late",)).start()
    assert q.take(8) == ["late"]  # no timeout: waits for it


def test_a_put_on_a_full_queue_waits_until_the_consumer_takes_the_batch():
    q = BatchQueue(3)
    for i in range(3):
        q.put(i)
    assert q.full()
    done = threading.Event()
    producer = threading.Thread(target=lambda: (q.put(3), done.set()))
    producer.start()
    assert not done.wait(0.2)  # the queue is full: the fourth put waits
    assert q.take(8) == [0, 1, 2]  # everything queued, at once
    producer.join(10)
    assert done.is_set() and q.take(8) == [3]
