"""The benchmarks `hermes-video eval` knows: loader, protocol and metric for each.

`BENCHMARKS` maps a canonical name to `Benchmark(loader, protocol, metric)`:

* loader: `load(data_root, tasks=None, limit=None) -> list[VideoRecord]`;
* protocol: "streaming" (one stream per video, questions asked at their time, the stream
  continuing after each answer: docs/ARCHITECTURE.md, Evaluation) or "offline" (the whole video, then the questions);
* metric: the aggregation `metrics.summarize` applies (see metrics.py).

Names are matched case-insensitively and without regard to "-", "_" or spaces, so "OVO-Bench",
"ovo_bench" and "ovobench" are the same; an unknown name fails with a suggestion.
"""

from __future__ import annotations

import functools
import re
from typing import Callable, NamedTuple

from hermes.errors import UsageError, closest

from . import egoschema, longvideobench, lvbench, mlvu, mvbench, ovo_bench, rvs, streamingbench, videomme

STREAMING = "streaming"
OFFLINE = "offline"


class Benchmark(NamedTuple):
    """How to load, run and score one benchmark."""

    loader: Callable
    protocol: str
    metric: str


BENCHMARKS: dict[str, Benchmark] = {
    "ovo-bench": Benchmark(ovo_bench.load, STREAMING, "ovo"),
    "streamingbench": Benchmark(streamingbench.load, STREAMING, "streamingbench"),
    "rvs-ego": Benchmark(functools.partial(rvs.load, subset="ego"), STREAMING, "judge"),
    "rvs-movie": Benchmark(functools.partial(rvs.load, subset="movie"), STREAMING, "judge"),
    "mvbench": Benchmark(mvbench.load, OFFLINE, "accuracy"),
    "egoschema": Benchmark(egoschema.load, OFFLINE, "accuracy"),
    "videomme": Benchmark(videomme.load, OFFLINE, "videomme"),
    "mlvu": Benchmark(mlvu.load, OFFLINE, "mlvu"),
    "longvideobench": Benchmark(longvideobench.load, OFFLINE, "longvideobench"),
    "lvbench": Benchmark(lvbench.load, OFFLINE, "lvbench"),
}

# Other spellings people use for the same benchmarks (keys already in folded form).
ALIASES = {
    "ovo": "ovo-bench",
    "streaming": "streamingbench",
    "rvsego": "rvs-ego",
    "rvsmovie": "rvs-movie",
    "videomme": "videomme",
    "lvb": "longvideobench",
    "mlvudev": "mlvu",
}


def _fold(name: str) -> str:
    """Case- and punctuation-insensitive form of a benchmark name."""
    return re.sub(r"[\s_\-.]+", "", str(name)).casefold()


_BY_FOLDED = {_fold(name): name for name in BENCHMARKS}


def canonical_name(name: str) -> str:
    """The registry key for a benchmark name as a user may type it.

    Args:
        name: "OVO-Bench", "video_mme", "rvs-ego", ...

    Returns:
        The canonical name ("ovo-bench", "videomme", "rvs-ego").

    Raises:
        UsageError: For an unknown benchmark, with a did-you-mean suggestion.
    """
    folded = _fold(name)
    if folded in _BY_FOLDED:
        return _BY_FOLDED[folded]
    if folded in ALIASES:
        return ALIASES[folded]
    choices = sorted(BENCHMARKS)
    close = closest(folded, list(_BY_FOLDED), cutoff=0.6)
    hint = f"did you mean {_BY_FOLDED[close]!r}?" if close is not None else f"choose one of {', '.join(choices)}"
    raise UsageError(f"unknown benchmark {name!r}; {hint}")


def get_benchmark(name: str) -> Benchmark:
    """Look a benchmark up by name.

    Args:
        name: Any accepted spelling (see `canonical_name`).

    Returns:
        Its `Benchmark(loader, protocol, metric)`.

    Raises:
        UsageError: For an unknown benchmark, with a did-you-mean suggestion.
    """
    return BENCHMARKS[canonical_name(name)]


def family(name: str) -> str:
    """The benchmark family a name belongs to, as prompts and parsers key them.

    The two RVS subsets share one prompt and one (judge) scoring: both are "rvs".

    Raises:
        UsageError: For an unknown benchmark.
    """
    canonical = canonical_name(name)
    return "rvs" if canonical.startswith("rvs-") else canonical
