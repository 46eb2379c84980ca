"""`run --memory-dir`, `--resume`, `memory inspect` and `memory verify` from the command line."""

import json

import pytest

from hermes.cli import main
from hermes.pipelines.synthetic import write_synthetic_video

TINY = ["--model", "tiny-llava-onevision", "--set", "model.max_new_tokens=2", "--quiet", "--memory", "hermes-4k",
        "--set", "memory.budget=200", "--set", "memory.compress_threshold=0", "--fps", "4", "--chunk-frames", "4"]


@pytest.fixture(scope="module")
def memory_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mem")
    video = write_synthetic_video(folder / "v.mp4", duration_s=5.0, fps=8.0, size=(32, 32))
    assert main(["run", str(video), *TINY, "--memory-dir", str(folder / "dir"), "--ask", "q", "--at", "2"]) == 0
    return folder / "dir", video


def test_inspect_lists_records_and_checkpoint(memory_dir, capsys):
    directory, _ = memory_dir
    capsys.readouterr()
    assert main(["memory", "inspect", str(directory), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fingerprint"]["model"] == "tiny-llava-onevision"
    assert len(report["records"]) >= 2  # 20 frames of 196 tokens against a 200-token budget
    assert [c["name"] for c in report["checkpoints"]] == ["session"]


def test_resume_continues_after_the_saved_frames(memory_dir, capsys):
    directory, video = memory_dir
    capsys.readouterr()
    assert main(["run", str(video), *TINY, "--memory-dir", str(directory), "--resume", "--ask", "again?", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["frames_seen"] == 20  # the whole 5 s at 4 fps: nothing encoded twice
    assert answer["memory"]["disk_records"] + answer["memory"]["dram_bytes"] > 0


def test_verify_passes_then_finds_flipped_bytes(memory_dir, capsys, tmp_path):
    import shutil

    directory, _ = memory_dir
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    assert main(["memory", "verify", str(copy)]) == 0
    assert "all checksums hold" in capsys.readouterr().out
    segment = sorted((copy / "segments").iterdir())[0]
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    assert main(["memory", "verify", str(copy)]) == 1
    out, err = capsys.readouterr()
    assert "record" in out and "problems found" in err


def test_a_folder_that_is_not_a_memory_directory(tmp_path, capsys):
    assert main(["memory", "verify", str(tmp_path)]) == 2
    assert "is not a memory directory" in capsys.readouterr().err


def test_bench_tiers_reports_recall_search_and_write_rows(capsys, tmp_path):
    out_file = tmp_path / "tiers.json"
    assert main(["bench", "tiers", "--records", "200", "--write-mib", "1", "--output", str(out_file)]) == 0
    rows = json.loads(out_file.read_text())
    assert [r["bench"] for r in rows] == ["recall", "search", "disk_write", "disk_write", "checkpoint"]
    recall = rows[0]
    assert recall["records"] == 200 and 0 < recall["median_ms"] <= recall["p95_ms"]
    assert all(0 < r["ratio"] for r in rows[2:4])
    assert 0 < rows[4]["snapshot_ms"] and 0 < rows[4]["wait_over_snapshot"]
    assert "| recall | 200 |" in capsys.readouterr().out


# ---- storage errors (exit 3) and repair from the command line ----------------------------------------


def test_a_file_where_the_memory_dirs_folder_belongs_exits_3(tmp_path, capsys, memory_dir):
    # --memory-dir naming a file is a usage error (exit 2, checked up front: tests/test_bad_input.py);
    # a file standing where one of its parent folders must be created is found only by the store: storage.
    _, video = memory_dir
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    capsys.readouterr()
    assert main(["run", str(video), *TINY, "--memory-dir", str(blocker / "stream"), "--ask", "q", "--at", "1"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "folder" in err and "internal error" not in err


@pytest.fixture
def small_mount(tmp_path):
    """A 1 MiB tmpfs (root only; skipped where mounting is not allowed)."""
    import subprocess

    point = tmp_path / "mnt"
    point.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_a_full_disk_exits_3_and_keeps_what_was_committed(small_mount, capsys, memory_dir):
    _, video = memory_dir
    directory = small_mount / "mem"
    capsys.readouterr()
    code = main(["run", str(video), *TINY, "--memory-dir", str(directory), "--ask", "q", "--at", "4.5"])
    err = capsys.readouterr().err.strip()
    assert code == 3 and len(err.splitlines()) == 1 and "disk is full" in err, err
    assert main(["memory", "verify", str(directory)]) == 0  # what was committed before is intact
    out = capsys.readouterr().out
    assert "records: disk_manifest" in out and "all checksums hold" in out


def test_a_read_only_memory_dir_exits_3(small_mount, capsys, memory_dir):
    import subprocess

    _, video = memory_dir
    (small_mount / "mem").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(small_mount)], check=True)
    capsys.readouterr()
    assert main(["run", str(video), *TINY, "--memory-dir", str(small_mount / "mem"), "--ask", "q", "--at", "1"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "read-only" in err, err


def test_a_cut_manifest_is_refused_by_run_and_repaired_by_memory_repair(memory_dir, tmp_path, capsys):
    import shutil

    directory, video = memory_dir
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    manifest = copy / "manifest.jsonl"
    lines = manifest.read_bytes().splitlines(keepends=True)
    manifest.write_bytes(b"".join(lines[:1]))  # the header only: every record line cut
    capsys.readouterr()
    assert main(["memory", "verify", str(copy)]) == 1
    capsys.readouterr()
    assert main(["run", str(video), *TINY, "--memory-dir", str(copy), "--resume", "--ask", "q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"memory repair {copy}" in err
    assert main(["memory", "repair", str(copy)]) == 0
    out = capsys.readouterr().out
    assert "rebuilt from the segments" in out and "all checksums hold" in out
    assert main(["run", str(video), *TINY, "--memory-dir", str(copy), "--resume", "--ask", "q", "--json"]) == 0
