"""`scripts/eval_micro.py --quick`: every policy on the suite's sets, intervals, cost columns; and the marks.

The smoke run is the CI variant of the standard sweep (one short and one long stream, budget 128).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import micro_suite  # noqa: E402  (a script module beside eval_micro.py)

CELL = re.compile(r"^(\d+) \[(\d+), (\d+)\]( \([+-]\))?$")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    work = tmp_path_factory.mktemp("quick")
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "eval_micro.py"), "--quick", "--work", str(work)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return work


def rows(page: str, title: str) -> dict[str, list[str]]:
    """{policy label: cells} of the table under the bold or italic title starting with `title`."""
    block = page.split(title, 1)[1].split("\n\n", 2)[1]
    out = {}
    for line in block.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        out[cells[0]] = cells[1:]
    return out


@pytest.mark.slow
def test_quick_sweep_reports_every_policy_with_intervals_and_cost(quick):
    page = (quick / "QUICK.md").read_text()
    results = json.loads((quick / "QUICK.json").read_text())[0]
    for name in ("short", "long"):
        table = rows(page, f"**{name} (")
        assert list(table) == ["full"] + [f"{p} @128" for p in micro_suite.STANDARD_POLICIES if p != "full"]
        for label, cells in table.items():
            for text in cells[:5]:  # realtime, episodic, counting, ordering, all
                acc, lo, hi, _ = CELL.match(text).groups()
                assert int(lo) <= int(acc) <= int(hi)
        depth = rows(page, f"*{name}, budget 128: episodic by depth*")
        assert len(depth["hermes @128"]) == len(micro_suite.DEPTH_COLUMNS)
        # one stream: one question per depth, each either right or wrong
        assert all(c in ("0 [0, 0]", "100 [100, 100]") for c in depth["full"])
    # device memory: full keeps all 180 frames (2,880 visual tokens), a bounded policy 128 per layer
    assert results["long/full"]["kv_bytes"] > 10 * results["long/hermes/128"]["kv_bytes"] > 0
    assert results["short/full"]["kv_bytes"] > results["short/sliding/128"]["kv_bytes"]
    # every question of the set was answered and kept (22 per stream: 4 + 10 + 4 + 4 counting probes)
    assert len(results["short/hermes/128"]["outcomes"]) == 22
    assert all(r["ms_per_chunk"] > 0 for r in results.values())
    # the plot of accuracy against stream length, linked from the page (matplotlib is a dev dependency)
    assert "![accuracy against stream length](QUICK.png)" in page
    assert (quick / "QUICK.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_marks_only_differences_beyond_their_intervals():
    qids = [f"q{i}" for i in range(20)]
    right = [{q: True for q in qids}]
    wrong = [{q: False for q in qids}]
    half = [{q: i % 2 == 0 for i, q in enumerate(qids)}]
    assert micro_suite.interval(right, qids, wrong) == "100 [100, 100] (+)"
    assert micro_suite.interval(wrong, qids, right) == "0 [0, 0] (-)"
    assert micro_suite.interval(half, qids, half) == "50 " + micro_suite.interval(half, qids, None)[3:]
    assert "(" not in micro_suite.interval(half, qids, half)
    # too few questions to tell: never marked, however far apart
    assert micro_suite.interval(right, qids[:5], wrong) == "100 [100, 100]"


def test_policy_labels_carry_memory_settings():
    assert micro_suite.policy_of("hermes-4k:recent_keep=0.5:accumulation=sum:recall=true") == \
        ("hermes", "hermes-4k", {"recent_keep": 0.5, "accumulation": "sum", "recall": True})
    assert micro_suite.policy_of("dscache") == ("dscache", "dscache", {})


def test_summary_counts_real_time_and_backward_questions_by_depth():
    tags = {"long600": {"r1": ("realtime", ""), "r2": ("realtime", ""), "f": ("episodic", "first"),
                        "b10": ("episodic", "10"), "b50": ("episodic", "50"), "c": ("counting", "")}}
    run = {"outcomes": {"r1": True, "r2": False, "f": True, "b10": True, "b50": False, "c": True},
           "kv_bytes": 1024, "ms_per_chunk": 3.0, "ttft_ms": 1.5}
    table = micro_suite.summary_table([{"long600/sliding/128": run}], tags, ["sliding"], 128)
    row = table.splitlines()[-1]
    # realtime 1 of 2; first 1 of 1; middle (X at 30-70 %) 0 of 1; just before X (every depth) 1 of 2
    assert row.startswith("| sliding | 1/2, 50 [") and "| 1/1, 100 [100, 100] | 0/1, 0 [0, 0] | 1/2, 50 [" in row
    assert row.endswith("| 1,024 | 3 | 1.5 |")


def test_memory_kinds_are_tagged_by_kind_and_tabled_by_depth_apart_from_just_before_x(tmp_path):
    from hermes.datasets import synthetic_bench as sb

    root = micro_suite.suite_set(tmp_path, "long", 7, 1, memory_kinds=True)
    assert root.name == "long-1-memory"
    tags = micro_suite.question_tags(root)
    kinds = {e["kind"]: e for e in json.loads((root / sb.ANNOTATION_FILE).read_text()) if "depth" in e}
    after = kinds["episodic_after"]
    assert tags[f"ovo-{after['id']}"] == ("episodic", f"after {after['depth']}")
    assert tags[f"ovo-{kinds['ordering_pair']['id']}"][0] == "ordering"
    assert sorted(d for _, d in tags.values() if d.isdigit()) == sorted(str(p) for p in sb.DEPTHS_PCT)
    # one run: every "after" question right, everything else wrong
    run = {"outcomes": {q: d.startswith("after ") for q, (_, d) in tags.items()},
           "kv_bytes": 1024, "ms_per_chunk": 3.0, "ttft_ms": 1.5}
    page = micro_suite.tables([{"long/sliding/128": run}], {"long": tags}, ["sliding"], [128])
    memory = rows(page, "*long, budget 128: memory kinds by depth*")["sliding @128"]
    assert memory[:3] == ["100 [100, 100]"] * 3 and set(memory[3:]) <= {"0 [0, 0]", "-"}
    assert all(c == "0 [0, 0]" for c in rows(page, "*long, budget 128: episodic by depth*")["sliding @128"])
    summary = micro_suite.summary_table([{"long/sliding/128": run}], {"long": tags}, ["sliding"], 128)
    head, _, row = summary.splitlines()[-3:]
    cells = dict(zip([c.strip() for c in head.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert cells["just before X"].startswith("0/9,") and cells["after"].startswith("9/9,")


def test_spread_over_seeds():
    runs = [{"long/full": {"outcomes": {"a": True, "b": True, "c": False, "d": False}}},
            {"long/full": {"outcomes": {"a": True, "b": True, "c": True, "d": False}}}]
    assert micro_suite.spread_table(runs, ["0", "1"]).splitlines()[-1] == "| long/full | 50 | 75 | 25 |"


@pytest.mark.slow
def test_an_opt_in_suite_policy_runs_with_its_memory_options(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "eval_micro.py"), "--quick", "--work", str(tmp_path),
                          "--set-videos", "long=0", "--sweep-policies", "hermes,hermes+recall+gate=frames"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert list(rows((tmp_path / "QUICK.md").read_text(), "**short (")) == \
        ["hermes @128", "hermes+recall+gate=frames @128"]
    runs = next(tmp_path.glob("suite-runs-*"))
    gated = json.loads((runs / "short-hermes+recall+gate_frames-128" / "summary.json").read_text())["config"]["memory"]
    plain = json.loads((runs / "short-hermes-128" / "summary.json").read_text())["config"]["memory"]
    assert (gated["recall"], gated["recall_gate"]) == (True, "above_frames")
    assert (plain["recall"], plain["recall_gate"]) == (False, "off")
