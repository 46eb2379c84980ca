"""The `pull` and `models` subcommands of `hermes-video` (the work is in `hermes.models.hub`, no torch)."""

from __future__ import annotations

import json
import sys

from hermes.cli_args import add_common_options, check_output_path


def cmd_pull(args) -> int:
    """`pull MODEL`: download a checkpoint (a builtin model is already here: exit 0); the exit code."""
    from hermes.model_registry import model_entry
    from hermes.models.hub import hub_id_of, pull

    entry = model_entry(args.model)
    if entry is not None and entry.builtin:
        print(f"{args.model} is builtin (shipped with the package, built offline): nothing to pull; "
              f"hermes-video run VIDEO --model {args.model} ...", file=sys.stderr)
        return 0
    hub_id = hub_id_of(args.model)
    if args.local_dir:
        check_output_path(args.local_dir, "--local-dir", directory=True)
    print(f"pulling {hub_id}" + (f" at {args.revision}" if args.revision else "")
          + (f" into {args.local_dir}" if args.local_dir else " into the Hugging Face cache"), file=sys.stderr)
    path = pull(args.model, revision=args.revision, local_dir=args.local_dir, progress=not args.quiet)
    print(path)
    where = f"--model {path}" if args.local_dir else f"--model {args.model}"
    print(f"ready: hermes-video run VIDEO {where} ... (works offline, HF_HUB_OFFLINE=1)", file=sys.stderr)
    return 0


def cmd_models(args) -> int:
    from hermes.models.hub import format_models, list_models

    entries = list_models()
    if args.json:
        for e in entries:
            print(json.dumps({"name": e.name, "family": e.family, "hub_id": e.hub_id,
                              "on_disk": e.on_disk_bytes is not None, "size_bytes": e.on_disk_bytes}))
    else:
        print(format_models(entries))
    return 0


def add_model_parsers(subparsers) -> None:
    """Register `pull MODEL` and `models` on a subparsers object."""
    pull_cmd = subparsers.add_parser("pull", help="download a model's checkpoint (then it loads offline)")
    pull_cmd.add_argument("model", metavar="MODEL", help="a model preset (see `hermes-video models`) or a hub id")
    pull_cmd.add_argument("--revision", metavar="REV", help="commit hash, branch or tag to pin (default: main); "
                                                            "load it with --set model.revision=REV")
    pull_cmd.add_argument("--local-dir", metavar="DIR", help="download into DIR instead of the Hugging Face cache "
                                                             "(then --model DIR)")
    pull_cmd.add_argument("--quiet", action="store_true", help="no progress bars")
    add_common_options(pull_cmd)
    pull_cmd.set_defaults(func=cmd_pull)

    models_cmd = subparsers.add_parser("models", help="model presets, which are on disk (Hugging Face cache), sizes")
    models_cmd.add_argument("--json", action="store_true", help="one JSON object per model")
    add_common_options(models_cmd)
    models_cmd.set_defaults(func=cmd_models)
