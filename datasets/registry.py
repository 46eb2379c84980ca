"""The benchmarks `hermes-video eval` knows, found in `datasets/benchmarks/` (no list kept by hand).

`BENCHMARKS` maps a canonical name to its `Benchmark` (loader, protocol, metric and the hooks of
`hermes.datasets.benchmark`): every module of the `benchmarks` package contributes its own
`BENCHMARKS` and `ALIASES`. Names are matched case-insensitively and without regard to "-", "_"
or spaces, so "OVO-Bench", "ovo_bench" and "ovobench" are the same; an unknown name fails with a
suggestion.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
from collections.abc import Sequence

from hermes.errors import UsageError, closest

from . import benchmarks as package
from .benchmark import Benchmark, Prompt
from .records import KIND_PROACTIVE, BenchmarkQuestion


def _fold(name: str) -> str:
    """Case- and punctuation-insensitive form of a benchmark name."""
    return re.sub(r"[\s_\-.]+", "", str(name)).casefold()


@functools.cache
def _found() -> tuple[dict[str, Benchmark], dict[str, str]]:
    """(benchmarks by canonical name, aliases and folded names -> canonical name), from every module."""
    found: dict[str, Benchmark] = {}
    aliases: dict[str, str] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, benchmark in getattr(module, "BENCHMARKS", {}).items():
            if name in found:
                raise RuntimeError(f"benchmark {name!r} is defined twice (again in {module.__name__})")
            found[name] = benchmark
            aliases[_fold(name)] = name
        aliases.update(getattr(module, "ALIASES", {}))
    return found, aliases


def __getattr__(name: str):
    if name == "BENCHMARKS":  # found on first use: importing the registry loads no benchmark
        return _found()[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def canonical_name(name: str) -> str:
    """The registry key for a benchmark name as a user may type it.

    Args:
        name: "OVO-Bench", "video_mme", "rvs-ego", ...

    Returns:
        The canonical name ("ovo-bench", "videomme", "rvs-ego").

    Raises:
        UsageError: For an unknown benchmark, with a did-you-mean suggestion.
    """
    found, aliases = _found()
    folded = _fold(name)
    if folded in aliases:
        return aliases[folded]
    own = {_fold(n): n for n in found}
    close = closest(folded, list(own), cutoff=0.6)
    hint = f"did you mean {own[close]!r}?" if close is not None else f"choose one of {', '.join(sorted(found))}"
    raise UsageError(f"unknown benchmark {name!r}; {hint}")


def get_benchmark(name: str) -> Benchmark:
    """Look a benchmark up by name.

    Args:
        name: Any accepted spelling (see `canonical_name`).

    Returns:
        Its `Benchmark`.

    Raises:
        UsageError: For an unknown benchmark, with a did-you-mean suggestion.
    """
    return _found()[0][canonical_name(name)]


def family(name: str) -> str:
    """The name a benchmark's prompts and parsers are keyed by (both RVS subsets are "rvs").

    Raises:
        UsageError: For an unknown benchmark.
    """
    return get_benchmark(name).family or canonical_name(name)


def by_metric(metric: str) -> Benchmark:
    """A benchmark whose metric is `metric` (those sharing a metric share its hooks).

    Raises:
        UsageError: For a metric no benchmark uses.
    """
    found = _found()[0]
    match = next((b for b in found.values() if b.metric == metric), None)
    if match is None:
        known = ", ".join(sorted({b.metric for b in found.values()}))
        raise UsageError(f"unknown metric {metric!r}; expected one of {known}")
    return match


def build_prompt(benchmark: str, question: BenchmarkQuestion, previous: Sequence[BenchmarkQuestion] = (),
                 stage: str = "answer") -> Prompt:
    """The official prompt for one question (texts as the official code has them, spelling included).

    Args:
        benchmark: Benchmark name (any accepted spelling).
        question: The question.
        previous: Questions asked earlier on the same video; StreamingBench SQA puts them,
            with their reference answers, into the prompt as the official eval does.
        stage: "answer", or "poll" for the yes/no "is it time?" query of StreamingBench
            proactive output (which the official loop asks every second).

    Returns:
        The Prompt.

    Raises:
        UsageError: Unknown benchmark, or a stage the question does not have.
    """
    spec = get_benchmark(benchmark)
    if stage not in ("answer", "poll") or (stage == "poll" and question.kind != KIND_PROACTIVE):
        raise UsageError(f"unknown prompt stage {stage!r} for a {question.kind} question; use 'answer'")
    return spec.prompt(question, previous, stage)
