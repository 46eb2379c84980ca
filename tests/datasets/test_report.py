"""report.md from a summary: tables always; plots through matplotlib when it is installed (here a
stand-in module records the calls, since hermes does not depend on matplotlib)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

from hermes.datasets.report import ACCURACY_PLOT, MEMORY_PLOT, write_report


def summary(protocol: str = "streaming") -> dict:
    tally = {"expected": 2, "answered": 1, "scored": 1, "correct": 1, "accuracy": 0.5, "accuracy_answered": 1.0}
    accuracy = {"metric": "ovo", "overall": 0.5, "per_task": {"EPM": tally}, "per_category": {"backward": tally}}
    return {
        "benchmark": "ovo-bench", "protocol": protocol, "metric": "ovo", "model": "tiny",
        "accuracy": {"official": accuracy, "strict": {**accuracy, "overall": 0.0}},
        "coverage": {"questions_expected": 2, "questions_answered": 1, "questions_missing": 1, "fraction": 0.5,
                     "videos_expected": 2, "videos_missing": 1, "videos_unreadable": 1, "missing_videos": ["v2"],
                     "unreadable_videos": [{"video_id": "v3", "error": "video file is truncated"}]},
        "cost": {"ttft_ms": {"p50": 1.0, "p90": 2.0, "p99": 3.0, "max": 3.0, "mean": 1.5, "n": 2}},
        "judge": None, "config": {"memory": {"policy": "hermes"}}, "notes": ["a note"],
        "environment": {"versions": {"hermes": "0.1", "torch": "2", "transformers": "5"},
                        "git": {"commit": "abcdef0123456789", "dirty": True}},
        "finished_at": "2025-01-01T00:00:00+00:00", "wall_time_s": 1.0,
    }


SAMPLES = [{"video_id": "v1", "at_s": 1.0, "memory": {"hbm_bytes": 2**20}},
           {"video_id": "v1", "at_s": 2.0, "memory": {"hbm_bytes": 2**21}}]


def fake_matplotlib(monkeypatch) -> list:
    """Install a stand-in matplotlib whose savefig writes a file; returns the plot calls."""
    calls = []

    class Axes:
        def __getattr__(self, name):
            return lambda *args, **kwargs: calls.append((name, args, kwargs))

    class Figure:
        def tight_layout(self):
            pass

        def savefig(self, path, **kwargs):
            Path(path).write_bytes(b"\x89PNG")

    pyplot = types.ModuleType("matplotlib.pyplot")
    pyplot.subplots = lambda **kwargs: (Figure(), Axes())
    pyplot.close = lambda fig: None
    matplotlib = types.ModuleType("matplotlib")
    matplotlib.use = lambda backend: calls.append(("use", (backend,), {}))
    matplotlib.pyplot = pyplot
    monkeypatch.setitem(sys.modules, "matplotlib", matplotlib)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
    return calls


def test_report_tables_and_plots(tmp_path, monkeypatch):
    calls = fake_matplotlib(monkeypatch)
    text = write_report(tmp_path, summary(), SAMPLES).read_text()
    assert "| overall | 50.0% | 0.0% |" in text and "| EPM | 2 | 1 | 50.0% | 50.0% |" in text
    assert "not on disk: v2" in text and "unreadable v3: video file is truncated" in text
    assert "| TTFT (ms) | 1.0 | 2.0 | 3.0 | 3.0 |" in text and "git abcdef012345 (dirty)" in text
    assert f"]({ACCURACY_PLOT})" in text and f"]({MEMORY_PLOT})" in text
    assert (tmp_path / ACCURACY_PLOT).exists() and (tmp_path / MEMORY_PLOT).exists()
    assert ("use", ("Agg",), {}) in calls
    (plot,) = [c for c in calls if c[0] == "plot"]
    assert plot[1] == ([1.0, 2.0], [1.0, 2.0])  # MiB against question time


def test_report_without_matplotlib_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    text = write_report(tmp_path, summary("offline"), SAMPLES).read_text()
    assert "- plots skipped: matplotlib is not installed (pip install matplotlib)" in text
    assert ".png" not in text and not list(tmp_path.glob("*.png"))


def test_a_flat_memory_series_is_drawn_flat(tmp_path, monkeypatch):
    """A bounded memory's series, equal or a byte apart, gets y-limits from 0 past its value: autoscaled, the
    byte filled the axis (99.99999995..100.000001 MiB) and the line looked like it swung."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    limits = {}
    savefig = Figure.savefig

    def record(fig, path, **kwargs):
        limits[Path(path).name] = fig.axes[0].get_ylim()
        return savefig(fig, path, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    for extra_bytes in (0, 1):
        samples = [{"video_id": "v1", "at_s": float(t), "memory": {"hbm_bytes": 100 * 2**20 + extra_bytes * (t == 2)}}
                   for t in range(1, 4)]
        write_report(tmp_path, summary(), samples)
        low, high = limits[MEMORY_PLOT]
        assert low <= 0 and 105 <= high <= 200, (extra_bytes, low, high)  # the line sits flat, well inside
