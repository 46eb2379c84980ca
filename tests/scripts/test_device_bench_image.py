"""scripts/device_bench.sh on an image like the lent GPU machines': no faiss, decord or av importable.

The image is simulated by a `sitecustomize` on PYTHONPATH whose import hook refuses those packages, as
an interpreter without them would; the script's Python steps then run on the CPU at the smallest sizes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ABSENT = ("faiss", "decord", "av")
BLOCKER = f'''import sys


class _Absent:
    """Packages the device image does not have."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {ABSENT!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _Absent())
'''


def image_env(tmp_path: Path, **knobs: str) -> dict:
    """The environment of a CPU dry run whose Python lacks ABSENT, carrying no wheels."""
    site = tmp_path / "image"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    (tmp_path / "wheels").mkdir()
    out = tmp_path / "out"
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
                DEVICE="cpu", OUT=str(out), PYTHON=sys.executable, WHEELS=str(tmp_path / "wheels"),
                OMP_NUM_THREADS="1", **knobs)


def test_the_blocker_hides_the_packages_as_the_image_lacks_them(tmp_path):
    code = ("import importlib\nfor name in ('faiss', 'decord', 'av', 'numpy'):\n"
            "    try:\n        importlib.import_module(name); print(name, 'present')\n"
            "    except ModuleNotFoundError as exc:\n        print(name, 'absent', exc.name)\n")
    done = subprocess.run([sys.executable, "-c", code], env=image_env(tmp_path), capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.split("\n")[:4] == ["faiss absent faiss", "decord absent decord", "av absent av",
                                           "numpy present"]


@pytest.mark.slow
def test_device_script_without_faiss_skips_recall_and_keeps_every_other_row(tmp_path):
    # POLICIES left to the script's default, which includes hermes+recall
    env = image_env(tmp_path, LENGTHS="4", CHUNKS="4", BUDGET="32", DECODE_TOKENS="2", REPEATS="1")
    done = subprocess.run(["bash", str(REPO / "scripts" / "device_bench.sh")], env=env, capture_output=True,
                          text=True, timeout=600, check=False, cwd=REPO)
    out = Path(env["OUT"])
    log = (out / "log.txt").read_text()
    assert done.returncode == 0, log[-3000:]
    assert re.search(r"^faiss\s+missing", (out / "env.txt").read_text(), re.M)  # step 1 reports it
    assert "faiss is not importable and no faiss_cpu wheel" in log
    for name in ("cpu-small", "tiny-qwen2.5-vl"):
        run = json.loads((out / f"{name}.json").read_text())
        assert [r["policy"] for r in run["rows"]] == ["full", "sliding", "hermes"]
        assert [n for n in run["notes"] if n.startswith("hermes+recall: skipped")] == [
            "hermes+recall: skipped, it needs faiss (not installed here)"]
    assert log.count("hermes+recall: skipped, it needs faiss") >= 2  # said when it happens, once per model
    extras = (out / "extras.md").read_text()
    assert "| random cpu-small (512 wide) | 2" in extras  # bench device's probe row
    assert "device / host: host CPU" in extras  # bench device's preprocess section
    assert "| best_frames_per_s |" in extras  # bench ingest: the file read without decord


def fake_measure(missing: str):
    """A measure_stream stand-in: rows for every policy but hermes+recall, which needs `missing`."""
    from hermes.pipelines.bench.memory import StreamRow

    calls = []

    def measure(model, policy, lengths, *, chunk_frames, **kwargs):
        calls.append((policy.label, chunk_frames))
        if policy.label == "hermes+recall":
            raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)
        return [StreamRow(policy=policy.label, chunk_frames=chunk_frames, frames=n, budget=32, cache_tokens=32,
                          peak_kv_mb=1.0, peak_device_mb=None, ttft_ms=1.0, recall_ms=None, tpot_ms=None,
                          decode_tokens=2, encode_ms_per_chunk=1.0, maintain_ms_per_chunk=0.0, maintain_ratio=0.0,
                          ingest_fps=1.0)
                for n in lengths], None

    return measure, calls


def test_run_sweep_skips_a_policy_whose_optional_dependency_is_missing(monkeypatch, capsys):
    from hermes.config import MemoryConfig
    from hermes.pipelines.bench import memory as bench

    measure, calls = fake_measure("faiss")
    monkeypatch.setattr(bench, "measure_stream", measure)
    monkeypatch.setattr(bench, "_warm_up", lambda model, policy, *args: measure(model, policy, [4], chunk_frames=4))
    policies = bench.resolve_policies("full,hermes+recall,hermes", MemoryConfig(), 32)
    result = bench.run_sweep(object(), policies, [4, 8], [4, 2])
    assert [(r.policy, r.chunk_frames, r.frames) for r in result.rows] == [
        ("full", 4, 4), ("full", 4, 8), ("hermes", 4, 4), ("hermes", 4, 8),
        ("full", 2, 4), ("full", 2, 8), ("hermes", 2, 4), ("hermes", 2, 8)]
    assert result.notes == ["hermes+recall: skipped, it needs faiss (not installed here)"]
    assert [c for c in calls if c[0] == "hermes+recall"] == [("hermes+recall", 4)]  # tried once, in the warm-up
    assert "hermes+recall: skipped, it needs faiss" in capsys.readouterr().err


def test_run_sweep_does_not_hide_a_missing_module_of_our_own(monkeypatch):
    from hermes.config import MemoryConfig
    from hermes.pipelines.bench import memory as bench

    measure, _ = fake_measure("hermes.tiers.gone")
    monkeypatch.setattr(bench, "measure_stream", measure)
    with pytest.raises(ModuleNotFoundError, match="hermes.tiers.gone"):
        bench.run_sweep(object(), bench.resolve_policies("full,hermes+recall", MemoryConfig(), 32), [4], [4],
                        warmup=False)
