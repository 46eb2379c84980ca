"""`/metrics` of a fleet: replicas' expositions merged into one, each sample labelled with its replica."""

from __future__ import annotations

from hermes.pipelines.serve.metrics import merge, with_label

ONE = """# HELP hermes_streams Streams open.
# TYPE hermes_streams gauge
hermes_streams 2
# HELP hermes_stream_chunks_total Chunks encoded.
# TYPE hermes_stream_chunks_total counter
hermes_stream_chunks_total{stream="door"} 3
hermes_stream_chunks_total{stream="hall"} 1
# HELP hermes_stream_question_latency_ms Question latency, request to answer (milliseconds).
# TYPE hermes_stream_question_latency_ms summary
hermes_stream_question_latency_ms{stream="door",quantile="0.5"} 12
hermes_stream_question_latency_ms_count{stream="door"} 1
"""
TWO = """# HELP hermes_streams Streams open.
# TYPE hermes_streams gauge
hermes_streams 1
# HELP hermes_stream_chunks_total Chunks encoded.
# TYPE hermes_stream_chunks_total counter
hermes_stream_chunks_total{stream="gate"} 5
# HELP hermes_stream_question_latency_ms Question latency, request to answer (milliseconds).
# TYPE hermes_stream_question_latency_ms summary
"""


def test_a_label_goes_first_with_or_without_labels():
    assert with_label('m{stream="a"} 3', "replica", "7@ab") == 'm{replica="7@ab",stream="a"} 3'
    assert with_label("m 3", "replica", "7@ab") == 'm{replica="7@ab"} 3'


def test_merged_families_keep_one_help_and_type_and_their_samples_together():
    lines = merge({"11@aa": ONE, "22@bb": TWO}).splitlines()
    assert lines == [
        "# HELP hermes_streams Streams open.",
        "# TYPE hermes_streams gauge",
        'hermes_streams{replica="11@aa"} 2',
        'hermes_streams{replica="22@bb"} 1',
        "# HELP hermes_stream_chunks_total Chunks encoded.",
        "# TYPE hermes_stream_chunks_total counter",
        'hermes_stream_chunks_total{replica="11@aa",stream="door"} 3',
        'hermes_stream_chunks_total{replica="11@aa",stream="hall"} 1',
        'hermes_stream_chunks_total{replica="22@bb",stream="gate"} 5',
        "# HELP hermes_stream_question_latency_ms Question latency, request to answer (milliseconds).",
        "# TYPE hermes_stream_question_latency_ms summary",
        'hermes_stream_question_latency_ms{replica="11@aa",stream="door",quantile="0.5"} 12',
        'hermes_stream_question_latency_ms_count{replica="11@aa",stream="door"} 1',
    ]


def test_no_replica_gives_an_empty_exposition():
    assert merge({}) == "\n"
