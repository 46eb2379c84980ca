"""The `memory` subcommand of `hermes-video`: inspect, verify or repair a memory directory (the work is
in `hermes.tiers.commands`)."""

from __future__ import annotations

import argparse

from hermes.cli_args import add_common_options, positive_int


def _command(name: str, *options: str):
    """`hermes.tiers.commands.<name>(args.directory, *options)`, imported when the action runs."""
    def run(args) -> int:
        from hermes.tiers import commands

        return getattr(commands, name)(args.directory, *(getattr(args, option) for option in options))
    return run


def add_memory_parser(subparsers) -> argparse.ArgumentParser:
    """Register `memory inspect|verify|repair DIR` on a subparsers object; returns the `memory` parser."""
    memory_cmd = subparsers.add_parser("memory", help="inspect, verify or repair a memory directory")
    add_common_options(memory_cmd)
    memory_sub = memory_cmd.add_subparsers(dest="memory_command", metavar="ACTION", required=True)
    inspect = memory_sub.add_parser("inspect", help="records, time spans, sizes, index state, checkpoints")
    inspect.add_argument("directory", metavar="DIR")
    inspect.add_argument("--records", type=positive_int, default=20, help="records to list (default 20)")
    inspect.add_argument("--json", action="store_true", help="the report as JSON")
    add_common_options(inspect)
    inspect.set_defaults(func=_command("inspect_command", "records", "json"))
    verify = memory_sub.add_parser("verify", help="check every checksum and source of truth; exit 0 only when all hold")
    verify.add_argument("directory", metavar="DIR")
    verify.add_argument("--json", action="store_true", help="the checks as one JSON object (ok, problems, duplicates, "
                        "disagreements, counts, notes, repair)")
    add_common_options(verify)
    verify.set_defaults(func=_command("verify_command", "json"))
    repair = memory_sub.add_parser("repair", help="rebuild the manifest and index from the segments; move what "
                                   "cannot be kept to DIR/quarantine (nothing is deleted)")
    repair.add_argument("directory", metavar="DIR")
    add_common_options(repair)
    repair.set_defaults(func=_command("repair_command"))
    return memory_cmd
