"""The question text the model sees: the question, and for multiple choice its lettered options."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hermes.errors import UsageError

OPTION_LETTERS = "ABCDEFGHIJ"


def check_option_count(options: Sequence[str]) -> None:
    """Refuse more options than there are letters (A-J) to answer with.

    Raises:
        UsageError: more than 10 options.
    """
    if len(options) > len(OPTION_LETTERS):
        raise UsageError(f"at most {len(OPTION_LETTERS)} options per question, found {len(options)}")


def format_prompt(question: str, options: Iterable[str] = ()) -> str:
    """The question text the model sees; multiple choice gets lettered options and an instruction."""
    options = list(options)
    if not options:
        return question
    check_option_count(options)
    lines = [question] + [f"{OPTION_LETTERS[i]}. {text}" for i, text in enumerate(options)]
    lines.append("Answer with the option's letter from the given choices directly.")
    return "\n".join(lines)
