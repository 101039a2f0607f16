"""The CoNLL-2003 reader: tag schemes, exact spans, and errors that name file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from uedp.storage.formats import FormatError
from uedp.storage.formats.conll import read_conll

from support import write

IOB1 = """-DOCSTART- -X- -X- O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O
. . O O

Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER
Paul NNP I-NP B-PER

-DOCSTART- -X- -X- O

BRUSSELS NNP I-NP I-LOC
"""

IOB2 = IOB1.replace("I-ORG", "B-ORG").replace("I-MISC", "B-MISC").replace("I-LOC", "B-LOC").replace(
    "Peter NNP I-NP I-PER", "Peter NNP I-NP B-PER"
)


@pytest.mark.parametrize("text", [IOB1, IOB2], ids=["iob1", "iob2"])
def test_iob1_and_iob2_decode_to_the_same_spans(tmp_path: Path, text: str) -> None:
    sentences = list(read_conll(write(tmp_path / "x.conll", text)))
    assert [s.doc_index for s in sentences] == [0, 0, 1]
    first, second, third = sentences
    assert first.text == "EU rejects German call ."
    assert [(first.text[s["start"]:s["end"]], s["label"]) for s in first.spans()] == [("EU", "ORG"), ("German", "MISC")]
    # IOB1's B- separates two adjacent entities of the same type.
    assert [(second.text[s["start"]:s["end"]], s["label"]) for s in second.spans()] == [
        ("Peter Blackburn", "PER"), ("Paul", "PER")]
    assert third.spans() == [{"start": 0, "end": 8, "label": "LOC"}]
    assert first.line == 3 and third.line == 15


@pytest.mark.parametrize(
    ("content", "line", "problem"),
    [
        ("EU NNP I-NP B-ORG\nrejects VBZ O\n", 2, "expected 4 columns"),
        ("EU NNP I-NP B-ORG\nrejects VBZ I-VP X-FOO\n", 2, "unknown NER tag 'X-FOO'"),
        ("EU NNP I-NP B-ORG\nvoil\xe0 NN I-NP O\n".encode("latin-1"), 2, "invalid UTF-8"),
        ("EU NNP I-NP B-ORG\n-DOCSTART- -X- -X- O\n", 2, "-DOCSTART- inside a sentence"),
        ("\n\n", None, "no sentences found"),
        ("", None, "no sentences found"),
        ("-DOCSTART- -X- O\n\nEU NNP B-NP\nrejects VBZ B-VP\n", 3, "the last column holds chunk tags ('B-NP')"),
    ],
    ids=["columns", "tag", "utf8", "docstart", "blank", "empty", "chunk-tags"],
)
def test_bad_input_names_file_and_line(tmp_path: Path, content: str | bytes, line: int | None, problem: str) -> None:
    path = write(tmp_path / "bad.conll", content)
    with pytest.raises(FormatError) as info:
        list(read_conll(path))
    assert info.value.line == line
    assert problem in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="file not found"):
        list(read_conll(tmp_path / "nope.conll"))


def test_real_conll2003_training_file_has_946_documents_and_14041_sentences(shared_conll: Path) -> None:
    sentences = list(read_conll(shared_conll / "eng.train"))
    assert len(sentences) == 14041
    assert len({s.doc_index for s in sentences}) == 946
    # every span covers whole tokens of the sentence text
    for s in sentences[:2000]:
        for span in s.spans():
            assert s.text[span["start"]:span["end"]].strip() == s.text[span["start"]:span["end"]]


def test_a_utf8_byte_order_mark_is_not_part_of_the_first_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bom.conll", "\ufeff-DOCSTART- -X- -X- O\n\nEU NNP I-NP B-ORG\nrejects VBZ I-VP O\n"
                 .encode("utf-8"))
    (sentence,) = list(read_conll(path))
    assert sentence.tokens == ["EU", "rejects"] and sentence.doc_index == 0 and sentence.line == 3
