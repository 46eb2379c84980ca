"""Test helper: a fork server that runs ``hermes-video`` commands in children, without start-up cost.

    python cli_fork_server.py

Imports hermes and builds the tiny model once (one torch thread, so children inherit no thread
pool), then for every line ``run OUT_FILE ARG...`` on stdin (shell-quoted) forks a child that runs
``hermes.cli.main([ARG...])`` with stdout and stderr written to OUT_FILE (``.out`` / ``.err``) and
prints ``pid <pid>``; when the child ends it prints ``done <wait status>``. SIGINT has its default
Python behaviour in the children (the server itself ignores it).
"""

import importlib.util
import os
import signal
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
torch.set_num_interop_threads(1)
# by path: with tests/ on sys.path, tests/hermes would shadow the hermes package
_spec = importlib.util.spec_from_file_location("fork_server", Path(__file__).resolve().parents[1] / "fork_server.py")
_fork_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fork_server)
serve = _fork_server.serve

import hermes.cli  # noqa: E402
from hermes.config import ModelConfig  # noqa: E402
from hermes.models.loading import load_model  # noqa: E402


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    load_model(ModelConfig(name="tiny-llava-onevision"))  # warms every import and lazy init the children use
    print("ready", flush=True)
    def child(args: list[str]) -> int:
        out_file, argv = args[0], args[1:]
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with open(out_file + ".out", "w") as out, open(out_file + ".err", "w") as err:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            code = hermes.cli.main(argv)
            sys.stdout.flush()
            sys.stderr.flush()
        return code

    serve("run", child)

if __name__ == "__main__":
    main()
