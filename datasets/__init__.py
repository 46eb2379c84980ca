"""Benchmark loading for `hermes-video eval` (docs/ARCHITECTURE.md, Evaluation), installed as `hermes.datasets`.

* `records`: the unified `VideoRecord` / `Question` and the timestamp/option parsers;
* one loader module per benchmark family (`ovo_bench`, `streamingbench`, `rvs`, `mvbench`,
  `egoschema`, `videomme`, `mlvu`, `longvideobench`, `lvbench`), each with
  `load(data_root, tasks=None, limit=None) -> list[VideoRecord]`; `common` holds what they share;
* `registry`: `BENCHMARKS` (loader, protocol, metric) and `get_benchmark(name)`;
* `prompts`: the official prompt per benchmark;
* `parsing`: official and strict answer extraction, per-sample scoring;
* `metrics`: aggregation as each benchmark defines it, with coverage;
* `runner`: `run_eval`, the streaming and offline protocols end to end, over `record_frames`
  (frames of a file, `.npy` array or frame folder), `results` (append-only sample log, resume),
  `judge` (open-ended scoring), `summary` (summary.json) and `report` (report.md, plots);
* `cli`: the `eval` command (`add_eval_parser`, `cmd_eval`).

Submodules are imported on demand; importing this package loads nothing heavy.
"""
