"""`/metrics`: the server's counters, per stream and server-wide, in the Prometheus text format (0.0.4)."""

from __future__ import annotations

import math

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values` by the nearest-rank rule; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(registry, scheduler) -> str:
    """The whole exposition text."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{labels} {value:g}" if not math.isnan(value) else f"{name}{labels} NaN")

    streams = registry.all()
    metric("hermes_streams", "gauge", "Streams open.", [("", len(streams))])
    metric("hermes_admissions_refused_total", "counter", "Streams refused for lack of room (503).",
           [("", registry.refused)])
    metric("hermes_model_busy_seconds_total", "counter", "Seconds the model worker spent encoding and answering.",
           [("", scheduler.busy_s)])
    metric("hermes_chunks_total", "counter", "Chunks encoded, all streams.", [("", scheduler.chunks)])
    metric("hermes_answers_total", "counter", "Questions and watches answered, all streams.", [("", scheduler.answers)])
    metric("hermes_jobs_queued", "gauge", "Jobs waiting for the model worker.", [("", scheduler.queued)])
    per_stream = (
        ("hermes_stream_frames_received_total", "counter", "Frames received.", lambda s: s.counters.frames_received),
        ("hermes_stream_frames_dropped_total", "counter", "Frames dropped because the model fell behind.",
         lambda s: s.counters.frames_dropped),
        ("hermes_stream_frames_encoded_total", "counter", "Frames in memory's history.", lambda s: s.counters.frames_encoded),
        ("hermes_stream_chunks_total", "counter", "Chunks encoded.", lambda s: s.counters.chunks),
        ("hermes_stream_questions_total", "counter", "Questions answered.", lambda s: s.counters.questions),
        ("hermes_stream_evicted_tokens_total", "counter", "Visual tokens level 1 let go.",
         lambda s: s.counters.evicted_tokens),
        ("hermes_stream_recall_records_total", "counter", "Records recalled for answers.",
         lambda s: s.counters.recall_records),
        ("hermes_stream_hbm_tokens", "gauge", "Tokens in level 1 (device memory).", lambda s: s.memory.get("hbm_tokens", 0)),
        ("hermes_stream_hbm_bytes", "gauge", "Bytes in level 1.", lambda s: s.memory.get("hbm_bytes", 0)),
        ("hermes_stream_dram_bytes", "gauge", "Bytes in level 2 (host memory).", lambda s: s.memory.get("dram_bytes", 0)),
        ("hermes_stream_disk_bytes", "gauge", "Bytes in level 3 (disk).", lambda s: s.memory.get("disk_bytes", 0)),
        ("hermes_stream_disk_records", "gauge", "Records in level 3.", lambda s: s.memory.get("disk_records", 0)),
    )
    for name, kind, help_text, get in per_stream:
        metric(name, kind, help_text, [(f'{{stream="{_label(s.id)}"}}', get(s)) for s in streams])
    lines.append("# HELP hermes_stream_question_latency_ms Question latency, request to answer (milliseconds).")
    lines.append("# TYPE hermes_stream_question_latency_ms summary")
    for s in streams:
        latencies = list(s.counters.latencies_ms)
        label = _label(s.id)
        for q in (0.5, 0.95):
            value = percentile(latencies, q)
            lines.append(f'hermes_stream_question_latency_ms{{stream="{label}",quantile="{q}"}} '
                         + ("NaN" if math.isnan(value) else f"{value:g}"))
        lines.append(f'hermes_stream_question_latency_ms_count{{stream="{label}"}} {len(latencies)}')
        lines.append(f'hermes_stream_question_latency_ms_sum{{stream="{label}"}} {sum(latencies):g}')
    return "\n".join(lines) + "\n"


def with_label(sample: str, name: str, value: str) -> str:
    """A sample line (`metric{labels} value` or `metric value`) with `name="value"` as its first label."""
    metric, _, rest = sample.partition(" ")
    label = f'{name}="{_label(value)}"'
    if "{" in metric:  # label values never hold a space here: stream names are [A-Za-z0-9_.-]
        head, _, labels = metric.partition("{")
        return f"{head}{{{label},{labels} {rest}"
    return f"{metric}{{{label}}} {rest}"


def merge(expositions: dict[str, str], label: str = "replica") -> str:
    """Several servers' expositions (`render`'s text) as one: every sample gets `label` = its server's key,
    each family keeps one HELP and one TYPE line, and its samples stay together, as the format asks.

    Args:
        expositions: server key -> its exposition text, in the order to list them.
        label: the label naming the server.

    Returns:
        The merged exposition text.
    """
    heads: dict[str, list[str]] = {}  # family -> its HELP and TYPE lines, in first-seen order
    samples: dict[str, list[str]] = {}
    for key, text in expositions.items():
        family = None
        for line in text.splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                family = line.split(" ", 3)[2]
                head = heads.setdefault(family, [])
                samples.setdefault(family, [])
                if not any(h.startswith(line[:7]) for h in head):
                    head.append(line)
            elif line and family is not None:  # a summary's _count and _sum lines belong to its family
                samples[family].append(with_label(line, label, key))
    lines = [line for family in heads for line in heads[family] + samples[family]]
    return "\n".join(lines) + "\n"
