"""The queue between a record store's callers and its writer: bounded, taken a batch at a time, since
`queue.Queue`'s one-item wake-ups swap the GIL per record, which costs more than encoding it."""

from __future__ import annotations

import queue
import threading
from collections import deque


class BatchQueue:
    """A bounded FIFO whose consumer takes every item queued, in order, in one call.

    Args:
        maxsize: Items that may wait; `put` blocks while this many do.
    """

    def __init__(self, maxsize: int) -> None:
        self.maxsize = max(1, int(maxsize))
        self._items: deque = deque()
        self._changed = threading.Condition(threading.Lock())  # an item arrived, or room was made

    def put(self, item) -> None:
        """Append `item`, waiting while the queue is full."""
        with self._changed:
            while len(self._items) >= self.maxsize:
                self._changed.wait()
            self._items.append(item)
            if len(self._items) == 1:  # the consumer may be waiting for one
                self._changed.notify_all()

    def take(self, limit: int, timeout: float | None = None) -> list:
        """The items queued (at most `limit`, oldest first), waiting for one if there is none.

        Raises:
            queue.Empty: None arrived within `timeout` seconds.
        """
        with self._changed:
            if not self._items and not self._changed.wait_for(lambda: self._items, timeout):
                raise queue.Empty
            return self._take(limit)

    def _take(self, limit: int) -> list:
        items = self._items
        if len(items) <= limit:
            batch = list(items)
            items.clear()
        else:
            batch = [items.popleft() for _ in range(limit)]
        self._changed.notify_all()  # callers waiting for room
        return batch

    def empty(self) -> bool:
        """Whether nothing is queued now."""
        return not self._items

    def full(self) -> bool:
        """Whether a `put` would wait now."""
        return len(self._items) >= self.maxsize
