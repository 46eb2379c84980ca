"""The prompt each benchmark's official evaluation sends, per question.

`build_prompt` returns a `Prompt`: an optional system text, the user text (placed after the
video by the model adapter), and an optional `answer_prefix` the official scripts write at the
start of the assistant turn (MVBench and MLVU start it with "Best option:("; a reply is then
the model's continuation). Template texts are reproduced as the official code has them,
including their spelling and spacing, because prompt wording moves accuracy; each carries the
file it comes from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hermes.errors import UsageError

from . import registry
from .records import KIND_COUNT, KIND_OPEN, KIND_PROACTIVE, KIND_YESNO, BenchmarkQuestion
from .records import letter_options as lettered


@dataclass(frozen=True)
class Prompt:
    """What to send for one question.

    Attributes:
        user: The user-turn text.
        system: System text ("" when the benchmark has none).
        answer_prefix: Text the assistant turn starts with ("" when none).
        query: The bare question, what memory retrieves with ("" : the user text).
    """

    user: str
    system: str = ""
    answer_prefix: str = ""
    query: str = ""


# --- OVO-Bench: JoeLeelyf/OVO-Bench constant.py (BR/REC/SSR/CRR_PROMPT_TEMPLATE), used by
# utils/OVOBench.py build_prompt; also lmms-eval tasks/ovobench/constant.py. Trailing spaces
# are the originals'.
OVO_MC = (
    "\nQuestion: {question}\nOptions:\n{options}\n\n"
    "Respond only with the letter corresponding to your chosen option (e.g., A, B, C). \n"
    "Do not include any additional text or explanation in your response.\n"
)
OVO_REC = (
    "\nYou're watching a video in which people may perform a certain type of action repetively. \n"
    "The person performing this kind of action are referred to as 'they' in the following statement.\n"
    "You're task is to count how many times have different people in the video perform this kind of action in total.\n"
    "One complete motion counts as one. \n"
    "Now, answer the following question: {question}\n"
    "Provide your answer as a single number (e.g., 0, 1, 2, 3\u2026) indicating the total count.\n"
    "Do not include any additional text or explanation in your response.\n"
)
OVO_SSR = (
    "\nYou're watching a tutorial video which contain a sequential of steps. \n"
    "The following is one step from the whole procedures: \n{question}\n"
    "Your task is to determine if the man or woman in the video is currently performing this step.\n"
    "Answer only with \u201cYes\u201d or \u201cNo\u201d.\n"
    "Do not include any additional text or explanation in your response.\n"
)
OVO_CRR = (
    "\nYou're responsible of answering questions based on the video content. \n"
    "The following question are relevant to the latest frames, i.e. the end of the video.\n{question}\n"
    "Decide whether existing visual content, especially latest frames, i.e. frames that near the end of the "
    "video, provide enough information for answering the question.\n"
    "Answer only with \u201cYes\u201d or \u201cNo\u201d.\n"
    "Do not include any additional text or explanation in your response.\n"
)

# --- StreamingBench: THUNLP-MT/StreamingBench src/benchmark/StreamingBench.py (PROMPT_TEMPLATE
# plus "\n\nThe best option is:"), StreamingBenchSQA.py, StreamingBenchProactive.py.
SB_MC = (
    "You are an advanced video question-answering AI assistant. You have been provided with some frames from "
    "the video and a multiple-choice question related to the video. Your task is to carefully analyze the video "
    "and provide the best answer to question, choosing from the four options provided. Respond with only the "
    "letter (A, B, C, or D) of the correct option.\n\nQuestion: {question}\n\nOptions:\n{options}"
    "\n\nThe best option is:"
)
SB_SQA = (
    "You are an advanced video question-answering AI assistant. You have been provided with a video and a "
    "multiple-choice question related to the video. Your task is to carefully analyze the video and the provided "
    "context to answer the question, choosing from the four options provided. Respond with only the letter "
    "(A, B, C, or D) of the correct option.\n\n{context}\n\n"
    "Here is the question. Answer it and don't confuse it with the previous conversation.\n"
    "Question: {question}\n\nOptions:\n{options}\n\nThe best option is:"
)
SB_SQA_CONTEXT = (
    "Here are the contextual information related to the video. Please answer the questions based on the "
    "contextual information: "
)
SB_SQA_TURN = (
    "At timestamp {stamp}, the following question and answer occurred: Question: {question}; "
    "Options: {options}; Answer: {answer}; "
)
SB_PROACTIVE = (
    "You are an advanced image question-answering AI assistant. You have been provided with images and a "
    "question related to the images. Your task is to carefully analyze the images and provide the answer to the "
    "question. You need to carefully confirm whether the images content meet the conditions of the question, and "
    "then output the correct content.\n\nQuestion: {question}\n\nThe answer is:\n"
)
SB_PROACTIVE_POLL = '{question} Is it the right time to output "{output}"? You can only answer yes or no.'

# --- MVBench: OpenGVLab/Ask-Anything video_chat2/mvbench.ipynb (system, qa_template,
# question_prompt "\nOnly give the best option.", answer_prompt "Best option:(").
MVBENCH_SYSTEM = (
    "Carefully watch the video and pay attention to the cause and sequence of events, the detail and movement "
    "of objects, and the action and pose of persons. Based on your observations, select the best option that "
    "accurately addresses the question.\n"
)
# --- MLVU: JUNJIE99/MLVU videochat2/choice_bench.py (same qa_template and answer prompt).
MLVU_SYSTEM = (
    "Carefully watch this video and pay attention to every detail. Based on your observations, select the best "
    "option that accurately addresses the question.\n"
)
BEST_OPTION_PREFIX = "Best option:("  # MVBench
MLVU_OPTION_PREFIX = "Best Option: ("  # MLVU choice_bench.py: capital O and a space

# --- Video-MME: MME-Benchmarks/Video-MME README evaluation prompt (frames only); the same
# text as lmms-eval tasks/videomme/utils.py with post_prompt "The best answer is:".
VIDEOMME = (
    "Select the best answer to the following multiple-choice question based on the video. Respond with only "
    "the letter (A, B, C, or D) of the correct option.\n{question}\n{options}\nThe best answer is:"
)
# --- LongVideoBench: lmms-eval tasks/longvideobench/utils.py longvideobench_doc_to_text with
# longvideobench_val_v.yaml post_prompt. EgoSchema: lmms-eval tasks/egoschema/utils.py
# egoschema_doc_to_text (options "A. ..." one per line, then this post prompt).
LETTER_DIRECTLY = "Answer with the option's letter from the given choices directly."


def build_prompt(
    benchmark: str, question: BenchmarkQuestion, previous: Sequence[BenchmarkQuestion] = (), stage: str = "answer"
) -> Prompt:
    """The official prompt for one question.

    Args:
        benchmark: Benchmark name (any spelling the registry accepts).
        question: The question.
        previous: Questions asked earlier on the same video; StreamingBench SQA puts them,
            with their reference answers, into the prompt as the official eval does.
        stage: "answer", or "poll" for the yes/no "is it time?" query of StreamingBench
            proactive output (which the official loop asks every second).

    Returns:
        The Prompt.

    Raises:
        UsageError: Unknown benchmark, or a stage the question does not have.
    """
    name = registry.family(benchmark)
    if stage not in ("answer", "poll") or (stage == "poll" and question.kind != KIND_PROACTIVE):
        raise UsageError(f"unknown prompt stage {stage!r} for a {question.kind} question; use 'answer'")
    return _BUILDERS[name](question, previous, stage)


def _ovo(q: BenchmarkQuestion, previous, stage) -> Prompt:
    """OVO-Bench: MC options as "A. x; B. y;" on one line; REC/SSR/CRR own templates."""
    templates = {KIND_COUNT: OVO_REC, KIND_YESNO: OVO_SSR if q.task == "SSR" else OVO_CRR}
    if q.kind in templates:
        return Prompt(templates[q.kind].format(question=q.question))
    return Prompt(OVO_MC.format(question=q.question, options="; ".join(lettered(q.options)) + ";"))


def _streamingbench_options(q: BenchmarkQuestion) -> list[str]:
    """Options as the official script shows them: as written when they start with "A.",
    otherwise (SQA) with "A. " ... added; only the first four either way, since the official
    template has four option slots (`PROMPT_TEMPLATE.format(question, *options)` drops the rest,
    which in the real files are wrapped option texts split into extra items)."""
    raw = [str(o) for o in q.raw.get("options", [])]
    return (raw if raw and raw[0].startswith("A.") else lettered(q.options))[:4]


def _streamingbench(q: BenchmarkQuestion, previous, stage) -> Prompt:
    """StreamingBench: real/omni, SQA (with earlier Q&A as context) and proactive."""
    if q.kind == KIND_PROACTIVE:
        if stage == "poll":
            return Prompt(SB_PROACTIVE.format(question=SB_PROACTIVE_POLL.format(question=q.question, output=q.answer)))
        return Prompt(SB_PROACTIVE.format(question=q.question))
    options = _streamingbench_options(q)
    if q.meta.get("subset") != "sqa":
        return Prompt(SB_MC.format(question=q.question, options="\n".join(options)))
    context = ""
    for p in (p for p in previous if p.meta.get("subset") == "sqa"):
        shown = _streamingbench_options(p)
        context = context or SB_SQA_CONTEXT
        context += SB_SQA_TURN.format(
            stamp=p.raw.get("time_stamp", ""), question=p.question, options=", ".join(shown), answer=p.gt_letter
        )
    return Prompt(SB_SQA.format(context=context, question=q.question, options="\n".join(options)))


def _rvs(q: BenchmarkQuestion, previous, stage) -> Prompt:
    """RVS: ReKV sends the open-ended question as it is (video_qa/rekv_stream_vqa.py)."""
    return Prompt(q.question)


def _best_option(system: str, prefix: str = BEST_OPTION_PREFIX):
    """MVBench / MLVU: "Question: ...\\nOptions:\\n(A) ..." and the "Best option:(" prefix."""

    def build(q: BenchmarkQuestion, previous, stage) -> Prompt:
        if q.kind == KIND_OPEN:
            return Prompt(q.question)  # MLVU generation tasks: the question alone
        body = f"Question: {q.question}\nOptions:\n" + "\n".join(lettered(q.options, "({letter}) {text}"))
        return Prompt(body + "\nOnly give the best option.", system=system, answer_prefix=prefix)

    return build


def _videomme(q: BenchmarkQuestion, previous, stage) -> Prompt:
    """Video-MME: the README prompt, options as "A. ..." lines."""
    return Prompt(VIDEOMME.format(question=q.question, options="\n".join(lettered(q.options))))


def _letter_directly(tail: str):
    """LongVideoBench (its post prompt ends with a newline) and EgoSchema (it does not):
    the question, "A. ..." lines, then the letter instruction."""

    def build(q: BenchmarkQuestion, previous, stage) -> Prompt:
        return Prompt(q.question + "\n" + "\n".join(lettered(q.options)) + "\n" + LETTER_DIRECTLY + tail)

    return build


def _lvbench(q: BenchmarkQuestion, previous, stage) -> Prompt:
    """LVBench's repository publishes no prompt: the question with its inline "(A) ..."
    options exactly as distributed, plus the letter instruction lmms-eval's LongVideoBench
    uses (not an official LVBench text; its polish_answer reads "(D)" or "D" alike)."""
    return Prompt(str(q.raw.get("question", q.question)) + "\n" + LETTER_DIRECTLY)


_BUILDERS = {
    "ovo-bench": _ovo,
    "streamingbench": _streamingbench,
    "rvs": _rvs,
    "mvbench": _best_option(MVBENCH_SYSTEM),
    "mlvu": _best_option(MLVU_SYSTEM, MLVU_OPTION_PREFIX),
    "videomme": _videomme,
    "longvideobench": _letter_directly("\n"),
    "egoschema": _letter_directly(""),
    "lvbench": _lvbench,
}
