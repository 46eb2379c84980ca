"""MVBench (offline): 20 temporal-understanding tasks, one short clip per question.

Source format: OpenGVLab/Ask-Anything `video_chat2/mvbench.ipynb` (`data_list`) over the
Hugging Face dataset `OpenGVLab/MVBench`: `json/<task>.json` holds an array of
`{"video", "question", "candidates", "answer"}` where `answer` is the correct candidate's
*text*; five tasks also carry `start`/`end` (seconds) bounding the part of the video asked
about. Videos live in `video/<prefix>/<video>`, the prefix depending on the task
(`star/Charades_v1_480/`, `clevrer/video_validation/`, ...). Episodic Reasoning ships frames
instead of a video: `video/tvqa/frames_fps3_hq/<video>/00001.jpg ...`, at 3 frames per second.

Each question becomes its own VideoRecord (the same clip asked with different bounds is a
different input), with `start_s`/`end_s` set for bounded tasks. `tasks`: task names ("Action
Sequence") or file stems ("action_sequence"); None keeps every task whose json file is present.

Prompt: video_chat2/mvbench.ipynb (system, qa_template, question_prompt "\\nOnly give the best
option.", answer_prompt "Best option:("). Scoring: its check_ans.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hermes.errors import UsageError

from .. import common
from ..benchmark import OFFLINE, Benchmark, Prompt, best_option_prompt, option_index
from ..records import KIND_MC, BenchmarkQuestion, VideoRecord, normalize_options, resolve_gt_index

# name: (json file, folder under video/, data type, has start/end bounds) -- the official data_list.
TASKS = {
    "Action Sequence": ("action_sequence.json", "star/Charades_v1_480/", "video", True),
    "Action Prediction": ("action_prediction.json", "star/Charades_v1_480/", "video", True),
    "Action Antonym": ("action_antonym.json", "ssv2_video/", "video", False),
    "Fine-grained Action": ("fine_grained_action.json", "Moments_in_Time_Raw/videos/", "video", False),
    "Unexpected Action": ("unexpected_action.json", "FunQA_test/test/", "video", False),
    "Object Existence": ("object_existence.json", "clevrer/video_validation/", "video", False),
    "Object Interaction": ("object_interaction.json", "star/Charades_v1_480/", "video", True),
    "Object Shuffle": ("object_shuffle.json", "perception/videos/", "video", False),
    "Moving Direction": ("moving_direction.json", "clevrer/video_validation/", "video", False),
    "Action Localization": ("action_localization.json", "sta/sta_video/", "video", True),
    "Scene Transition": ("scene_transition.json", "scene_qa/video/", "video", False),
    "Action Count": ("action_count.json", "perception/videos/", "video", False),
    "Moving Count": ("moving_count.json", "clevrer/video_validation/", "video", False),
    "Moving Attribute": ("moving_attribute.json", "clevrer/video_validation/", "video", False),
    "State Change": ("state_change.json", "perception/videos/", "video", False),
    "Fine-grained Pose": ("fine_grained_pose.json", "nturgbd/", "video", False),
    "Character Order": ("character_order.json", "perception/videos/", "video", False),
    "Egocentric Navigation": ("egocentric_navigation.json", "vlnqa/", "video", False),
    "Episodic Reasoning": ("episodic_reasoning.json", "tvqa/frames_fps3_hq/", "frame", True),
    "Counterfactual Inference": ("counterfactual_inference.json", "clevrer/video_validation/", "video", False),
}
# Each task's annotation file, relative to the data root.
TASK_FILES = {name: (f"json/{spec[0]}",) for name, spec in TASKS.items()}
# File stems ("action_sequence") are accepted as task names too.
TASK_BY_KEY = {spec[0].removesuffix(".json"): name for name, spec in TASKS.items()}
# The official reader samples frame folders as 3 fps.
FRAME_FPS = 3.0

SYSTEM = (
    "Carefully watch the video and pay attention to the cause and sequence of events, the detail and movement "
    "of objects, and the action and pose of persons. Based on your observations, select the best option that "
    "accurately addresses the question.\n"
)
ANSWER_PREFIX = "Best option:("


def _read(root: Path, tasks, issues: common.DataIssues) -> list[VideoRecord]:
    finder = common.VideoFinder(root, ("video",))
    records: list[VideoRecord] = []
    for name, path in common.task_files(root, "mvbench", tasks, TASK_FILES, TASK_BY_KEY, default=TASKS):
        json_name, prefix, data_type, bounded = TASKS[name]
        for number, item in enumerate(common.read_json(path, expect=list)):
            where = f"{json_name} item {number}"
            record = issues.guard(where, lambda: _record(item, name, prefix, data_type, bounded, finder, where))
            if record is not None:
                records.append(record)
    if not records and not (root / "json").is_dir():
        raise UsageError(f"mvbench: expected {root / 'json'} with the task files, found nothing")
    return records


load = common.make_loader("mvbench", _read, select=False)  # `tasks` chooses the files


def _record(item: dict, task: str, prefix: str, data_type: str, bounded: bool, finder, where: str) -> VideoRecord:
    """One MVBench question and the clip (or frame folder) it is about."""
    video = str(common.require(item, "video", where))
    options = normalize_options(common.require(item, "candidates", where))
    answer = common.require(item, "answer", where)
    gt_index = resolve_gt_index(answer, options, prefer_text=True)
    if gt_index is None:
        raise UsageError(f"mvbench: answer {answer!r} is none of the candidates in {where}")
    start = float(common.require(item, "start", where)) if bounded else None
    end = float(common.require(item, "end", where)) if bounded else None
    key = TASKS[task][0].removesuffix(".json")
    number = where.rsplit(" ", 1)[-1]
    # Searching the task's own folder first keeps same-named clips of other tasks out.
    found = finder.find(video, extra_folders=(finder.root / "video" / prefix,))
    is_frames = data_type == "frame"
    return VideoRecord(
        video_id=f"{key}/{video}" + (f"@{start:g}-{end:g}" if bounded else ""),
        video_path=None if is_frames else found,
        duration=None,
        questions=[
            BenchmarkQuestion(question=str(common.require(item, "question", where)), options=options,
                              answer=options[gt_index], gt_index=gt_index, t_s=None, task=task, raw=item,
                              qid=f"mvbench-{key}-{number}", meta={"kind": KIND_MC, "groups": (key,)})
        ],
        frames_dir=found if is_frames and found is not None and found.is_dir() else None,
        frame_fps=FRAME_FPS if is_frames else None,
        start_s=start,
        end_s=end,
    )


class MvBench(Benchmark):
    """MVBench's prompt and check_ans."""

    def prompt(self, question: BenchmarkQuestion, previous: Sequence[BenchmarkQuestion], stage: str) -> Prompt:
        return best_option_prompt(question, SYSTEM, ANSWER_PREFIX)

    def parse(self, reply: str, options: Sequence[str], variant: str | None = None) -> int | None:
        """check_ans: "(" is prepended (the answer prompt ends with it) and the first word, stripped of
        "(", ")" and ".", is the letter, any case."""
        first = ("(" + reply.strip().split("\n")[0]).split(" ")[0]
        return option_index(first.replace(".", "").replace("(", "").replace(")", "").upper(), options)

    def correct(self, reply: str, question: BenchmarkQuestion, variant: str | None = None) -> bool | None:
        """check_ans: the first word of "(" + reply vs "(x)", either contained in the other. The official
        rule also credits an empty reply ("(" is in "(b)"); that one is not copied."""
        if question.gt_index is None:
            return None
        if not reply.strip():
            return False
        pred = ("(" + reply.strip().split("\n")[0]).lower().split(" ")[0]
        gt = f"({question.gt_letter.lower()})"
        return pred.replace(".", "") in gt or gt in pred


BENCHMARKS = {"mvbench": MvBench(load, OFFLINE)}
