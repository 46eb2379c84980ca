"""The benchmarks `hermes-video eval` knows: `BENCHMARKS` (canonical name -> `Benchmark`), gathered from
every module of `datasets/benchmarks/`. Names match without regard to case, "-", "_" or spaces."""

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
    return re.sub(r"[\s_\-.]+", "", str(name)).casefold()


@functools.cache
def _found() -> tuple[dict[str, Benchmark], dict[str, str]]:
    """(benchmarks by canonical name, aliases and folded names -> canonical name)."""
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
    """The registry key ("ovo-bench") for a name as a user may type it ("OVO_Bench").

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
    """The `Benchmark` of any accepted spelling of its name.

    Raises:
        UsageError: For an unknown benchmark, with a did-you-mean suggestion.
    """
    return _found()[0][canonical_name(name)]


def by_metric(metric: str) -> Benchmark:
    """A benchmark whose metric is `metric` (benchmarks sharing a metric share its hooks).

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
        previous: Questions asked earlier on the video (StreamingBench SQA puts them in the prompt).
        stage: "answer", or "poll": the "is it time?" query of StreamingBench proactive output.

    Raises:
        UsageError: Unknown benchmark, or a stage the question does not have.
    """
    spec = get_benchmark(benchmark)
    if stage not in ("answer", "poll") or (stage == "poll" and question.kind != KIND_PROACTIVE):
        raise UsageError(f"unknown prompt stage {stage!r} for a {question.kind} question; use 'answer'")
    return spec.prompt(question, previous, stage)
