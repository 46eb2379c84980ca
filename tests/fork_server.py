"""The loop of the tests' fork servers: one child per stdin line, reaped, its status reported.

A server imports torch and builds what its children share once, then calls `serve(word, child)`:
for every stdin line whose first word is `word`, it forks; the child runs ``child(args)`` (the
line's remaining words, shell-split) and exits with its return value (2, after a traceback on
stderr, if it raised); the server prints ``pid <pid>`` at once and ``done <wait status>`` when the
child ends. Any other line (or the end of stdin) stops the server.
"""

import os
import shlex
import sys
import traceback
from collections.abc import Callable


def serve(word: str, child: Callable[[list[str]], int]) -> None:
    for line in sys.stdin:
        parts = shlex.split(line)
        if not parts or parts[0] != word:
            break
        sys.stdout.flush()  # nothing buffered may be written twice, by server and child
        pid = os.fork()
        if pid == 0:
            code = 2
            try:
                code = child(parts[1:])
            except BaseException:  # shown on the test's stderr; the exit status tells the test
                traceback.print_exc()
            finally:
                os._exit(code)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"done {status}", flush=True)
