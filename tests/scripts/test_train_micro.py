"""`scripts/train_micro.py`: its forward is hermes's streaming layout, and a seeded run is reproducible.

A shortened run (a few steps per stage) exercises the whole script; the shipped weights come from the
full run documented in benchmarks/MICRO.md.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hermes.datasets import synthetic_bench as sb
from hermes.models import micro

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))  # train_micro imports its folder's micro_checkpoint and micro_examples
import micro_examples as mx
SHORT = ["--stage-steps", "3,3,3", "--val-per-kind", "2", "--eval-every", "1000", "--warmup", "2"]


def train_runs(*args_per_run: list[str]) -> list[subprocess.CompletedProcess]:
    """Run the script once per argument list, all at once (one thread each: the results must not
    depend on it, and CI's cores run them side by side)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    procs = [(args, subprocess.Popen([sys.executable, str(ROOT / "scripts" / "train_micro.py"), *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
             for args in args_per_run]
    runs = []
    try:
        for args, proc in procs:
            out, err = proc.communicate(timeout=600)
            runs.append(subprocess.CompletedProcess(args, proc.returncode, out, err))
    finally:  # a timeout (or any failure) stops every run, not only the one waited for
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return runs


@pytest.mark.slow
def test_same_seed_gives_the_same_weights_and_another_seed_does_not(tmp_path):
    seeds = {"a": 3, "b": 3, "c": 4}
    runs = dict(zip(seeds, train_runs(*(["--out", str(tmp_path / f"{name}.safetensors"), "--seed", str(seed), *SHORT]
                                        for name, seed in seeds.items()))))
    for run in runs.values():
        assert run.returncode == 0, run.stderr[-2000:]
        # the script refuses to train unless its batched forward equals StreamingSession's logits
        assert "forward matches StreamingSession" in run.stdout
    tensors = {name: load_file(tmp_path / f"{name}.safetensors") for name in runs}  # the header also holds timings
    assert tensors["a"].keys() == tensors["b"].keys() == tensors["c"].keys()
    assert all(torch.equal(tensors["a"][k], tensors["b"][k]) for k in tensors["a"])
    assert not all(torch.equal(tensors["a"][k], tensors["c"][k]) for k in tensors["a"])
    info = micro.read_training_info(tmp_path / "a.safetensors")
    assert info["seed"] == 3 and [s["steps"] for s in info["stages"]] == [3, 3, 3]
    assert "--seed 3" in info["command"]
    model, tokenizer = micro.load_micro(path=tmp_path / "a.safetensors")  # what it wrote loads as the micro model
    assert json.loads(model.config.to_json_string())["vision_config"]["image_size"] == micro.MICRO_IMAGE_SIZE_PX


def long_args(out: Path, seed: int, *extra: str) -> list[str]:
    return ["--out", str(out), "--seed", str(seed), "--recipe", "long", "--val-per-kind", "1", "--eval-every", "1000",
            "--warmup", "2", *extra]


@pytest.mark.slow
def test_long_recipe_is_reproducible_bit_for_bit(tmp_path):
    runs = train_runs(*(long_args(tmp_path / f"{name}.safetensors", 5, "--stage-steps", "1,1,1,2") for name in "ab"))
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    a, b = (load_file(tmp_path / f"{name}.safetensors") for name in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)
    info = micro.read_training_info(tmp_path / "a.safetensors")
    assert info["recipe"] == "long" and [s["stage"] for s in info["stages"]] == ["bootstrap", "broaden", "main", "long"]
    assert [s["steps"] for s in info["stages"]] == [1, 1, 1, 2]


def test_long_recipe_needs_its_fourth_stage_steps(tmp_path):
    (run,) = train_runs(long_args(tmp_path / "x.safetensors", 0, "--stage-steps", "1,1,1"))
    assert run.returncode == 2 and "--stage-steps needs 4 numbers" in run.stderr


def test_recall_memories_are_a_window_plus_older_records_in_time_order():
    import numpy as np

    rng = np.random.default_rng(0)
    for _ in range(50):
        k = int(rng.integers(4, 129))
        streamed = int(rng.integers(k + 4, 600))
        frames, keep = mx.choose_memory(rng, "recall", streamed, k)
        assert len(frames) <= k and frames[-1] == streamed - 1
        assert (np.diff(frames) > 0).all()  # spliced in time order, no frame twice
        assert keep.shape == (len(frames), 16) and keep[-1].all() and keep.any(axis=1).all()


def load_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_micro", ROOT / "scripts" / "train_micro.py")
    tm = importlib.util.module_from_spec(spec)
    sys.modules["train_micro"] = tm  # its dataclasses look their module up there
    spec.loader.exec_module(tm)
    return tm


def test_frame_labels_mark_each_appearance_once_and_rank_them_in_memory_order():
    import numpy as np

    app = lambda colour, shape, start, end: sb.Appearance(colour, shape, start, end, 0.5, 0.5, 0.0, 0.0, 0.25)
    timeline = sb.Timeline(20, [app("red", "circle", 1, 4), app("blue", "square", 5, 8), app("red", "triangle", 9, 12),
                                app("green", "circle", 13, 16)])
    frames = np.array([0, 2, 3, 6, 7, 10, 14])
    # frame 10 (the second red) is in memory but does not show its object: it must count as empty
    labels = mx.frame_labels(timeline, frames, label_frames=[0, 2, 3, 6, 7, 14])
    red, blue, green = (1 + sb.COLOURS.index(c) for c in ("red", "blue", "green"))
    circle, square = (1 + sb.SHAPES.index(s) for s in ("circle", "square"))
    assert labels[:, :4].tolist() == [[0, 0, 0, 0], [red, circle, 1, 1], [red, circle, 0, 1], [blue, square, 1, 2],
                                      [blue, square, 0, 2], [0, 0, 0, 0], [green, circle, 1, 3]]
    assert labels[:, 4].tolist() == [0, 1, 1, 1, 1, 0, 1]  # own: objects of the frame's colour so far
    tally = {c: labels[:, 5 + sb.COLOURS.index(c)].tolist() for c in ("red", "blue", "green", "white")}
    assert tally == {"red": [0, 1, 1, 1, 1, 1, 1], "blue": [0, 0, 0, 1, 1, 1, 1], "green": [0, 0, 0, 0, 0, 0, 1],
                     "white": [0] * 7}
    # shown, the second red counts from its first frame on, in every later frame's tally
    labels = mx.frame_labels(timeline, frames, label_frames=[0, 2, 3, 6, 7, 10, 14])
    assert labels[:, 5 + sb.COLOURS.index("red")].tolist() == [0, 1, 1, 1, 1, 2, 2]
    assert labels[5, :5].tolist() == [red, 1 + sb.SHAPES.index("triangle"), 1, 3, 2]
    # prev: the object memory shows before this frame's (the unshown red triangle is no object of memory)
    labels = mx.frame_labels(timeline, frames, label_frames=[0, 2, 3, 6, 7, 14])
    assert labels[:, -2:].tolist() == [[0, 0], [0, 0], [0, 0], [red, circle], [red, circle], [0, 0], [blue, square]]


# sha256 of 30 examples drawn at seed 4 (prompt, answer, layout, length, frames and tokens kept) per stage, written
# by the code before the memory kinds existed (commit b6f2863): the shipped weights' recipe must draw as it did
V1_DRAWS = {"broaden": "4040e3e26f30abdd534392785ac131039641013f617586b0d7886255215d5ac1",
            "main": "ab349ee7045dc53617040fe65eafef17e7dc70b658abdc76d0024a925a1e6aad"}


@pytest.mark.parametrize("stage", sorted(V1_DRAWS))
def test_the_shipped_recipe_draws_the_examples_it_drew_before_the_memory_kinds(stage):
    import hashlib

    import numpy as np
    rng, digest = np.random.default_rng(4), hashlib.sha256()
    for _ in range(30):
        ex = mx.make_example(rng, mx.STAGES[stage], 240)
        digest.update(f"{ex.prompt}|{ex.answer}|{ex.layout}|{ex.streamed}|{ex.frame_index.tolist()}|"
                      f"{ex.keep.tolist()}".encode())
    assert digest.hexdigest() == V1_DRAWS[stage]


def memory_objects(ex) -> list[tuple[str, int]]:
    """(name, frame index of its first frame) of every object the example's memory shows, from its labels."""
    return [(f"{sb.COLOURS[row[0] - 1]} {sb.SHAPES[row[1] - 1]}", int(i))
            for row, i in zip(ex.labels, ex.frame_index) if row[2] == 1]


@pytest.mark.parametrize("stage", ["hold32", "find12"])
@pytest.mark.parametrize("kind", ["episodic_before", "episodic_after", "ordering_pair", "episodic_recent"])
def test_hold_and_find_examples_name_objects_memory_shows_once_and_answer_from_memory(kind, stage):
    """Answers recomputed from the examples' per-frame labels (what memory shows), not the question maker."""
    import numpy as np
    rng = np.random.default_rng(3)
    answers = set()
    stage = mx.RECIPES["hold" if stage.startswith("hold") else "find"][stage]
    for _ in range(12):
        ex = mx.make_example(rng, stage, 600, kind=kind, layout=str(rng.choice(stage.layouts[1:4] or ["window"])))
        assert ex.keep.sum() <= 16 * stage.max_frames  # the stage's memory budget, in tokens
        objects = memory_objects(ex)
        names = [n for n, _ in objects]
        question = ex.prompt.split("?")[0]
        if kind == "episodic_recent":
            colour = question.split("Did a ")[1].split()[0]
            window = question.split("in the last ")[1]
            window_s = 60 if window == "minute" else int(window.split()[0]) * (60 if "minute" in window else 1)
            shown = [int(i) for row, i in zip(ex.labels, ex.frame_index) if row[0] == 1 + sb.COLOURS.index(colour)]
            truth = "yes" if shown and max(shown) >= ex.streamed - 0.5 - window_s else "no"
            answers.add(truth)
            assert ex.answer in (truth, "AB"["yes no".split().index(truth)]), (ex.prompt, ex.answer, shown)
            continue
        if kind == "ordering_pair":
            a, b = question.split("Which came first: the ")[1].split(" or the ")
            assert names.count(a) == names.count(b) == 1
            right = min((a, b), key=names.index)
            answers.add(right == a)
            assert ex.answer in (right, "AB"[(a, b).index(right)])
            continue
        neighbour_answer(ex)
    if kind in ("episodic_recent", "ordering_pair"):
        assert len(answers) == 2  # both answers are drawn


def neighbour_answer(ex) -> tuple[str, str]:
    """(X's name, the answer's colour) of a "just before / after X" example, from what its memory shows; asserts
    that X is shown once and that the example's answer (the colour or its letter) is that colour."""
    names = [n for n, _ in memory_objects(ex)]
    named = ex.prompt.split("?")[0].split(" the ")[-1]
    assert names.count(named) == 1, (named, names)  # unique in memory: the others were renamed
    colour = names[names.index(named) + (1 if ex.kind == "episodic_after" else -1)].split()[0]
    assert ex.answer in (colour, "ABCDEF"[sb.COLOURS.index(colour)])
    return named, colour


@pytest.mark.parametrize("stage", ["read12", "spread6", "spread24"])
def test_a_contrast_memory_is_asked_about_x_another_object_and_xs_other_neighbour(stage):
    """Each "just before / after X" memory of a read stage comes with siblings (same frames, same prompt style) whose
    answers, recomputed from memory, differ from the first's: an answer that ignores the question is wrong."""
    import numpy as np
    rng = np.random.default_rng(5)
    stage = mx.READ[stage]
    counts = []
    for draw in range(16):
        kind = ("episodic_before", "episodic_after")[draw % 2]
        examples = mx.make_examples(rng, stage, 1800, kind=kind)
        counts.append(len(examples))
        assert examples[0].kind == kind and all(e.frames is examples[0].frames for e in examples)
        assert len({("A." in e.prompt, "(A)" in e.prompt) for e in examples}) == 1  # one prompt style
        asked = [(e.kind, *neighbour_answer(e)) for e in examples]
        x = asked[0][1]
        if len(asked) == 3:
            assert asked[1][0] == kind and asked[1][1] != x  # another object, the same relation
            assert asked[2][0] != kind and asked[2][1] == x  # X, the other relation
        else:  # a sibling memory cannot answer (X's other neighbour not shown, Y = X) or answers alike is left out
            assert len(asked) == 2 and (asked[1][1] != x) == (asked[1][0] == kind)
        assert all(colour != asked[0][2] for _, _, colour in asked[1:])  # siblings answer otherwise
    assert counts.count(3) >= 2, counts
    others = [mx.make_examples(rng, stage, 1800, kind=k) for k in ("episodic_first", "ordering_pair", "realtime_shape")]
    assert [len(e) for e in others] == [1, 1, 1]  # only the neighbour kinds are asked in contrast


def test_contrast_hits_are_never_all_right_for_answers_that_ignore_the_question():
    """`contrast_hits` (the length report's "X in contrast"): a model answering from the memory alone (each memory's
    first question's answer, to all its questions) is right on no memory; one that reads every question, on all."""
    import numpy as np
    tm = load_script()
    rng = np.random.default_rng(2)
    memories = [mx.make_examples(rng, mx.READ["read12"], 600, kind=k) for k in ("episodic_before", "episodic_after") * 3]
    first_of = {id(asked[0].frames): asked[0] for asked in memories}

    class Answering(tm.Batcher):
        reads_question = True

        def forward(self, examples, *args, **kwargs):
            out = super().forward(examples)
            tok, logits, r = self.adapter.tokenizer, torch.zeros_like(out.logits), 0
            for ex in examples:
                said = ex if self.reads_question else first_of[id(ex.frames)]
                logits[r, tok.encode(said.answer, add_special_tokens=False)[0]] = 1.0
                r += len(tok.encode(ex.answer, add_special_tokens=False)) + 1
            out.logits = logits
            return out

    batcher = Answering(tm.micro_adapter(*micro.build_micro(seed=1, hidden_size=64, num_layers=2, head_dim=16)))
    assert tm.contrast_hits(batcher, memories) == [True] * len(memories)
    batcher.reads_question = False
    assert tm.first_token_hits(batcher, [asked[0] for asked in memories], 4) == [True] * len(memories)
    assert tm.contrast_hits(batcher, memories) == [False] * len(memories)


def test_a_stage_without_contrast_draws_one_example_as_before():
    import numpy as np
    one, many = np.random.default_rng(9), np.random.default_rng(9)
    for kind in ("episodic_before", "episodic_after", "ordering_pair"):
        a, [b] = mx.make_example(one, mx.FIND["find12"], 600, kind=kind), mx.make_examples(many, mx.FIND["find12"], 600, kind=kind)
        assert a.prompt == b.prompt and a.answer == b.answer and (a.frames == b.frames).all()


@pytest.mark.parametrize("kind", ["realtime_colour", "episodic_first", "episodic_before", "episodic_after",
                                  "ordering_pair", "episodic_recent", "ordering", "counting"])
def test_evidence_frames_are_those_the_answer_is_read_from(kind):
    """Checked against the examples' per-frame labels (their object, and the object before it in memory)."""
    import numpy as np
    rng = np.random.default_rng(4)
    stage = mx.RECIPES["find"]["find32"]
    for _ in range(6):
        ex = mx.make_example(rng, stage, 600, kind=kind, layout=str(rng.choice(["full", "window", "sparse"])))
        marked = ex.labels[ex.evidence]  # (E, 13) the marked frames' labels
        name = [f"{sb.COLOURS[r[0] - 1]} {sb.SHAPES[r[1] - 1]}" for r in marked]
        prev = [f"{sb.COLOURS[r[11] - 1]} {sb.SHAPES[r[12] - 1]}" for r in marked]
        question = ex.prompt.split("?")[0]
        onsets = [(f"{sb.COLOURS[r[0] - 1]} {sb.SHAPES[r[1] - 1]}", k) for k, r in enumerate(ex.labels) if r[2] == 1]
        if kind == "realtime_colour":
            assert ex.evidence.tolist() == [False] * (len(ex.evidence) - 1) + [True]
        elif kind == "counting":
            assert not ex.evidence.any()
        elif kind == "episodic_first":
            assert set(name) == {onsets[0][0]} and ex.evidence[onsets[0][1]]
        elif kind == "ordering":
            n = 2 if "second" in question else 3
            assert set(name) == {onsets[n - 1][0]}
        elif kind == "episodic_before":  # X's frames: they know the object before X, the answer
            assert set(name) == {question.split(" the ")[-1]}
        elif kind == "episodic_after":  # the next object's frames: they know X, before them
            assert set(prev) == {question.split(" the ")[-1]}
        elif kind == "ordering_pair":
            assert set(name) == set(question.split("Which came first: the ")[1].split(" or the "))
        else:  # episodic_recent: the newest object of the colour asked about
            colour = question.split("Did a ")[1].split()[0]
            newest = [n for n, _ in onsets if n.startswith(colour + " ")][-1]
            assert set(name) == {newest}
        # what the question looks for, read from its text, is what the marked frames show (their object, or the
        # one before it for "just after X")
        colour, shape, relation = ex.subject.tolist()
        if kind in ("episodic_before", "episodic_after"):
            column = 0 if kind == "episodic_before" else 11
            assert {(colour, shape)} == {tuple(r[column:column + 2]) for r in marked}
            assert relation == (1 if kind == "episodic_before" else 2)
        elif kind == "episodic_recent":
            assert {colour} == {r[0] for r in marked} and shape == relation == 0
        else:
            assert colour == shape == relation == 0
        if kind == "realtime_colour":  # the newest frame only, not its object's earlier frames
            continue
        # whole objects are marked: every frame in memory of a marked object, none of another
        objects = np.cumsum(ex.labels[:, 2]) * (ex.labels[:, 0] > 0)  # (K,) 1, 2, ... per object; 0 empty
        for obj in set(objects[objects > 0].tolist()):
            assert len(set(ex.evidence[objects == obj].tolist())) == 1
        assert not ex.evidence[objects == 0].any()


def test_head_attention_is_the_layers_own_attention():
    """What --attn-weight teaches is the attention the layer computes (eager attention returns it): the
    right query head, the KV head it shares, the rotary positions, the scaling."""
    tm = load_script()
    model, tokenizer = micro.build_micro(seed=1, hidden_size=64, num_layers=2, head_dim=16)
    tm.widen_init(model, 0.2)  # sharp attention, so that a wrong head or position shows
    batcher = tm.Batcher(tm.micro_adapter(model, tokenizer))
    lm = batcher.adapter.language_model
    lm.set_attn_implementation("eager")
    torch.manual_seed(0)
    embeds = torch.randn(2, 40, 64)
    pos = torch.cumsum(torch.randint(1, 300, (2, 40)), dim=1)  # gaps, as a memory's tokens have
    with torch.no_grad():
        out = lm(inputs_embeds=embeds, position_ids=pos, output_attentions=True, output_hidden_states=True)
        for layer in (0, 1):
            for head in range(4):  # 4 query heads over 2 KV heads
                queries = [(0, 39), (1, 25)]
                mine = batcher.head_attention(out.hidden_states[layer], pos, layer, head, queries)
                for (b, row), probs in zip(queries, mine):
                    torch.testing.assert_close(probs, out.attentions[layer][b, head, row, :row + 1], atol=1e-5, rtol=0)
    assert float(out.attentions[1].amax()) > 0.5  # not near-uniform: the comparison can tell heads apart


def test_shape_examples_ask_the_newest_frames_shape():
    import numpy as np
    rng = np.random.default_rng(5)
    asked = set()
    for _ in range(30):
        ex = mx.make_example(rng, mx.SHAPE, 240, kind="realtime_shape")
        shape = sb.SHAPES[ex.labels[-1, 1] - 1]  # the newest frame's object, from its label
        assert ex.answer in (shape, "ABC"[sb.SHAPES.index(shape)]), (ex.prompt, ex.answer)
        asked.add(shape)
    assert asked == set(sb.SHAPES)


def test_vision_probe_reads_colours_from_the_shipped_weights_and_barely_shapes():
    """Objects are named by colour and shape; the shipped weights' visual tokens carry the colour (a linear probe
    reads it nearly always) but a shape hardly more often than by chance (1/3): the probe must tell the two apart."""
    (run,) = train_runs(["--vision-probe", "600"])
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["weights"] == "shipped" and result["frames"] == 600
    assert result["colour"] >= 0.95
    assert 0.33 < result["shape"] < 0.8


def test_aux_targets_of_drawn_examples_agree_with_their_counting_answers():
    import numpy as np
    rng = np.random.default_rng(0)
    stage = mx.CURRICULUM["long32"]
    for _ in range(20):
        ex = mx.make_example(rng, stage, 120, kind="counting", layout="full")
        colour = ex.prompt.split("show a ")[1].split(" object")[0]
        onsets = ex.labels[:, 2] == 1
        of_colour = ex.labels[:, 0] == 1 + sb.COLOURS.index(colour)
        assert str(int((onsets & of_colour).sum())) == ex.answer
        # the newest frame's tally of that colour is the answer (counts here are 1-4)
        assert str(int(ex.labels[-1, 5 + sb.COLOURS.index(colour)])) == ex.answer
        assert str(int(ex.labels[of_colour, 4].max())) == ex.answer  # own: reached at its last appearance


def test_length_report_gives_full_memory_accuracy_per_kind_by_memory_length():
    (run,) = train_runs(["--length-report", "8-10,11-12", "--val-per-kind", "4"])
    assert run.returncode == 0, run.stderr[-2000:]
    table = [line for line in run.stdout.splitlines() if line.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    # every kind, the memory kinds of issue 37 among them, and whether "just before / after X" reads X
    assert header == ["frames in memory", *sb.TASK_OF, "X in contrast"]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")[1:]] for line in table[2:]}
    assert list(rows) == ["8-10", "11-12"]
    # the shipped weights read the newest frame of a short full memory (the draw is seeded: always the same)
    assert all(cells[0].startswith("100 [") for cells in rows.values()), rows


@pytest.mark.parametrize("args, message", [
    (["--length-report", "8-x"], "bad memory-length bin '8-x'"),
    (["--length-report", "20-10"], "bad memory-length bin '20-10'"),
    (["--seed", "1"], "--out is required"),
    (["--out", "x.safetensors", "--recipe", "focus", "--last-stage-frames", "3"], "--last-stage-frames must be at least 4"),
    (["--vision-probe", "5"], "--vision-probe needs at least 30 frames"),
    (["--out", "x.safetensors", "--session-seconds", "60"], "--session-seconds needs --checkpoint"),
    (["--out", "x.safetensors", "--init-weights", "w.safetensors", "--hidden-size", "128"],
     "--hidden-size, --layers and --head-dim shape a fresh model"),
    (["--out", "x.safetensors", "--init-weights", "w.safetensors", "--head-dim", "32"],
     "--hidden-size, --layers and --head-dim shape a fresh model"),
    (["--out", "x.safetensors", "--head-dim", "24"], "--head-dim must be even, at least 8 and divide --hidden-size 64"),
    (["--out", "x.safetensors", "--head-dim", "7"], "--head-dim must be even"),
    (["--out", "x.safetensors", "--attn-weight", "1", "--attn-layer", "4"], "--attn-layer must be 0-3 and --attn-head 0-3"),
    (["--out", "x.safetensors", "--subject-weight", "1"], "--subject-weight needs --aux-weight"),
    (["--out", "x.safetensors", "--attn-weight", "1", "--attn-head", "4"], "--attn-layer must be 0-3 and --attn-head 0-3"),
])
def test_length_report_and_training_refuse_bad_arguments_with_one_line(args, message):
    (run,) = train_runs(args)
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr


@pytest.mark.slow
def test_focus_recipe_trains_its_fourth_stage_on_the_memory_length_asked_for(tmp_path):
    out = tmp_path / "f.safetensors"
    (run,) = train_runs(["--out", str(out), "--recipe", "focus", "--stage-steps", "1,1,1,2", "--last-stage-frames", "12",
                         "--val-per-kind", "1", "--eval-every", "1000", "--warmup", "2", "--aux-weight", "0.5",
                         "--aux-count", "tally"])
    assert run.returncode == 0, run.stderr[-2000:]
    info = micro.read_training_info(out)
    assert info["recipe"] == "focus" and [s["stage"] for s in info["stages"]] == ["bootstrap", "broaden", "main", "focus"]
    assert [s["steps"] for s in info["stages"]] == [1, 1, 1, 2] and info["last_stage_frames"] == 12
    # the counting targets asked for are among the auxiliary heads trained (the log records each head's accuracy)
    assert info["aux_count"] == "tally"
    last = json.loads(out.with_suffix(".log.jsonl").read_text().splitlines()[-1])
    assert list(last["aux_acc_ema"]) == ["colour", "shape", "onset", "rank"] + [f"tally_{c}" for c in
                                                                               ("red", "green", "blue", "yellow",
                                                                                "purple", "white")]


@pytest.mark.slow
@pytest.mark.parametrize("recipe, stages, drawn, taught", [
    ("hold", ["shape", "hold32", "hold96", "hold256"], {"realtime_shape", "ordering", "counting"}, []),
    # no ordering nor counting; head 3 of layer 1 taught where to look
    ("find", ["find12", "find32", "find96", "find256"], {"realtime_shape"},
     ["--attn-weight", "1", "--attn-layer", "1", "--attn-head", "3", "--subject-weight", "0.5"]),
    # the find stages skipped (0 steps), then the memories asked in contrast
    ("read", ["find12", "find32", "find96", "find256", "read12", "spread6", "spread12", "spread24"], {"realtime_shape"},
     []),
])
def test_hold_and_find_recipes_run_their_memory_stages_and_validate_every_kind(tmp_path, recipe, stages, drawn,
                                                                                taught):
    out = tmp_path / "h.safetensors"
    steps = ",".join(["0"] * 3 + ["0" if recipe == "read" and s.startswith("find") else "1" for s in stages])
    (run,) = train_runs(["--out", str(out), "--recipe", recipe, "--init-weights", str(micro.WEIGHTS_FILE),
                         "--stage-steps", steps, "--last-stage-frames", "24", "--max-stream-s", "600",
                         "--val-per-kind", "1", "--eval-every", "1000", "--aux-weight", "0.5", "--aux-count", "prev",
                         *taught])
    assert run.returncode == 0, run.stderr[-2000:]
    info = micro.read_training_info(out)
    assert [s["stage"] for s in info["stages"]] == ["bootstrap", "broaden", "main", *stages]
    assert info["init_weights"] == str(micro.WEIGHTS_FILE) and info["last_stage_frames"] == 24
    # validation covers every kind the last stage draws: the memory kinds and the shape on screen among them
    assert set(info["final_val_first_token_acc"]) == {"realtime_colour", *drawn, *sb.MEMORY_KINDS, "all"}
    last = json.loads(out.with_suffix(".log.jsonl").read_text().splitlines()[-1])
    assert last["stage"] == stages[-1]
    ema = last["aux_acc_ema"]
    subject = ["subject_colour", "subject_shape", "subject_relation"]
    assert list(ema) == ["colour", "shape", "onset", "rank", "prev_colour", "prev_shape"] + (subject + ["evidence_mass"]) * bool(taught)
    assert ((info["attn_weight"], info["attn_layer"], info["attn_head"], info["subject_weight"])
            == ((1.0, 1, 3, 0.5) if taught else (0.0, 2, 0, 0.0)))
    if taught:  # a share of one head's attention, moved a twentieth of the way from 0 per step
        assert 0 < ema["evidence_mass"] <= 1 - 0.95 ** len(stages)


@pytest.mark.slow
def test_a_paused_and_resumed_larger_model_ends_with_the_weights_of_an_uninterrupted_run(tmp_path):
    args = [*SHORT, "--hidden-size", "32", "--layers", "3", "--head-dim", "8", "--aux-weight", "0.5", "--aux-count", "prev"]
    whole, resumed, checkpoint = tmp_path / "whole.safetensors", tmp_path / "resumed.safetensors", tmp_path / "ckpt"
    # --session-seconds 0 pauses at the first chance: the first pool boundary after a step (here each stage's start)
    pausing = [*args, "--out", str(resumed), "--checkpoint", str(checkpoint), "--session-seconds", "0"]
    uninterrupted, first = train_runs([*args, "--out", str(whole)], pausing)
    assert uninterrupted.returncode == 0 and first.returncode == 0, first.stderr[-2000:]
    assert "paused at step 3" in first.stdout and not resumed.exists()
    (second,) = train_runs(pausing)
    assert "resumed from" in second.stdout and "paused at step 6" in second.stdout
    # as a kill leaves it: a step past the checkpoint logged, and a line cut short
    with resumed.with_suffix(".log.jsonl").open("a") as log:
        log.write('{"step": 7, "stage": "main", "loss": 9.0}\n{"step": 8, "stage": "ma')
    (last,) = train_runs([*args, "--out", str(resumed), "--checkpoint", str(checkpoint)])
    assert last.returncode == 0 and "resumed from" in last.stdout, last.stderr[-2000:]
    a, b = load_file(whole), load_file(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the log has each step once, as the uninterrupted run wrote it (times aside)
    logs = [[{k: v for k, v in json.loads(line).items() if k != "elapsed_s"}
             for line in path.with_suffix(".log.jsonl").read_text().splitlines()] for path in (whole, resumed)]
    assert logs[0] == logs[1] and [r["step"] for r in logs[1]] == list(range(1, 10))
    model, _ = micro.load_micro(path=resumed)
    text = model.config.text_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (32, 3, 4, 2)
    assert model.model.language_model.layers[0].self_attn.head_dim == 8
    info = micro.read_training_info(resumed)
    assert [s["steps"] for s in info["stages"]] == [3, 3, 3]
    assert (info["hidden_size"], info["layers"], info["head_dim"]) == (32, 3, 8)


@pytest.mark.slow
def test_a_checkpoint_exports_its_weights_and_one_of_other_arguments_or_damaged_is_refused_and_kept(tmp_path):
    checkpoint = tmp_path / "ckpt"
    args = [*SHORT, "--out", str(tmp_path / "w.safetensors"), "--checkpoint", str(checkpoint)]
    short = tmp_path / "three-steps.safetensors"
    first, three = train_runs([*args, "--session-seconds", "0"],
                              [*SHORT, "--stage-steps", "3,0,0", "--out", str(short)])
    assert first.returncode == 0 and "paused at step 3" in first.stdout, first.stderr[-2000:]
    # the paused run's weights, exported, are those of a run that stops after the same three steps
    exported = tmp_path / "exported.safetensors"
    (export,) = train_runs(["--export-checkpoint", str(checkpoint), "--out", str(exported)])
    assert export.returncode == 0 and three.returncode == 0, export.stderr[-2000:]
    a, b = load_file(short), load_file(exported)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert micro.read_training_info(exported)["step"] == 3
    (other,) = train_runs([*args, "--lr", "0.001"])
    assert other.returncode == 2 and "--lr 0.003 (now 0.001)" in other.stderr and "Traceback" not in other.stderr
    # a record from before an argument existed matches it at its default, and only there
    record = json.loads((checkpoint / "checkpoint.json").read_text())
    del record["args"]["aux_layer"]
    (checkpoint / "checkpoint.json").write_text(json.dumps(record))
    (changed,) = train_runs([*args, "--aux-layer", "3"])
    assert changed.returncode == 2 and "--aux-layer 2 (now 3)" in changed.stderr
    (older,) = train_runs([*args, "--session-seconds", "0"])
    assert "resumed from" in older.stdout and "paused at step 6" in older.stdout, older.stderr[-2000:]
    record = (checkpoint / "checkpoint.json").read_text()
    (tensors,) = checkpoint.glob("step-*.safetensors")
    data = bytearray(tensors.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit pattern in the last tensor
    tensors.write_bytes(bytes(data))
    damaged, damaged_export, damaged_other = train_runs(
        args, ["--export-checkpoint", str(checkpoint), "--out", str(exported)], [*args, "--lr", "0.001"])
    for run in (damaged, damaged_export):
        assert run.returncode == 3 and "fail their checksum" in run.stderr and "Traceback" not in run.stderr
        assert len(run.stderr.strip().splitlines()) == 1
    # other arguments are found from the record alone, before the tensors are read
    assert damaged_other.returncode == 2 and "--lr 0.003 (now 0.001)" in damaged_other.stderr
    # nothing was repaired by deleting: the damaged tensors and the record are where they were
    assert tensors.read_bytes() == bytes(data) and (checkpoint / "checkpoint.json").read_text() == record
    assert not (tmp_path / "w.safetensors").exists()
