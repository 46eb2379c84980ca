"""One module per benchmark, each exporting `BENCHMARKS` and optionally `ALIASES` (docs/ADDING_A_BENCHMARK.md)."""
