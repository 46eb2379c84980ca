"""Train the micro LLaVA-OneVision on synthetic streams: CPU, one process, seeded and reproducible.

    python scripts/train_micro.py --out models/weights/micro-llava-ov.safetensors   # ~25 min, 1 thread
    python scripts/train_micro.py --out /tmp/short.safetensors --stage-steps 200,300,300  # a shortened run

An example (`micro_examples.py`) is one question about one `hermes.datasets.synthetic_bench` stream, laid out as
`StreamingSession.ask` feeds it (checked against its logits before training): prefix, the visual tokens
a simulated memory keeps at their streamed positions, the prompt as hermes sends it, and the answer,
which alone carries the loss. Training runs in stages from widened random weights (`widen_init`), tied
embeddings; with the same seed and thread count a rerun gives the same weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

from hermes.config import ModelConfig
from hermes.datasets import synthetic_bench as sb
from hermes.models.base import VLMAdapter
from hermes.models.loading import make_adapter
from hermes.models.micro import (MICRO_HEAD_DIM, MICRO_HIDDEN_SIZE, MICRO_NAME, MICRO_NUM_LAYERS, build_micro,
                                 load_micro, save_micro)
from hermes.pipelines.frames import Frame
from hermes.pipelines.session import OPTION_LETTERS, StreamingSession
from hermes.rope import RotarySpec
from micro_checkpoint import (CheckpointError, Progress, has_checkpoint, load_checkpoint,  # noqa: E402  this folder's
                              part, read_record, read_tensors, save_checkpoint)
from micro_examples import (AUX_CLASSES, AUX_SETS, MAIN, RECIPES, RELATION_KINDS, SUBJECT_CLASSES, Example,  # noqa: E402
                            Stage, jpeg_like, make_example, make_examples)

# arguments a resumed run may change: where it writes and checkpoints, and how long one sitting lasts
RESUME_FREE = ("out", "log", "checkpoint", "checkpoint_every", "session_seconds", "export_checkpoint")


def widen_init(model, std: float) -> None:
    """Re-draw the language model's matrices from N(0, std), seeded by the caller's torch seed: at
    transformers' 0.02, 16-dim heads of a 64-wide model have near-zero attention logits and learn
    which tokens to attend to far slower than a CPU budget allows (at 0.2 within a few hundred steps).
    """
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2 and "language_model" in name:
                param.normal_(0.0, std)


def micro_adapter(model, tokenizer) -> VLMAdapter:
    """The micro model as hermes runs it (CPU, float32): what `Batcher` and `StreamingSession` drive."""
    return make_adapter("llava_onevision", MICRO_NAME, model, tokenizer, ModelConfig(device="cpu", dtype="float32"))


@dataclass
class Forward:
    """What `Batcher.forward` returns; the optional parts only on request."""

    logits: torch.Tensor  # (n, V): one row per answer token, row 0 of each example its first
    targets: torch.Tensor  # (n,)
    states: torch.Tensor | None = None  # (m, hidden): the aux layer's state at the m kept visual tokens
    labels: torch.Tensor | None = None  # (m, 13): their frames' `Example.labels`
    evidence_mass: torch.Tensor | None = None  # (E,): the taught head's attention on evidence, per example with some
    subject_states: torch.Tensor | None = None  # (B, hidden): the aux layer's state at each answer-predicting token
    subject: torch.Tensor | None = None  # (B, 3): each example's `Example.subject`


class Batcher:
    """Turns examples into one padded forward of the language model, as hermes lays tokens out."""

    def __init__(self, adapter: VLMAdapter) -> None:
        self.adapter = adapter
        tok = adapter.tokenizer
        self.prefix_ids = tok.encode(adapter.prefix_text(), add_special_tokens=False)
        self.im_end = tok.convert_tokens_to_ids("<|im_end|>")
        self.per_frame = adapter.tokens_per_frame

    def forward(self, examples: list[Example], aux_layer: int | None = None,
                attn_head: tuple[int, int] | None = None) -> Forward:
        """Logits at every answer position and their targets; on request, what the auxiliary losses read.

        Args:
            aux_layer: also return the hidden state after this many decoder layers at every kept visual
                token, with its frame's `Example.labels` row, and at each token that predicts an answer's
                first token, with its example's `Example.subject`.
            attn_head: (layer, head): also return, per example with evidence frames, the share of attention
                that this head of this decoder layer (both from 0) gives them from the token that predicts
                the answer's first token.
        """
        model, tok = self.adapter.model, self.adapter.tokenizer
        embed = self.adapter.language_model.get_input_embeddings()
        pixels = self.adapter.preprocess([f for ex in examples for f in ex.frames])  # (N, 3, S, S)
        visual = model.model.get_video_features(pixels[None], return_dict=True).pooler_output[0, :-1]
        visual = visual.reshape(len(pixels), self.per_frame, -1)  # (N, 16, hidden)
        newline = model.model.image_newline[None]
        p = len(self.prefix_ids)
        rows, positions, answer_at, targets, visual_at, labels, evidence_at = [], [], [], [], [], [], []
        start = 0
        for ex in examples:
            q_ids = tok.encode(f"\n{ex.prompt}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
            a_ids = tok.encode(ex.answer, add_special_tokens=False) + [self.im_end]
            mine = visual[start:start + len(ex.frames)]
            start += len(ex.frames)
            keep = torch.from_numpy(ex.keep)
            text = embed(torch.tensor(q_ids + a_ids[:-1]))
            rows.append(torch.cat([embed(torch.tensor(self.prefix_ids)), mine[keep], newline, text]))
            slot = torch.from_numpy(ex.frame_index)[:, None] * self.per_frame + torch.arange(self.per_frame)
            tail = p + ex.streamed * self.per_frame + torch.arange(1 + len(text))  # newline, question, answer
            positions.append(torch.cat([torch.arange(p), p + slot[keep], tail]))
            first = rows[-1].shape[0] - len(a_ids)  # the last question token predicts the first answer token
            answer_at.append(torch.arange(first, first + len(a_ids)))
            targets.append(torch.tensor(a_ids))
            visual_at.append(torch.arange(p, p + int(keep.sum())))
            labels.append(torch.from_numpy(ex.labels)[:, None].expand(-1, self.per_frame, -1)[keep])
            evidence_at.append(p + torch.nonzero(torch.from_numpy(ex.evidence)[:, None].expand_as(keep)[keep])[:, 0])
        length = max(r.shape[0] for r in rows)
        embeds = torch.stack([F.pad(r, (0, 0, 0, length - r.shape[0])) for r in rows])
        pos = torch.stack([F.pad(q, (0, length - q.shape[0])) for q in positions])
        mask = torch.stack([(torch.arange(length) < r.shape[0]).long() for r in rows])
        out = self.adapter.language_model(inputs_embeds=embeds, position_ids=pos, attention_mask=mask,
                                          output_hidden_states=aux_layer is not None or attn_head is not None)
        hidden = out.last_hidden_state
        picked = torch.cat([hidden[b, idx] for b, idx in enumerate(answer_at)])
        result = Forward(model.lm_head(picked).float(), torch.cat(targets))
        if aux_layer is not None:
            states = out.hidden_states[aux_layer]  # (B, L, hidden); index 0 is the embeddings
            result.states = torch.cat([states[b, idx] for b, idx in enumerate(visual_at)])
            result.labels = torch.cat(labels)
            result.subject_states = torch.stack([states[b, int(idx[0])] for b, idx in enumerate(answer_at)])
            result.subject = torch.stack([torch.from_numpy(ex.subject) for ex in examples])
        if attn_head is not None:
            layer, head = attn_head
            queries = [(b, int(idx[0])) for b, idx in enumerate(answer_at) if len(evidence_at[b])]
            probs = self.head_attention(out.hidden_states[layer], pos, layer, head, queries)
            result.evidence_mass = torch.stack([row[evidence_at[b]].sum() for (b, _), row in zip(queries, probs)]
                                               or [torch.ones(())])
        return result

    def head_attention(self, hidden: torch.Tensor, pos: torch.Tensor, layer: int, head: int,
                       queries: list[tuple[int, int]]) -> list[torch.Tensor]:
        """Attention probabilities of `head` of decoder `layer` from each query (example, row) to the rows up
        to it, recomputed from the layer's input `hidden` (B, L, hidden) as the layer computes them (norm,
        projections, rotary positions `pos` (B, L)): under SDPA the layer does not return them.

        Returns:
            One (row + 1,) tensor per query, summing to 1.
        """
        lm = self.adapter.language_model
        block = lm.layers[layer]
        attn = block.self_attn
        d, group = attn.head_dim, lm.config.num_attention_heads // lm.config.num_key_value_heads
        kv = head // group  # the KV head this query head reads
        x = block.input_layernorm(hidden)
        q = F.linear(x, attn.q_proj.weight[head * d:(head + 1) * d], attn.q_proj.bias[head * d:(head + 1) * d])
        k = F.linear(x, attn.k_proj.weight[kv * d:(kv + 1) * d], attn.k_proj.bias[kv * d:(kv + 1) * d])
        cos, sin = lm.rotary_emb(x, pos)  # (B, L, d)
        q, k = apply_rotary_pos_emb(q[:, None], k[:, None], cos, sin)  # (B, 1, L, d)
        return [torch.softmax((k[b, 0, :row + 1] @ q[b, 0, row]) * attn.scaling, dim=0) for b, row in queries]


def check_against_session(batcher: Batcher, rng: np.random.Generator) -> float:
    """Largest first-token logit difference between this forward and `StreamingSession` (full memory);
    AssertionError beyond float noise (the training layout drifted from hermes's).
    """
    worst = 0.0
    for _ in range(3):
        ex = make_example(rng, MAIN, 24, layout="full")
        with torch.no_grad():
            logits = batcher.forward([ex]).logits
        frames = [Frame(float(i), f, int(i)) for i, f in zip(ex.frame_index, ex.frames)]
        session = StreamingSession(batcher.adapter, "full", frames, chunk_frames=4, max_new_tokens=2)
        ref = session.ask(ex.prompt, at=ex.streamed - 0.5).first_token_logits
        worst = max(worst, float((logits[0] - ref).abs().max()))
    assert worst < 1e-3, f"training forward differs from StreamingSession by {worst:.2e}"
    return worst


def first_answer_hits(tokenizer, batch: list[Example], logits: torch.Tensor, targets: torch.Tensor,
                      letters_only: bool = False) -> list[bool]:
    """Per example: is its first answer token the argmax of `Batcher.forward`'s logits? (`letters_only`:
    option-letter answers only.)
    """
    rows = np.cumsum([0] + [len(tokenizer.encode(ex.answer, add_special_tokens=False)) + 1 for ex in batch])[:-1]
    return [bool(logits[r].argmax() == targets[r]) for ex, r in zip(batch, rows)
            if not letters_only or ex.answer in OPTION_LETTERS]


def first_token_hits(batcher: Batcher, examples: list[Example], batch_size: int) -> list[bool]:
    """Per example, in order: is its first answer token the argmax?"""
    hits: list[bool] = []
    with torch.no_grad():
        for i in range(0, len(examples), batch_size):
            chunk = examples[i:i + batch_size]
            out = batcher.forward(chunk)
            hits += first_answer_hits(batcher.adapter.tokenizer, chunk, out.logits, out.targets)
    return hits


def first_token_accuracy(batcher: Batcher, examples: list[Example], batch_size: int) -> dict[str, float]:
    """Share of examples whose first answer token is the argmax, per kind and overall."""
    hits: dict[str, list[bool]] = {}
    for ex, hit in zip(examples, first_token_hits(batcher, examples, batch_size)):
        hits.setdefault(ex.kind, []).append(hit)
    acc = {k: round(float(np.mean(v)), 3) for k, v in sorted(hits.items())}
    acc["all"] = round(float(np.mean([h for v in hits.values() for h in v])), 3)
    return acc


def parse_bins(text: str) -> list[tuple[int, int]]:
    """``"8-20,21-40"`` -> [(8, 20), (21, 40)]: memory lengths in frames, both ends included; ValueError
    for a bin that is not ``lo-hi`` with 4 <= lo <= hi.
    """
    bins = []
    for piece in text.split(","):
        lo, sep, hi = piece.strip().partition("-")
        if not (sep and lo.isdigit() and hi.isdigit() and 4 <= int(lo) <= int(hi)):
            raise ValueError(f"bad memory-length bin {piece.strip()!r}: expected lo-hi frames with 4 <= lo <= hi")
        bins.append((int(lo), int(hi)))
    return bins


def contrast_hits(batcher: Batcher, memories: list[list[Example]]) -> list[bool]:
    """Per memory asked in contrast (`make_examples` of a `Stage.contrast` stage: questions whose answers differ):
    is every question's first answer token right? A model that does not read the question is never right on all.
    """
    hits = first_token_hits(batcher, [ex for asked in memories for ex in asked], MAIN.batch_size)
    ends = np.cumsum([len(asked) for asked in memories])
    return [all(hits[end - len(asked):end]) for asked, end in zip(memories, ends)]


def length_report(batcher: Batcher, rng: np.random.Generator, bins: list[tuple[int, int]], per_bin: int,
                  max_stream_s: int, contrast_rng: np.random.Generator) -> None:
    """Print a markdown table of first-answer-token accuracy per question kind with full memory, by memory
    length in frames (95 % bootstrap intervals), a row as soon as it is done: up to which length each
    kind of answer holds, apart from which frames a policy keeps. The last column, "X in contrast", is the
    share of memories where "just before / after X" is answered right about X and about its siblings
    (`contrast_hits`; drawn from `contrast_rng`): whether the answers read the question.
    """
    import micro_suite  # this folder's: its bootstrap is the testbed's interval

    def cell(hits: list[bool]) -> str:
        acc, low, high = micro_suite.bootstrap([dict(enumerate(hits))], list(range(len(hits))))
        return f"{acc:.0f} [{low:.0f}, {high:.0f}]"

    def full_memories(draw_rng: np.random.Generator, stage: Stage, lo: int,
                      kind: str | None = None) -> list[list[Example]]:
        """`per_bin` memories of at least `lo` frames (a full memory holds the whole stream: its length is the
        bin's), each with the examples asked about it."""
        memories: list[list[Example]] = []
        while len(memories) < per_bin:
            asked = make_examples(draw_rng, stage, max_stream_s, kind=kind, layout="full")
            if asked[0].streamed >= lo:
                memories.append(asked)
        return memories

    kinds = tuple(sb.TASK_OF)
    columns = [*kinds, "X in contrast"]
    print("| frames in memory | " + " | ".join(columns) + " |\n|---|" + "---|" * len(columns), flush=True)
    for lo, hi in bins:
        stage = Stage(kinds, (1.0, 0.0, 0.0, 0.0), MAIN.style_weights, hi, MAIN.batch_size, unique_subjects=True)
        cells = [cell(first_token_hits(batcher, [asked[0] for asked in full_memories(rng, stage, lo, kind)],
                                       MAIN.batch_size)) for kind in kinds]
        paired = dataclasses.replace(stage, kinds=RELATION_KINDS, contrast=True)
        cells.append(cell(contrast_hits(batcher, full_memories(contrast_rng, paired, lo))))
        print(f"| {lo}-{hi} | " + " | ".join(cells) + " |", flush=True)


def vision_probe(adapter: VLMAdapter, rng: np.random.Generator, frames: int) -> dict[str, float]:
    """What a frame's 16 visual tokens say of its object: held-out accuracy of a ridge-regression probe from
    the tokens (flattened) to the object's colour and to its shape, fitted on two thirds of `frames` frames
    that show an object (80 % JPEG-coded, as in training). A name is colour and shape: a probe far below
    1.0 on shapes means memory questions naming objects fail in the eyes, not in the memory.
    """
    pictures, targets = [], []
    while len(pictures) < frames:
        timeline = sb.random_timeline(rng, 120)
        for i in rng.choice(120, size=12, replace=False):
            app = timeline.on_screen(int(i))
            if app is not None:
                frame = sb.render_frame(timeline, int(i))
                pictures.append(jpeg_like(frame, rng) if rng.random() < 0.8 else frame)
                targets.append((sb.COLOURS.index(app.colour), sb.SHAPES.index(app.shape)))
    with torch.no_grad():
        pixels = adapter.preprocess(pictures[:frames])  # (N, 3, S, S)
        visual = torch.cat([adapter.model.model.get_video_features(pixels[k:k + 128][None], return_dict=True)
                            .pooler_output[0, :-1] for k in range(0, frames, 128)])  # (N * 16, hidden)
    x = visual.reshape(frames, -1).double()
    x = torch.cat([x, torch.ones(frames, 1, dtype=x.dtype)], dim=1)
    y = torch.tensor(targets[:frames])
    fit = 2 * frames // 3
    out = {}
    for column, (name, classes) in enumerate((("colour", len(sb.COLOURS)), ("shape", len(sb.SHAPES)))):
        onehot = F.one_hot(y[:fit, column], classes).double()
        weights = torch.linalg.solve(x[:fit].T @ x[:fit] + torch.eye(x.shape[1], dtype=x.dtype), x[:fit].T @ onehot)
        out[name] = round(float(((x[fit:] @ weights).argmax(1) == y[fit:, column]).double().mean()), 3)
    return out


def logged_step(line: str) -> float:
    """The step of a log line; infinity for a line that is not a whole record (cut short by a kill)."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf


def learning_rate(args, step: int, stage_first: int, stage_steps: int, last: bool) -> float:
    """The lr at `step`: a linear warm-up, constant, then a cosine to 10 % over the last stage."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    if last:
        done = (step - stage_first) / max(1, stage_steps)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))
    return args.lr


class TrainLoop:
    """The stages' steps, from wherever `progress` stands; checkpoints and pauses only between pools of
    drawn batches, so that a resumed run draws exactly what an uninterrupted one would."""

    def __init__(self, args, stages: dict[str, Stage], batcher: Batcher, rng: np.random.Generator, aux_head,
                 opt, progress: Progress, log, val: list[Example], val_full: list[Example], same_args: dict) -> None:
        """Args: `aux_head` the auxiliary head (None without --aux-weight); `log` the open JSON-lines log;
        `val`, `val_full` the validation examples; `same_args` what a checkpoint records as the run's arguments."""
        self.args, self.stages, self.batcher, self.rng, self.aux_head, self.opt = args, stages, batcher, rng, aux_head, opt
        self.progress, self.log, self.val, self.val_full, self.same_args = progress, log, val, val_full, same_args
        self.params = list(opt.param_groups[0]["params"])  # what the gradient norm is clipped over
        self.aux_layer = args.aux_layer if aux_head is not None else None
        self.attn_head = (args.attn_layer, args.attn_head) if args.attn_weight > 0 else None
        self.aux_names = AUX_SETS[args.aux_count]
        self.aux_columns = [list(AUX_CLASSES).index(name) for name in self.aux_names]
        self.aux_sizes = [AUX_CLASSES[name] for name in self.aux_names]
        # the aux head's rows after the per-token targets' predict the question's subject (--subject-weight)
        self.subject_sizes = list(SUBJECT_CLASSES.values()) if args.subject_weight > 0 else []
        self.checkpoint = Path(args.checkpoint) if args.checkpoint else None
        self.sitting_started = time.perf_counter()
        self.trained_before = progress.elapsed_s  # training time of earlier sittings
        self.since_checkpoint = 0  # steps since this sitting's last checkpoint (or its start)

    def elapsed_s(self) -> float:
        return self.trained_before + time.perf_counter() - self.sitting_started

    def save(self) -> None:
        self.log.flush()  # first: the log must hold every step the checkpoint holds
        self.progress.elapsed_s = round(self.elapsed_s(), 3)
        save_checkpoint(self.checkpoint, self.same_args, self.progress, self.rng, self.batcher.adapter.model,
                        self.aux_head, self.opt)

    def run(self) -> bool:
        """Train every stage not yet done; returns False when `--session-seconds` paused the run (after a
        checkpoint), True when all stages are done."""
        pr = self.progress
        done = {s["stage"] for s in pr.stage_log}
        for name, stage in self.stages.items():
            if name in done:
                continue
            if pr.stage != name:  # a fresh stage (not one resumed halfway)
                pr.stage, pr.stage_first, pr.loss_ema, pr.letter_acc_ema = name, pr.step, None, 0.0
            if not self.run_stage(name, stage):
                return False
            pr.step = pr.stage_first + pr.stage_steps[name]
            pr.stage_log.append({"stage": name, "steps": pr.stage_steps[name], "elapsed_s": round(self.elapsed_s(), 1)})
            pr.stage = None
            print(json.dumps(pr.stage_log[-1]), flush=True)
        pr.elapsed_s = round(self.elapsed_s(), 3)
        return True

    def run_stage(self, name: str, stage: Stage) -> bool:
        """The steps of one stage from `progress.step`; False when paused."""
        args, pr = self.args, self.progress
        last = name == list(self.stages)[-1]
        pool: list[list[Example]] = []
        while pr.step < pr.stage_first + pr.stage_steps[name]:
            if not pool and self.checkpoint is not None and self.since_checkpoint:
                pause = (args.session_seconds is not None
                         and time.perf_counter() - self.sitting_started > args.session_seconds)
                if pause or self.since_checkpoint >= args.checkpoint_every:
                    self.save()
                    self.since_checkpoint = 0
                    if pause:
                        return False
            if args.max_seconds is not None and self.elapsed_s() > args.max_seconds:
                pr.stage_steps[name] = pr.step - pr.stage_first  # the cap: what was done is what is recorded
                break
            if not pool:  # draw a few batches and group them by length: less padding
                drawn: list[Example] = []
                while len(drawn) < 4 * stage.batch_size:  # a contrast stage's memories come with their siblings
                    drawn += make_examples(self.rng, stage, args.max_stream_s)
                drawn.sort(key=lambda ex: int(ex.keep.sum()) + len(ex.prompt))
                pool = [drawn[i:i + stage.batch_size] for i in range(0, len(drawn), stage.batch_size)]
                pool = [pool[i] for i in self.rng.permutation(len(pool))]
            lr = learning_rate(args, pr.step, pr.stage_first, pr.stage_steps[name], last)
            for group in self.opt.param_groups:
                group["lr"] = lr
            self.log.write(json.dumps(self.train_step(pool.pop(), name, lr)) + "\n")
            self.since_checkpoint += 1
        return True

    def train_step(self, batch: list[Example], name: str, lr: float) -> dict:
        """One optimizer step on `batch`; returns its log record (with validation every --eval-every)."""
        args, pr, batcher = self.args, self.progress, self.batcher
        model, tokenizer = batcher.adapter.model, batcher.adapter.tokenizer
        out = batcher.forward(batch, self.aux_layer, self.attn_head)
        loss = answer_loss = F.cross_entropy(out.logits, out.targets)
        if self.aux_layer is not None:
            labels = out.labels[:, self.aux_columns]
            token_rows = sum(self.aux_sizes)
            heads = self.aux_head(out.states)[:, :token_rows].split(self.aux_sizes, dim=-1)
            aux = sum(F.cross_entropy(h, labels[:, j]) for j, h in enumerate(heads)) / len(heads)
            loss = loss + args.aux_weight * aux
            if self.subject_sizes:
                asked = self.aux_head(out.subject_states)[:, token_rows:].split(self.subject_sizes, dim=-1)
                subject = sum(F.cross_entropy(h, out.subject[:, j]) for j, h in enumerate(asked)) / len(asked)
                loss = loss + args.subject_weight * subject
                for j, (field, h) in enumerate(zip(SUBJECT_CLASSES, asked)):
                    hit = float((h.argmax(-1) == out.subject[:, j]).float().mean())
                    key = f"subject_{field}"
                    pr.aux_acc_ema[key] = 0.95 * pr.aux_acc_ema.get(key, 0.0) + 0.05 * hit
            for j, (aux_name, h) in enumerate(zip(self.aux_names, heads)):
                hit = float((h.argmax(-1) == labels[:, j]).float().mean())
                pr.aux_acc_ema[aux_name] = 0.95 * pr.aux_acc_ema[aux_name] + 0.05 * hit
        if self.attn_head is not None:  # -log of the taught head's attention on the evidence
            loss = loss - args.attn_weight * torch.log(out.evidence_mass + 1e-6).mean()
            mass = float(out.evidence_mass.detach().mean())
            pr.aux_acc_ema["evidence_mass"] = 0.95 * pr.aux_acc_ema.get("evidence_mass", 0.0) + 0.05 * mass
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        pr.step += 1
        pr.loss_ema = answer_loss.item() if pr.loss_ema is None else 0.98 * pr.loss_ema + 0.02 * answer_loss.item()
        letters = first_answer_hits(tokenizer, batch, out.logits, out.targets, letters_only=True)
        pr.letter_acc_ema = 0.95 * pr.letter_acc_ema + 0.05 * (float(np.mean(letters)) if letters else pr.letter_acc_ema)
        record = {"step": pr.step, "stage": name, "loss": round(answer_loss.item(), 4),
                  "loss_ema": round(pr.loss_ema, 4), "letter_acc_ema": round(pr.letter_acc_ema, 3), "lr": round(lr, 6),
                  "elapsed_s": round(self.elapsed_s(), 1)}
        if self.aux_layer is not None or self.attn_head is not None:
            record["aux_acc_ema"] = {k: round(v, 3) for k, v in pr.aux_acc_ema.items()}
        if pr.step % args.eval_every == 0:
            model.eval()
            record["val_first_token_acc"] = first_token_accuracy(batcher, self.val, MAIN.batch_size)
            record["val_full_first_token_acc"] = first_token_accuracy(batcher, self.val_full, MAIN.batch_size)
            model.train()
            pr.curve.append({k: record[k] for k in ("step", "stage", "loss_ema", "letter_acc_ema", "elapsed_s")}
                            | {"val_acc": record["val_first_token_acc"], "val_full_acc": record["val_full_first_token_acc"]})
            print(json.dumps(record), flush=True)
        return record


def starting_model(init_weights: str | None, seed: int, hidden_size: int, layers: int, head_dim: int):
    """(model, tokenizer) a run starts from: the `init_weights` file, or a fresh model of that shape (which
    training then re-draws with `widen_init`)."""
    if init_weights:
        return load_micro(path=init_weights)
    return build_micro(seed=seed, hidden_size=hidden_size, num_layers=layers, head_dim=head_dim)


def export_checkpoint(directory: Path, out: str) -> int:
    """Write the model of checkpoint `directory` as a micro weights file `out`; returns the exit code (0, or
    3 for an unreadable or damaged checkpoint)."""
    try:
        record = read_record(directory)
        tensors = read_tensors(directory, record)
    except CheckpointError as exc:
        print(f"train_micro.py: error: {exc}", file=sys.stderr)
        return exc.exit_code
    run = record["args"]
    # a record written before --head-dim existed ran at its default
    model, tokenizer = starting_model(run["init_weights"], run["seed"], run["hidden_size"], run["layers"],
                                      run.get("head_dim", MICRO_HEAD_DIM))
    model.load_state_dict(part(tensors, "model."), strict=True)
    progress = record["progress"]
    training = {"checkpoint": str(directory), "step": progress["step"], "stage": progress["stage"],
                "stages": progress["stage_log"], "curve": progress["curve"], "wall_s": progress["elapsed_s"],
                "seed": run["seed"], "recipe": run["recipe"], "hidden_size": model.config.text_config.hidden_size,
                "layers": model.config.text_config.num_hidden_layers,
                "head_dim": RotarySpec.from_text_config(model.config.text_config).head_dim}
    digest = save_micro(model.eval(), tokenizer, out, training)
    print(f"wrote {out}: step {progress['step']} of {directory} (stage {progress['stage']}), sha256 {digest}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="weights file to write (.safetensors); required unless --length-report")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--recipe", choices=RECIPES, default="v1",
                   help="v1: the shipped weights' three stages; long: a fourth stage of memories up to 128 frames "
                        "from every policy's selections (give its steps as a fourth --stage-steps number); "
                        "curriculum: four such stages on 16, 32, 64, 128 frames; focus: a fourth stage "
                        "drawing ordering and counting three times as often, on memories up to 64 frames; hold: "
                        "three stages on memories up to 32, 96, 256 frames with the memory kinds (issue 37); find: four "
                        "stages of the memory kinds and the shape on screen only, on memories up to 12, 32, 96, 256 "
                        "frames")
    p.add_argument("--stage-steps", default="500,1400,2000",
                   help="steps of the bootstrap, broaden and main stages (see STAGES), then of the recipe's "
                        "further stages (long; long16 ... long128; focus; shape, hold32, hold96, hold256; "
                        "find12 ... find256)")
    p.add_argument("--init-weights", help="start from this weights file instead of a fresh model (e.g. to run "
                                          "only the long stage: --recipe long --stage-steps 0,0,0,N)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="stop the last stage once this much wall time has passed (a pilot's hard cap); the run "
                        "then records its steps done, and is not reproducible bit for bit")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="resumable run: write the whole training state into DIR every --checkpoint-every steps, and "
                        "resume from it when DIR already holds one (the same arguments; bit for bit the same weights "
                        "as an uninterrupted run). Put DIR outside the checkout: it holds weights and optimizer state")
    p.add_argument("--checkpoint-every", type=int, default=200, help="steps between checkpoints (rounded up to the "
                                                                     "next pool of 4 batches)")
    p.add_argument("--session-seconds", type=float, default=None,
                   help="with --checkpoint: after this much wall time in this sitting, checkpoint and stop (exit 0, "
                        "no --out yet); the same command resumes")
    p.add_argument("--export-checkpoint", metavar="DIR",
                   help="train nothing: write the weights of checkpoint DIR to --out (a run midway, for "
                        "--length-report, --vision-probe or eval_micro.py --weights)")
    p.add_argument("--hidden-size", type=int, default=MICRO_HIDDEN_SIZE,
                   help="language model width of a fresh model (the shipped model: 64)")
    p.add_argument("--layers", type=int, default=MICRO_NUM_LAYERS, help="decoder layers of a fresh model")
    p.add_argument("--head-dim", type=int, default=MICRO_HEAD_DIM,
                   help="dims per attention head of a fresh model (--hidden-size / this many heads, half as many "
                        "KV heads; the shipped model: 16)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--init-std", type=float, default=0.2, help="std of the language model's initial matrices")
    p.add_argument("--warmup", type=int, default=100, help="linear warm-up steps; the lr then stays, and decays "
                                                           "to 10%% along a cosine over the last stage")
    p.add_argument("--max-stream-s", type=int, default=240, help="longest stream the memory layouts stand in for")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--val-per-kind", type=int, default=32, help="validation examples per question kind")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads; results are reproducible for a given count (1 is robust on a shared CPU)")
    p.add_argument("--log", help="JSON lines of loss and validation accuracy (default: OUT with .log.jsonl)")
    p.add_argument("--aux-weight", type=float, default=0.0,
                   help="weight of the auxiliary per-visual-token loss (colour, shape, onset, rank; see --aux-count) "
                        "from a linear head on --aux-layer's hidden state; the head is not saved (0: off)")
    p.add_argument("--aux-layer", type=int, default=2, help="decoder layers before the auxiliary head reads")
    p.add_argument("--aux-count", choices=AUX_SETS, default="none",
                   help="with --aux-weight, also a counting target: own (how many objects of the frame's colour "
                        "so far) or tally (that count for every colour, at every frame); or prev (the colour and "
                        "shape of the object before the frame's)")
    p.add_argument("--subject-weight", type=float, default=0.0,
                   help="with --aux-weight, weight of a loss that teaches the token that predicts the answer to carry, "
                        "at --aux-layer, what the question looks for: the colour and shape of the object it names and "
                        "whether X's own frames or the next object's hold the answer (see subject_labels; 0: off)")
    p.add_argument("--attn-weight", type=float, default=0.0,
                   help="weight of a loss that teaches --attn-head of --attn-layer to attend, from the token that "
                        "predicts the answer, to the frames the answer is read from (X for 'just before X', the "
                        "object after it for 'just after X', ...; see evidence_frames): -log of the attention "
                        "they get (0: off)")
    p.add_argument("--attn-layer", type=int, default=2,
                   help="the decoder layer (from 0) whose head --attn-weight teaches: 2 reads the state that "
                        "--aux-layer 2 teaches")
    p.add_argument("--attn-head", type=int, default=0, help="the query head (from 0) --attn-weight teaches")
    p.add_argument("--last-stage-frames", type=int, default=None,
                   help="most frames in memory in the last stage's examples (default: the recipe's own)")
    p.add_argument("--length-report", metavar="BINS",
                   help="train nothing: print first-answer-token accuracy per kind with full memory by memory "
                        "length (frames), e.g. 8-20,21-40,41-80,81-128,129-180, of --init-weights (default: "
                        "the shipped weights), --val-per-kind examples per kind and bin")
    p.add_argument("--vision-probe", type=int, metavar="FRAMES",
                   help="train nothing: print how well a linear probe reads each frame's colour and shape from its "
                        "visual tokens (held-out accuracy, FRAMES frames) for --init-weights (default: the shipped)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.vision_probe is not None:
        if args.vision_probe < 30:
            p.error(f"--vision-probe needs at least 30 frames, found {args.vision_probe}")
        adapter = micro_adapter(*load_micro(path=args.init_weights))
        accuracy = vision_probe(adapter, np.random.default_rng([args.seed, 3]), args.vision_probe)
        print(json.dumps({"weights": args.init_weights or "shipped", "frames": args.vision_probe, **accuracy}))
        return 0
    if args.length_report is None and not args.out:
        p.error("--out is required (the weights file to write), unless --length-report or --vision-probe")
    if args.export_checkpoint:
        return export_checkpoint(Path(args.export_checkpoint), args.out)
    if args.length_report is not None:
        try:
            bins = parse_bins(args.length_report)
        except ValueError as exc:
            p.error(str(exc))
        adapter = micro_adapter(*load_micro(path=args.init_weights))
        print(f"weights: {args.init_weights or 'shipped'}; {args.val_per_kind} examples per kind and bin, seed "
              f"{args.seed}; full memory: every frame of the stream", flush=True)
        length_report(Batcher(adapter), np.random.default_rng([args.seed, 2]), bins, args.val_per_kind,
                      args.max_stream_s, np.random.default_rng([args.seed, 3]))
        return 0

    if args.session_seconds is not None and not args.checkpoint:
        p.error("--session-seconds needs --checkpoint (where the paused run is kept)")
    if args.subject_weight > 0 and args.aux_weight <= 0:
        p.error("--subject-weight needs --aux-weight (its head reads the state --aux-layer names)")
    if args.checkpoint_every < 1 or args.hidden_size < 16 or args.hidden_size % 16 or args.layers < 1:
        p.error("--checkpoint-every and --layers must be at least 1, --hidden-size a multiple of 16")
    if args.head_dim < 8 or args.head_dim % 2 or args.hidden_size % args.head_dim:
        p.error(f"--head-dim must be even, at least 8 and divide --hidden-size {args.hidden_size}, "
                f"found {args.head_dim}")
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    stages = dict(RECIPES[args.recipe])
    if args.last_stage_frames is not None:
        if args.last_stage_frames < 4:
            p.error(f"--last-stage-frames must be at least 4, found {args.last_stage_frames}")
        last = list(stages)[-1]
        stages[last] = dataclasses.replace(stages[last], max_frames=args.last_stage_frames)
    steps = [int(n) for n in args.stage_steps.split(",")]
    if len(steps) != len(stages):
        p.error(f"--stage-steps needs {len(stages)} numbers for --recipe {args.recipe} ({', '.join(stages)})")
    if args.init_weights and (args.hidden_size, args.layers, args.head_dim) != (MICRO_HIDDEN_SIZE, MICRO_NUM_LAYERS,
                                                                                MICRO_HEAD_DIM):
        p.error("--hidden-size, --layers and --head-dim shape a fresh model; --init-weights brings its own")
    model, tokenizer = starting_model(args.init_weights, args.seed, args.hidden_size, args.layers, args.head_dim)
    if not args.init_weights:
        widen_init(model, args.init_std)
    layers = model.config.text_config.num_hidden_layers
    if not 1 <= args.aux_layer <= layers:
        p.error(f"--aux-layer must be 1-{layers} (the micro decoder has {layers} layers)")
    heads = model.config.text_config.num_attention_heads
    if args.attn_weight > 0 and not (0 <= args.attn_layer < layers and 0 <= args.attn_head < heads):
        p.error(f"--attn-layer must be 0-{layers - 1} and --attn-head 0-{heads - 1} (the micro decoder has "
                f"{layers} layers of {heads} heads)")
    # One matrix for reading and writing words: what the model learns to say ("red") is then what it
    # looks for among the options. Saved as two equal tensors, so the untied architecture loads it.
    model.lm_head.weight = model.model.language_model.embed_tokens.weight
    batcher = Batcher(micro_adapter(model, tokenizer))
    print(f"forward matches StreamingSession within {check_against_session(batcher, rng):.1e}", flush=True)
    val_rng = np.random.default_rng([args.seed, 1])  # a fixed validation set, apart from the training draw
    val_stage = list(stages.values())[-1]  # v1: MAIN; long: LONG's memories
    val_kinds = tuple(dict.fromkeys(val_stage.kinds))
    val = [make_example(val_rng, val_stage, args.max_stream_s, kind=k) for k in val_kinds for _ in range(args.val_per_kind)]
    # and every kind with all frames in memory, as long as the last stage's memories (`full` on long streams)
    val_full = [make_example(val_rng, val_stage, args.max_stream_s, kind=k, layout="full")
                for k in val_kinds for _ in range(args.val_per_kind)]
    # the auxiliary head: one linear map to every target's classes, trained with the model, never saved
    aux_names = AUX_SETS[args.aux_count]
    subject_rows = sum(SUBJECT_CLASSES.values()) if args.subject_weight > 0 else 0
    aux_head = (torch.nn.Linear(model.config.text_config.hidden_size,
                                sum(AUX_CLASSES[n] for n in aux_names) + subject_rows)
                if args.aux_weight > 0 else None)
    model.train()
    params = list(model.parameters()) + (list(aux_head.parameters()) if aux_head is not None else [])
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    progress = Progress(stage_steps=dict(zip(stages, steps)), aux_acc_ema=dict.fromkeys(aux_names, 0.0))
    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    same_args = {k: v for k, v in vars(args).items() if k not in RESUME_FREE}
    if checkpoint is not None and has_checkpoint(checkpoint):
        try:
            progress = load_checkpoint(checkpoint, same_args, vars(p.parse_args([])), rng, model, aux_head, opt)
        except CheckpointError as exc:
            print(f"train_micro.py: error: {exc}", file=sys.stderr)
            return exc.exit_code
        print(f"resumed from {checkpoint} at step {progress.step} ({progress.elapsed_s:.0f} s trained)", flush=True)
    log_path = Path(args.log or args.out.rsplit(".", 1)[0] + ".log.jsonl")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # a resumed run redoes the steps after its checkpoint: their lines go (and a line a kill cut short)
    kept = [line for line in (log_path.read_text().splitlines() if progress.step and log_path.exists() else [])
            if logged_step(line) <= progress.step]
    log_path.write_text("".join(line + "\n" for line in kept))
    with open(log_path, "a") as log:
        loop = TrainLoop(args, stages, batcher, rng, aux_head, opt, progress, log, val, val_full, same_args)
        if not loop.run():
            print(f"paused at step {progress.step} after {args.session_seconds:.0f} s: run the same command again to "
                  f"resume from {checkpoint}", flush=True)
            return 0
    model.eval()
    final_acc = first_token_accuracy(batcher, val, MAIN.batch_size)
    final_full_acc = first_token_accuracy(batcher, val_full, MAIN.batch_size)
    training = {"command": "python scripts/train_micro.py " + " ".join(sys.argv[1:] if argv is None else argv),
                "seed": args.seed, "stages": progress.stage_log, "recipe": args.recipe, "init_weights": args.init_weights,
                "lr": args.lr, "init_std": args.init_std, "hidden_size": model.config.text_config.hidden_size,
                "layers": layers, "head_dim": RotarySpec.from_text_config(model.config.text_config).head_dim,
                "max_stream_s": args.max_stream_s, "threads": args.threads,
                "torch": torch.__version__, "wall_s": round(progress.elapsed_s, 1), "curve": progress.curve,
                "final_val_first_token_acc": final_acc, "final_val_full_first_token_acc": final_full_acc,
                "aux_weight": args.aux_weight, "aux_layer": args.aux_layer, "aux_count": args.aux_count,
                "attn_weight": args.attn_weight, "attn_layer": args.attn_layer, "attn_head": args.attn_head,
                "subject_weight": args.subject_weight,
                "last_stage_frames": list(stages.values())[-1].max_frames}
    digest = save_micro(model, tokenizer, args.out, training)
    print(f"wrote {args.out} sha256 {digest} in {training['wall_s']:.0f} s", flush=True)
    return 0

if __name__ == "__main__":
    sys.exit(main())
