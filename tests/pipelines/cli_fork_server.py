"""Test helper: a fork server that runs ``hermes-video`` commands in children, without start-up cost.

    python cli_fork_server.py

Imports hermes and builds the tiny model once (one torch thread, so children inherit no thread
pool), then for every line ``run OUT_FILE ARG...`` on stdin forks a child that runs
``hermes.cli.main([ARG...])`` with stdout and stderr written to OUT_FILE (``.out`` / ``.err``) and
prints ``pid <pid>``; when the child ends it prints ``done <wait status>``. SIGINT has its default
Python behaviour in the children (the server itself ignores it).
"""

import os
import shlex
import signal
import sys

import torch

torch.set_num_threads(1)
torch.set_num_interop_threads(1)

import hermes.cli  # noqa: E402
from hermes.config import ModelConfig  # noqa: E402
from hermes.models.loading import load_model  # noqa: E402


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    load_model(ModelConfig(name="tiny-llava-onevision"))  # warms every import and lazy init the children use
    print("ready", flush=True)
    for line in sys.stdin:
        parts = shlex.split(line)
        if not parts or parts[0] != "run":
            break
        out_file, argv = parts[1], parts[2:]
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.default_int_handler)
                with open(out_file + ".out", "w") as out, open(out_file + ".err", "w") as err:
                    os.dup2(out.fileno(), 1)
                    os.dup2(err.fileno(), 2)
                    sys.stdout = os.fdopen(1, "w", buffering=1)
                    sys.stderr = os.fdopen(2, "w", buffering=1)
                    code = hermes.cli.main(argv)
                    sys.stdout.flush()
                    sys.stderr.flush()
            finally:
                os._exit(code)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"done {status}", flush=True)


if __name__ == "__main__":
    main()
