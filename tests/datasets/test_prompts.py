"""Official prompts, checked against texts written out by hand from the official sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes.datasets.benchmarks import (
    egoschema,
    longvideobench,
    lvbench,
    mvbench,
    ovo_bench,
    rvs,
    streamingbench,
    videomme,
)
from hermes.datasets.benchmark import Prompt
from hermes.datasets.registry import build_prompt
from hermes.errors import UsageError

FIXTURES = Path(__file__).parent / "fixtures"


def first(module, name, **kwargs):
    return module.load(FIXTURES / name, **kwargs)[0].questions


def test_ovo_multiple_choice_and_probes():
    rec, _, acr, _ = first(ovo_bench, "ovo_bench")
    assert build_prompt("ovo-bench", acr) == Prompt(
        "\nQuestion: What is he doing with that tool?\nOptions:\n"
        "A. He is repairing a bicycle.; B. She is using a jack to lift a car.; "
        "C. He is tightening bolts on a wheel.; D. He is inflating a tire.;\n\n"
        "Respond only with the letter corresponding to your chosen option (e.g., A, B, C). \n"
        "Do not include any additional text or explanation in your response.\n"
    )
    assert "Now, answer the following question: How many times did they breaking something?\n" in build_prompt(
        "ovo-bench", rec
    ).user
    ssr, _, crr, _ = ovo_bench.load(FIXTURES / "ovo_bench")[2].questions
    assert "procedures: \nput on the hair extensions\nYour task" in build_prompt("ovo-bench", ssr).user
    assert "end of the video.\nThe woman walks towards the black car" in build_prompt("ovo-bench", crr).user


def test_streamingbench_real_keeps_official_option_text():
    records = streamingbench.load(FIXTURES / "streamingbench")
    omni = records[1].questions[0]
    user = build_prompt("streamingbench", omni).user
    assert user.startswith(
        "You are an advanced video question-answering AI assistant. You have been provided with some frames"
    )
    assert user.endswith(
        "Question: Who just said \"What's my secret talent?\"?\n\nOptions:\n"
        "A.A man wearing a black blazer.\nB.A man wearing a black leather jacket.\n"
        "C.A man wearing a purple blazer.\nD.A fair-skinned man wearing an orange jumper.\n\nThe best option is:"
    )


def test_streamingbench_sqa_context_from_previous_answers():
    first_q, second_q = streamingbench.load(FIXTURES / "streamingbench", tasks=["sqa"])[0].questions
    opening = build_prompt("streamingbench", first_q, previous=[]).user
    assert "correct option.\n\n\n\nHere is the question." in opening  # empty context
    assert opening.endswith("Options:\nA. Wang chuqin.\nB. Fan Z.D.\nC. Xu xin.\nD. Ma Lin.\n\nThe best option is:")
    follow_up = build_prompt("streamingbench", second_q, previous=[first_q]).user
    assert (
        "correct option.\n\nHere are the contextual information related to the video. Please answer the questions "
        "based on the contextual information: At timestamp 00:00:36, the following question and answer occurred: "
        "Question: Who is preparing to serve the ball now?; Options: A. Wang chuqin., B. Fan Z.D., C. Xu xin., "
        "D. Ma Lin.; Answer: A; \n\nHere is the question."
    ) in follow_up


def test_streamingbench_proactive_poll_and_answer():
    # Its video is absent from the fixture, so take it from the full load.
    question = streamingbench.load(FIXTURES / "streamingbench")[3].questions[0]
    poll = build_prompt("streamingbench", question, stage="poll").user
    assert poll.endswith(
        'Question: When the scoreboard shows 3 points for USA, output "3". Is it the right time to output "3"? '
        "You can only answer yes or no.\n\nThe answer is:\n"
    )
    assert build_prompt("streamingbench", question).user.endswith(
        'Question: When the scoreboard shows 3 points for USA, output "3".\n\nThe answer is:\n'
    )


def test_poll_stage_only_for_proactive():
    question = first(videomme, "videomme")[0]
    with pytest.raises(UsageError, match="stage"):
        build_prompt("videomme", question, stage="poll")


def test_mvbench_best_option():
    question = first(mvbench, "mvbench")[0]
    prompt = build_prompt("mvbench", question)
    assert prompt.user == (
        "Question: What happened after the person took the food?\nOptions:\n(A) Ate the medicine.\n"
        "(B) Tidied up the blanket.\n(C) Put down the cup/glass/bottle.\n(D) Took the box.\nOnly give the best option."
    )
    assert prompt.system.startswith("Carefully watch the video and pay attention to the cause and sequence of events")
    assert prompt.answer_prefix == "Best option:("


def test_videomme_readme_prompt():
    question = first(videomme, "videomme")[0]
    assert build_prompt("Video-MME", question).user == (
        "Select the best answer to the following multiple-choice question based on the video. Respond with only "
        "the letter (A, B, C, or D) of the correct option.\n"
        "Which kind of decoration on the tree has the largest number?\n"
        "A. Apples.\nB. Candles.\nC. Berries.\nD. The three kinds are of the same number.\nThe best answer is:"
    )


def test_letter_directly_prompts():
    lvb = first(longvideobench, "longvideobench")[1]
    assert build_prompt("longvideobench", lvb).user == (
        "What happens after the anchor waves?\nA. The map appears.\nB. The lights go off.\nC. A guest enters.\n"
        "Answer with the option's letter from the given choices directly.\n"
    )
    ego = first(egoschema, "egoschema")[0]
    assert build_prompt("egoschema", ego).user.endswith(
        "E. c is reading a book.\nAnswer with the option's letter from the given choices directly."
    )
    lvbench_q = first(lvbench, "lvbench")[0]
    assert build_prompt("lvbench", lvbench_q).user == (
        "What year appears in the opening caption of the video?\n(A) 1636\n(B) 1366\n(C) 1363\n(D) 1633\n"
        "Answer with the option's letter from the given choices directly."
    )


def test_rvs_question_as_is():
    question = first(rvs, "rvs")[0]
    assert build_prompt("rvs-ego", question) == Prompt("Where did I leave the keys?")
