"""`bench day`: a simulated day of one synthetic camera, its night questions, and the command.

The day is one seeded stream of the synthetic world (`hermes.datasets.synthetic_bench`) at 1 fps, drawn a
frame at a time; in its last hour ("night") it asks about the object on screen now, the day's first objects
("morning") and the object just before one seen `age` hours ago, whose name `name_subjects` makes unique in
the day. `hermes.pipelines.bench.day` streams it and measures; this module lives here, above the
pipelines, because the world does (the command is registered on `bench` by `hermes.cli`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from hermes.cli_args import add_config_options, check_output_path, config_from_args, positive_int
from hermes.errors import UsageError

if TYPE_CHECKING:  # imported where used: `hermes.cli` imports this module to build its parser
    from hermes.datasets.synthetic_bench import Timeline
    from hermes.pipelines.bench.day import DayQuestion
    from hermes.pipelines.frames import Frame

DEFAULT_AGES_H = (1.0, 6.0, 12.0, 20.0)
MAX_SUBJECTS = 12  # `name_subjects`: at most two "just before X" subjects per colour
NOW, MORNING = "now", "morning"
MAX_HOURS = 168  # a week; a 24-hour day took 15 minutes on 2 busy cores
# levels 2-3 scaled to the micro model (a record is ~100 KB at a 4K budget): DRAM fills in the first hour,
# the disk by the ninth, so both bounds act during a day
DAY_BOUNDS = {"dram_bytes": 16 << 20, "disk_bytes": 8 << 20}


def plan_day(hours: int, hour_s: int, ages_h: tuple[float, ...], per_age: int,
             seed: int = 0) -> tuple[Timeline, list[DayQuestion]]:
    """The day's stream and its night questions, by time.

    Args:
        hours: simulated hours; the questions fall in the last one.
        hour_s: seconds (frames) per simulated hour.
        ages_h: ages asked about with "just before X", in simulated hours (each at most `hours - 1`).
        per_age: questions per age, and of "now" and "morning".
        seed: the stream and question times draw from `default_rng([seed, 40])`.

    Returns:
        (timeline, questions sorted by time), multiple choice over `COLOURS`.

    Raises:
        ValueError: more than `MAX_SUBJECTS` "just before X" questions, or an age the day cannot hold.
    """
    import numpy as np

    from hermes.datasets.synthetic_bench import make_question, make_timeline, name_subjects
    from hermes.pipelines.bench.day import DayQuestion

    if len(ages_h) * per_age > MAX_SUBJECTS:
        raise ValueError(f"at most {MAX_SUBJECTS} questions about ages (two named objects per colour), found "
                         f"{len(ages_h)} ages x {per_age}")
    if any(not 0 < a <= hours - 1 for a in ages_h):
        raise ValueError(f"ages must be in (0, {hours - 1}] hours for a {hours}-hour day (questions are asked in "
                         f"its last hour), found {', '.join(f'{a:g}' for a in ages_h)}")
    rng = np.random.default_rng([seed, 40])
    duration_s = hours * hour_s
    timeline = make_timeline(rng, duration_s)
    night_s = duration_s - hour_s

    def night_time() -> float:
        return int(rng.integers(night_s, duration_s - 1)) + 0.5

    def asked(label: str, age_h: float, q) -> DayQuestion:
        return DayQuestion(label, age_h, q.t_s, q.question, tuple(q.options), q.gt)

    asks = [(night_time(), age) for age in ages_h for _ in range(per_age)]
    timeline, subjects = name_subjects(rng, timeline, [(t_s - age * hour_s, t_s) for t_s, age in asks])
    apps = timeline.appearances
    starts = [a.start_s for a in apps]
    out = []
    for (t_s, age), subject_s in zip(asks, subjects):
        i = starts.index(subject_s)
        # the two objects alone make the question (the name is unique all day): no scan of the day
        q = make_question(rng, timeline, [apps[i - 1].start_s, subject_s], "episodic_before", t_s,
                          subject_s=subject_s)
        out.append(asked(f"{age:g} h", (t_s - subject_s) / hour_s, q))
    for j in range(per_age):
        t_s = night_time()
        kind = ("episodic_first", "ordering")[j % 2]  # the first, or the second or third object of the day
        q = make_question(rng, timeline, [a.start_s for a in apps[:3]], kind, t_s)
        out.append(asked(MORNING, (t_s - apps[0].start_s) / hour_s, q))
    steady = [i for i in range(night_s, duration_s - 1)  # on screen for two frames: "now" is unambiguous
              if timeline.on_screen(i - 1) is not None and timeline.on_screen(i - 1) is timeline.on_screen(i)]
    for i in sorted(rng.choice(steady, size=min(per_age, len(steady)), replace=False).tolist()):
        out.append(asked(NOW, 0.0, make_question(rng, timeline, [i], "realtime_colour", i + 0.5)))
    return timeline, sorted(out, key=lambda q: q.t_s)


def day_frames(timeline: Timeline) -> Iterator[Frame]:
    """The stream's frames one at a time, frame `i` at `t = i` s (never all in memory)."""
    from hermes.datasets.synthetic_bench import render_frame
    from hermes.pipelines.frames import Frame

    for i in range(timeline.duration_s):
        yield Frame(float(i), render_frame(timeline, i), i)


def parse_ages(text: str | None, hours: int) -> tuple[float, ...]:
    """`--ages` ("1,6,12,20") in simulated hours; None: those of the defaults a `hours`-hour day can hold.

    Raises:
        UsageError: not comma-separated numbers.
    """
    if text is None:
        return tuple(a for a in DEFAULT_AGES_H if a <= hours - 1)
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"--ages expects comma-separated hours, found {text!r}") from None


def cmd_bench_day(args) -> int:
    """`bench day`: a simulated day of a synthetic camera; memory per level and accuracy by age per hour."""
    if args.hours > MAX_HOURS:
        raise UsageError(f"--hours expects at most {MAX_HOURS} (a week), found {args.hours}")
    ages = parse_ages(args.ages, args.hours)
    check_output_path(args.output, "--output")
    if args.memory_dir:
        from hermes.pipelines.run import check_memory_dir

        check_memory_dir(args.memory_dir)
    cfg = config_from_args(args, model="micro-llava-onevision", memory="hermes-4k", base={"memory": DAY_BOUNDS})
    chunk_frames = cfg.stream.chunk_frames
    if args.hour_s < 4 * chunk_frames:
        raise UsageError(f"--hour-s expects at least four chunks ({4 * chunk_frames} frames), found {args.hour_s}")
    try:
        timeline, questions = plan_day(args.hours, args.hour_s, ages, args.per_age, seed=args.seed)
    except ValueError as exc:
        raise UsageError(f"--ages, --per-age: {exc}") from None
    import tempfile

    import torch

    from hermes.models.loading import load_model
    from hermes.pipelines.bench.common import rows_table, run_info, write_json_output
    from hermes.pipelines.bench.day import BASELINE, HOUR_COLUMNS, accuracy_table, hour_cells, run_day

    memory = args.memory or "hermes-4k"
    label = f"{cfg.memory.policy}@{cfg.memory.budget}"  # the preset's name would hide a --budget
    torch.set_num_threads(args.threads)
    model = load_model(cfg.model)
    bounds = {"hbm_visual_tokens": cfg.memory.budget, "dram_bytes": cfg.memory.dram_bytes,
              "disk_bytes": cfg.memory.disk_bytes}
    record = {"suite": "day", **run_info(model), "memory": memory, "policy": label, "baseline": BASELINE,
              "budget": cfg.memory.budget, "bounds": bounds, "hours_requested": args.hours, "hour_s": args.hour_s,
              "fps": 1.0, "chunk_frames": chunk_frames, "ages_h": list(ages), "per_age": args.per_age,
              "seed": args.seed, "threads": args.threads, "questions": len(questions),
              "objects": len(timeline.appearances), "memory_dir": args.memory_dir,
              "command": "hermes-video " + " ".join(sys.argv[1:]), "hours": []}
    if not args.json:
        print(rows_table([], HOUR_COLUMNS), flush=True)
    start = time.perf_counter()

    def on_hour(row: dict) -> None:
        record["hours"].append(row)
        write_json_output(args.output, {**record, "partial": True})
        cells = hour_cells(row)
        if not args.json:
            print(rows_table([cells], HOUR_COLUMNS).splitlines()[-1], flush=True)
        if not args.quiet:
            print(f"bench day: hour {row['hour']}/{args.hours}, {row['frames']} frames, RSS {cells['rss_mib']} MiB, "
                  f"{label} {row['chunk_ms']} ms/chunk, {BASELINE} {cells['sliding_ms']} ms/chunk "
                  f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)

    if not args.quiet:
        print(f"bench day: {args.hours} x {args.hour_s} s of a synthetic camera at 1 fps through {model.name}, "
              f"{memory} (levels 2-3 bounded at {bounds['dram_bytes']} / {bounds['disk_bytes']} bytes) beside "
              f"{BASELINE} at {cfg.memory.budget} tokens; {len(questions)} questions in the last hour",
              file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="hermes-day-") as tmp:
        result = run_day(model, cfg.memory, label, day_frames(timeline), questions, hour_s=args.hour_s,
                         chunk_frames=chunk_frames, memory_dir=args.memory_dir or tmp, on_hour=on_hour)
    record.update(accuracy_by_age=result.accuracy_by_age(), wall_s=round(time.perf_counter() - start, 1))
    write_json_output(args.output, record)
    print(json.dumps(record) if args.json else "\n" + accuracy_table(record["accuracy_by_age"]))
    return 0


def add_day_suite(suite) -> None:
    """Register `bench day` through `hermes.pipelines.bench.cli`'s `suite` factory."""
    day = suite("day", "a simulated day of a synthetic camera (1 fps) through the micro model beside sliding: "
                       "resident memory, bytes per level and time per chunk per simulated hour, accuracy by the age "
                       "of what is asked at night (--hours 24: 15 minutes on 2 busy cores)", cmd_bench_day,
                output="also write the run as JSON (rewritten after every hour)")
    add_config_options(day, flags=("--budget", "--chunk-frames"), memory_default="hermes-4k",
                       flag_help={"--budget": "visual tokens per layer of both policies (default: the preset's)"})
    day.add_argument("--hours", type=positive_int, required=True, help=f"simulated hours streamed, at most {MAX_HOURS}")
    day.add_argument("--hour-s", type=positive_int, default=3600,
                     help="seconds (frames) per simulated hour: shorter ones for tests and quick looks "
                          "(default: %(default)s)")
    day.add_argument("--memory-dir", metavar="DIR",
                     help="the measured policy's memory directory, empty (default: a temporary one, removed)")
    day.add_argument("--ages", metavar="H,...",
                     help="ages asked about at night, in simulated hours, each at most --hours - 1 (default: those "
                          "of 1,6,12,20 that fit)")
    day.add_argument("--per-age", type=positive_int, default=3,
                     help="questions per age, and about now and the morning (default: %(default)s)")
    day.add_argument("--seed", type=int, default=0, help="the day's stream and questions (default: %(default)s)")
    day.add_argument("--threads", type=positive_int, default=1,
                     help="torch threads: on a shared 2-core CPU two took the micro model 2.5x the CPU time of one "
                          "(default: %(default)s)")
