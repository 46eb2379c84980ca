"""`bench device`, `bench gc` and `bench ingest` (once scripts/bench_device.py, bench_probe_memory.py,
bench_gc_pauses.py and bench_ingest_1080p.py): what each reports, and bad input as one line."""

from __future__ import annotations

import json

import pytest

from hermes.cli import main


pytestmark = pytest.mark.usefixtures("one_cpu_thread")  # tests/pipelines/conftest.py


def test_device_measures_each_section_and_writes_them(tmp_path, capsys):
    out = tmp_path / "device.json"
    assert main(["bench", "device", "--model", "tiny-llava-onevision", "--chunk-frames", "1", "--tokens", "40",
                 "--decode-tokens", "3", "--repeats", "1", "--compile-modes", "", "--output", str(out)]) == 0
    table = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["suite"] == "device" and {"preprocess", "decode", "probe"} <= set(result)
    # on a CPU "device" preprocessing runs the same kernels as the host's: the same pixels
    assert result["preprocess"]["max_diff_8bit_levels"] == 0.0
    eager = result["decode"]["modes"]["off"]
    assert eager["tokens_equal_eager"] is True and eager["ttft_ms"] > 0 and eager["tpot_ms"] > 0
    probe = result["probe"]
    assert probe["cached_tokens"] > 40 and probe["transient"] == "bound"  # the prefix, then 40 visual tokens
    assert probe["transient_over_kv"] == pytest.approx(probe["transient_mib"] / probe["kv_mib"])
    assert "device / host: host CPU" in table and "| off |" in table and "| transient_over_kv |" in table


@pytest.mark.parametrize("argv, message", [
    (["device", "--sections", "preprocess,gpu"], "--sections expects a comma-separated subset"),
    (["device", "--decode-tokens", "1"], "--decode-tokens expects at least 2"),
    (["device", "--tokens", "0"], "argument --tokens: expected a positive whole number"),
    (["device", "--output", "{dir}"], "--output expects a file, found a directory"),
    (["gc", "--frames", "20"], "--frames expects at least 40"),
    (["ingest", "--fps", "0"], "argument --fps: expected a positive number"),
    (["ingest", "--video", "{dir}/missing/v.mp4"], "does not exist (create it first)"),
])
def test_bad_input_is_one_line_before_anything_loads(argv, message, tmp_path, capsys):
    assert main(["bench", *[a.replace("{dir}", str(tmp_path)) for a in argv]]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.slow
def test_gc_runs_the_stream_with_the_heap_collected_then_frozen(capsys):
    assert main(["bench", "gc", "--frames", "41", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["heap"].split()[0] for r in rows] == ["collected", "frozen"]
    assert rows[0]["frozen_objects"] == 0 < rows[1]["frozen_objects"]
    assert all(len(r["passes"].split(" / ")) == 3 and r["wall_s"] > 0 for r in rows)


@pytest.mark.slow
def test_ingest_writes_the_1080p_file_once_and_reports_the_best_rate(tmp_path, capsys):
    video = tmp_path / "v.mp4"
    assert main(["bench", "ingest", "--seconds", "2", "--fps", "2", "--video", str(video), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    import cv2

    capture = cv2.VideoCapture(str(video))
    assert (capture.get(cv2.CAP_PROP_FRAME_WIDTH), capture.get(cv2.CAP_PROP_FRAME_HEIGHT)) == (1920, 1080)
    capture.release()
    assert row["frames"] == 4 and row["best_frames_per_s"] == max(row["runs"]) > 0
