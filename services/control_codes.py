"""Control codes: a labelled corpus' class written before each sentence a language model trains on, so that
the model can later be asked for text of a class (``uedp generate --labels``; Yue et al. 2023 prefix the label
the same way). The code is ordinary text of the sentence it starts: the class is part of the writer's record,
so it is covered by the run's guarantee like the words after it."""

from __future__ import annotations


def control_code(label: str) -> str:
    """The text that starts a sentence of class ``label`` (e.g. ``[3]``); one space separates it from the
    sentence, so a word-piece tokenizer reads the code as the same tokens before any sentence."""
    return f"[{label}]"


def with_code(label: str, text: str) -> str:
    return f"{control_code(label)} {text}"


def code_length(label: str) -> int:
    """Characters the code and its space add before the sentence (sensitive spans move by this much)."""
    return len(control_code(label)) + 1


def without_code(label: str, text: str) -> str:
    """A generated text with its class' code taken off the front (the corpus keeps the class as its label)."""
    code = control_code(label)
    return text[len(code):].strip() if text.startswith(code) else text.strip()
