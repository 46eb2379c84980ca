"""Measurement code: every `hermes-video bench` suite, beside the runtime it measures (never imported by it).

- `cli`: the `bench` parser and one handler per suite;
- `common`: what every suite shares (device synchronisation, synthetic frames, tables, result files, run details);
- `memory`: `bench memory`, `bench sweep` and `bench overhead` (one stream measurement behind all three);
- `reference`: `bench reference`, the authors' pipeline beside ours (`reference_driver` runs in its environment);
- `tiers`: `bench tiers`, levels 2 and 3 (recall, search, write throughput, checkpoints, object stores);
- `serve`: `bench serve`, N streams into one served model against N `run` processes;
- `device`: `bench device`, preprocessing on the host vs the device, eager vs compiled decode, the probe's memory;
- `host`: `bench gc` and `bench ingest`, what a whole stream costs on the host;
- `chaos`: `bench chaos`, SIGKILLs at random moments, then verify and resume.
"""
