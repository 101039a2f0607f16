"""Issue 48, item 1: Reuters-21578 as a corpus format (``reuters21578``), on files written in the
distribution's own SGML layout, and on the real first file where ../shared holds it."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from uedp.errors import UedpError
from uedp.storage.formats import FormatError
from uedp.storage.formats.reuters import reuters_records, writer_of
from uedp.storage.ingest import IngestOptions, ingest
from uedp.storage.schemas import DOCUMENT_TAGS_FILE

from support import REPO, reuters_corpus, reuters_sgml, write

SHARED_REUTERS = REPO.parent / "shared" / "data" / "reuters21578"

ARTICLES = [
    {"id": 1, "split": "TRAIN", "title": "BANKAMERICA <BAC> EQUITY OFFER", "author": "Janie Gabbett",
     "places": ["usa"], "orgs": ["imf"], "people": ["james-baker"],
     "body": ["BankAmerica Corp is not under pressure to act quickly. It would do well to delay.",
              "Analysts said the offer could wait."]},
    {"id": 2, "split": "TEST", "title": "COCOA REVIEW", "places": ["brazil", "uruguay"],
     "body": ["Showers continued in the Bahia cocoa zone."]},
    {"id": 3, "split": "NOT-USED", "title": "SUGAR TENDER", "body": ["The tender was cancelled."]},
]


def test_articles_become_sentences_with_writers_splits_and_clean_text(tmp_path: Path) -> None:
    path = write(tmp_path / "reut2-000.sgm", reuters_sgml(ARTICLES))
    records = list(reuters_records(path))
    by_doc: dict[str, list[str]] = {}
    for r in records:
        by_doc.setdefault(r.doc_id, []).append(r.text)
    # the title first (entities unescaped), then the body's sentences; the wire's sign-off and controls gone
    assert by_doc["reuters:1"] == ["BANKAMERICA <BAC> EQUITY OFFER", "BankAmerica Corp is not under pressure to act "
                                   "quickly.", "It would do well to delay.", "Analysts said the offer could wait."]
    assert by_doc["reuters:2"][-1] == "Showers continued in the Bahia cocoa zone."
    assert not any("Reuter" in r.text or "\x03" in r.text for r in records)
    users = {r.doc_id: r.user for r in records}
    assert users == {"reuters:1": "author:Janie Gabbett", "reuters:2": "article:2", "reuters:3": "article:3"}
    assert {r.doc_id: r.split for r in records} == {"reuters:1": "train", "reuters:2": "test", "reuters:3": "valid"}
    first = next(r for r in records if r.doc_id == "reuters:1")
    assert first.doc_tags["places"] == ["usa"] and first.doc_tags["people"] == ["james-baker"]
    assert first.line == 2  # the line of its <REUTERS> tag


def test_author_lines_name_the_writer() -> None:
    assert writer_of("    by Janie Gabbett, Reuters") == "Janie Gabbett"
    assert writer_of("By Rich Miller, Reuter") == "Rich Miller"
    assert writer_of("  Peter Torday  ") == "Peter Torday"


def test_ingest_keeps_the_tags_as_a_documents_table_beside_the_sentences(home, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    files = reuters_corpus(tmp_path / "reuters")
    result = ingest(home, "reuters", files, IngestOptions(format="reuters21578"))
    assert result.per_split["train"] and result.per_split["test"] and result.per_split["valid"]
    sentences = home.table_dir("reuters", "sentences")
    found = duckdb.sql(f"SELECT count(DISTINCT s.doc_id) FROM '{sentences / 'data.parquet'}' s JOIN "
                       f"'{sentences / DOCUMENT_TAGS_FILE}' d USING (doc_id) WHERE d.tag = 'places' AND "
                       "d.value = 'usa'").fetchall()
    assert found[0][0] > 0
    users = duckdb.sql(f"SELECT DISTINCT user_id FROM '{sentences / 'data.parquet'}'").fetchall()
    assert ("author:Janie Gabbett",) in users
    chunked = ingest(home, "reuters-chunks", files, IngestOptions(format="reuters21578", users="chunk:20"))
    assert chunked.users < result.users
    with pytest.raises(UedpError, match="reuters21578 users: 'author'"):
        IngestOptions(format="reuters21578", users="source")


@pytest.mark.parametrize(("text", "line", "problem"), [
    ('<REUTERS NEWID="1" LEWISSPLIT="TRAIN">\n<TEXT><BODY>a</BODY></TEXT>\n', 1, "never closed"),
    ('<REUTERS NEWID="1" LEWISSPLIT="TRAIN">\n<REUTERS NEWID="2" LEWISSPLIT="TRAIN">\n', 2, "opened before"),
    ("x\n</REUTERS>\n", 2, "without an opening"),
    ('<REUTERS NEWID="1">\n<TEXT><BODY>a</BODY></TEXT>\n</REUTERS>\n', 1, "LEWISSPLIT"),
    ('<REUTERS NEWID="1" LEWISSPLIT="MAYBE">\n<TEXT><BODY>a</BODY></TEXT>\n</REUTERS>\n', 1, "MAYBE"),
    ('\n\n<REUTERS NEWID="1" LEWISSPLIT="TEST">\n<TITLE>t</TITLE>\n</REUTERS>\n', 3, "no <TEXT>"),
    ("just some text\n", None, "no <REUTERS> articles"),
])
def test_a_malformed_file_is_named_by_file_and_line(tmp_path: Path, text: str, line: int | None, problem: str) -> None:
    path = write(tmp_path / "reut2-009.sgm", text)
    with pytest.raises(FormatError, match=problem) as caught:
        list(reuters_records(path))
    assert caught.value.path == path and caught.value.line == line


def test_a_latin1_line_is_read_as_the_distribution_encodes_it(tmp_path: Path) -> None:
    text = reuters_sgml([{**ARTICLES[2], "body": ["Zurich's M\xfcller said so."]}]).encode("latin-1")
    records = list(reuters_records(write(tmp_path / "reut2-017.sgm", text)))
    assert records[-1].text == "Zurich's M\u00fcller said so."


@pytest.mark.skipif(not (SHARED_REUTERS / "reut2-000.sgm").is_file(), reason="../shared/data/reuters21578 absent")
def test_the_real_first_file_reads_as_documented() -> None:
    records = list(reuters_records(SHARED_REUTERS / "reut2-000.sgm"))
    first = [r for r in records if r.doc_id == "reuters:1"]
    assert first[0].text == "BAHIA COCOA REVIEW" and first[0].split == "train" and first[0].user == "article:1"
    assert first[0].doc_tags["places"] == ["el-salvador", "usa", "uruguay"]
    assert first[-1].text.endswith("after carnival which ends midday on February 27.")
    assert len({r.doc_id for r in records}) > 900  # of the file's 1,000 articles, those with text
    assert any(r.user.startswith("author:") for r in records if r.user)
