"""Benchmark loading for `hermes-video eval` (docs/ARCHITECTURE.md, Evaluation), installed as `hermes.datasets`.

* `benchmarks/`: one module per benchmark (`ovo_bench`, `streamingbench`, `rvs`, `mvbench`,
  `egoschema`, `videomme`, `mlvu`, `longvideobench`, `lvbench`), each holding its loader, official
  prompt, parser and metric extras behind the `benchmark.Benchmark` protocol;
* `records`: the unified `VideoRecord` / `BenchmarkQuestion` and the timestamp/option parsers;
  `common`: what every loader shares (files, selection, `make_loader`);
* `registry`: `BENCHMARKS`, found in `benchmarks/`, `get_benchmark(name)` and `build_prompt`;
* `parsing`: official and strict answer extraction, per-sample scoring;
* `metrics`: aggregation (the benchmark's hooks add its official extras), with coverage;
* `runner`: `run_eval`, the streaming and offline protocols end to end, and `merge_shards`; over
  `record_frames` (frames of a file, `.npy` array or frame folder), `results` (append-only sample log, resume),
  `judge` (open-ended scoring), `summary` (summary.json) and `report` (report.md, plots);
* `cli`: the `eval` command (`add_eval_parser`, `cmd_eval`).

Submodules are imported on demand; importing this package loads nothing heavy.
"""
