"""One module per benchmark, each exporting `BENCHMARKS` (and optionally `ALIASES`): see `hermes.datasets.benchmark`.

The registry imports every module here; a new benchmark is a new module (README, "Adding a benchmark").
"""
