"""`hermes-video eval`, installed as `hermes.datasets`: one module per benchmark in `benchmarks/` behind
the `benchmark.Benchmark` protocol, and what they share (docs/ARCHITECTURE.md, Evaluation;
docs/ADDING_A_BENCHMARK.md). Importing this package loads nothing heavy."""
