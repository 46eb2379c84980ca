"""Multiple choice: a question with options is answered with one of the offered letters, whatever the model.

The tiny model is random: left free, its first answer token is an arbitrary one of its vocabulary,
so these tests fail unless decoding is restricted to the offered letters.
"""

import json

import pytest

from hermes.cli import main
from hermes.pipelines.session import StreamingSession
from hermes.pipelines.synthetic import write_synthetic_video
from tests.conftest import random_frames

OPTIONS = ["red", "blue", "white"]


def test_an_answer_to_options_is_one_of_their_letters(tiny_model):
    session = StreamingSession(tiny_model, "full", random_frames(12), chunk_frames=4, max_new_tokens=8)
    for i, at in enumerate((1.0, 2.5, 4.0, 6.0)):
        options = OPTIONS[: 2 + i % 2]
        answer = session.ask("What colour is the car?", options=options, at=at)
        assert answer.answer in "ABC"[: len(options)] and len(answer.answer) == 1, answer.answer
        # the letter is the model's favourite among the offered letters' tokens (spelled "A" or " A")
        logits = answer.first_token_logits
        best = {letter: max(logits[i].item() for i in ids) for letter, ids in spellings(tiny_model, options).items()}
        assert answer.answer == max(best, key=best.get)
    # a question without options still gets the model's free-form answer, as long as it says
    assert session.ask("What colour is the car?").answer not in ("A", "B", "C")


def spellings(model, options) -> dict[str, list[int]]:
    """Each offered letter's single-token spellings, alone and after a space, from the tokenizer itself."""
    out = {}
    for letter in "ABCDEFGHIJ"[: len(options)]:
        ids = [model.tokenizer.encode(text, add_special_tokens=False) for text in (letter, " " + letter)]
        out[letter] = [i[0] for i in ids if len(i) == 1]
        assert out[letter], letter
    return out


def test_run_with_a_questions_file_answers_only_offered_letters(tmp_path, capsys):
    video = write_synthetic_video(tmp_path / "clip.mp4", duration_s=4.0, fps=10.0)
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"id": i, "question": q, "at_s": at, "options": OPTIONS}) + "\n"
                                 for i, (q, at) in enumerate([("What colour is the car?", 1.5),
                                                              ("Which colour is biggest?", 3.0),
                                                              ("What colour was first?", None)])))
    code = main(["run", str(video), "--model", "tiny-llava-onevision", "--fps", "2", "--quiet", "--json",
                 "--questions", str(questions)])
    out, err = capsys.readouterr()
    assert code == 0, err
    answers = [json.loads(line) for line in out.splitlines()]
    assert [a["id"] for a in answers] == [0, 1, 2]
    assert all(a["answer"] in ("A", "B", "C") for a in answers), [a["answer"] for a in answers]


@pytest.mark.parametrize("accept", ["application/json", "text/event-stream"])
def test_serve_answers_options_with_a_letter(tiny_model, accept):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient
    from serve_fixtures import AUTH, jpeg, make_server, sse_events

    _, app = make_server(tiny_model)
    with TestClient(app, headers=AUTH) as c:
        c.post("/v1/streams", json={"source": "push", "name": "cam"})
        for i in range(4):
            assert c.post("/v1/streams/cam/frames", params={"t_s": i * 0.5}, content=jpeg(40 * i)).status_code == 202
        r = c.post("/v1/streams/cam/questions", headers={"Accept": accept},
                   json={"question": "What colour is the car?", "options": OPTIONS, "max_new_tokens": 8})
        assert r.status_code == 200, r.text
        answer = r.json() if accept == "application/json" else sse_events(r.text)[-1][1]
    assert answer["answer"] in ("A", "B", "C") and answer["options"] == OPTIONS
