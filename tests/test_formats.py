"""Every reader on fixtures in the exact formats people download (text invented for these tests),
with the messy cases real files have, and errors that name file and line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from uedp.storage.formats import FormatError, split_from_filename
from uedp.storage.formats.agnews import agnews_csv_records, agnews_jsonl_records
from uedp.storage.formats.sec import edgar_corpus_records, edgar_submission_records
from uedp.storage.formats.tabular import csv_records, jsonl_records
from uedp.storage.formats.wikitext import wikitext_records

from support import AG_CSV, WIKI, write


def test_agnews_csv_labels_sources_and_cleanup(tmp_path: Path) -> None:
    records = list(agnews_csv_records(write(tmp_path / "train.csv", AG_CSV)))
    assert [r.label for r in records] == ["3", "4", "2", "1", "3"]
    assert [r.source_user_hint for r in records] == ["Reuters", "SPACE.com", "AP", "AFP", None]
    assert records[0].text == ("Orchard Foods Lifts Forecast (Reuters). Reuters - Orchard Foods raised its annual "
                               "forecast on Tuesday, citing strong demand for its frozen meals.")
    assert records[3].text.endswith("on Monday 's agenda & schedule.") and '"Harbour"' in records[3].text
    assert records[3].line == 4 and records[4].line == 6  # record 4 spans lines 4-5
    assert {r.split for r in records} == {"train"}


def test_agnews_csv_with_header_and_errors(tmp_path: Path) -> None:
    with_header = write(tmp_path / "test.csv", '"Class Index","Title","Description"\n' + AG_CSV)
    assert len(list(agnews_csv_records(with_header))) == 5
    bad_columns = write(tmp_path / "a.csv", AG_CSV + '"2","Only two fields"\n')
    with pytest.raises(FormatError, match=r"a\.csv:7: expected 3 columns"):
        list(agnews_csv_records(bad_columns))
    bad_class = write(tmp_path / "b.csv", '"World","Title","Text"\n"x","T","D"\n')
    with pytest.raises(FormatError, match=r"b\.csv:1: class must be an integer"):
        list(agnews_csv_records(bad_class))
    bad_utf8 = write(tmp_path / "c.csv", AG_CSV.encode() + b'"1","caf\xe9","x"\n')
    with pytest.raises(FormatError, match=r"c\.csv:\d+: invalid UTF-8"):
        list(agnews_csv_records(bad_utf8))


def test_agnews_jsonl_hub_and_split_layouts(tmp_path: Path) -> None:
    lines = [
        {"text": "Kestrel Bank Posts Profit (Reuters) Reuters - Kestrel Bank said profit rose.", "label": 2},
        {"title": "Comet Seen", "description": "AP - Astronomers saw a comet.", "label": 3},
    ]
    path = write(tmp_path / "validation.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    records = list(agnews_jsonl_records(path))
    assert [(r.label, r.source_user_hint, r.split) for r in records] == [("2", "Reuters", "valid"), ("3", "AP", "valid")]
    with pytest.raises(FormatError, match=r"bad\.jsonl:2: invalid JSON"):
        list(agnews_jsonl_records(write(tmp_path / "bad.jsonl", json.dumps(lines[0]) + "\n{oops\n")))
    with pytest.raises(FormatError, match=r"nolabel\.jsonl:1: missing 'label'"):
        list(agnews_jsonl_records(write(tmp_path / "nolabel.jsonl", '{"text": "x"}\n')))




def test_wikitext_articles_are_users_and_detokenize(tmp_path: Path) -> None:
    path = write(tmp_path / "wiki.valid.tokens", WIKI)
    records = list(wikitext_records(path))
    assert [r.text for r in records] == [
        "The Harbourline Lighthouse is a 32 @-@ metre tower on the coast of <unk> .",
        "It was built in 1 @,@ 872 and restored in 1990 .",
        "Keepers lived there until 1961 .",
        "The Orchard Valley Railway ( OVR ) is a heritage line , 9 @.@ 5 km long .",
    ]
    assert [r.user for r in records] == ["wiki.valid.tokens#000000"] * 3 + ["wiki.valid.tokens#000001"]
    assert records[2].line == 8 and {r.split for r in records} == {"valid"}
    detok = [r.text for r in wikitext_records(path, detokenized=True)]
    assert detok[0] == "The Harbourline Lighthouse is a 32-metre tower on the coast of <unk>."
    assert detok[3] == "The Orchard Valley Railway (OVR) is a heritage line, 9.5 km long."


def test_wikitext_raw_name_and_text_before_heading(tmp_path: Path) -> None:
    assert len(list(wikitext_records(write(tmp_path / "train.txt", WIKI.replace("<unk>", "Kestrel"))))) == 4
    with pytest.raises(FormatError, match=r"x\.tokens:1: text before the first"):
        list(wikitext_records(write(tmp_path / "x.tokens", " stray text . \n = T = \n")))


EDGAR_CORPUS = [
    {"filename": "320193_2020.htm", "cik": "0000320193", "year": "2020",
     "section_1": "Orchard Devices designs phones. It sells them worldwide.\n\nThe company has 147,000 employees.",
     "section_1A": "Risks include supply shocks.", "section_7": ""},
    {"filename": "320193_2021.htm", "cik": "320193", "year": "2021", "section_1": "Orchard Devices grew."},
    {"filename": "789019_2020.htm", "cik": "789019", "year": "2020", "section_1": "Kestrel Soft writes software."},
]


def test_edgar_corpus_jsonl_users_are_filers(tmp_path: Path) -> None:
    path = write(tmp_path / "train.jsonl", "\n".join(json.dumps(f) for f in EDGAR_CORPUS) + "\n")
    records = list(edgar_corpus_records(path))
    assert [r.text for r in records] == [
        "Orchard Devices designs phones.", "It sells them worldwide.", "The company has 147,000 employees.",
        "Risks include supply shocks.", "Orchard Devices grew.", "Kestrel Soft writes software.",
    ]
    assert [r.user for r in records] == ["cik:320193"] * 5 + ["cik:789019"]  # leading zeros normalised
    with pytest.raises(FormatError, match=r"bad\.jsonl:1: a filing without a 'cik' field .*sec reads EDGAR-CORPUS JSONL"):
        list(edgar_corpus_records(write(tmp_path / "bad.jsonl", '{"section_1": "x"}\n')))


# One filing per JSON document, as crawlers of EDGAR save real 10-K filings (pretty-printed, item fields,
# the CIK a number or a one-item list, company names beside it); the text is invented.
CRAWLED_10K = {
    "cik": [320193], "names": ["ORCHARD DEVICES INC"], "filing_date": "2023-11-03", "form": "10-K",
    "item1": "Orchard Devices designs phones. It sells them in Cardiff.",
    "item1a": "Supply shocks could hurt margins.",
    "item7": "Revenue rose 4%.\n\nMargins held.", "item7a": "",
}


def test_sec_json_documents_one_filing_per_file_or_an_array(tmp_path: Path) -> None:
    from uedp.storage.formats.registry import get_format
    from uedp.storage.ingest import IngestOptions

    read = get_format("sec").read
    options = IngestOptions(format="sec")
    single = write(tmp_path / "0000320193-23-000106.json", json.dumps(CRAWLED_10K, indent=4))
    records = list(read(single, options))
    assert [r.text for r in records] == ["Orchard Devices designs phones.", "It sells them in Cardiff.",
                                         "Supply shocks could hurt margins.", "Revenue rose 4%.", "Margins held."]
    assert {r.user for r in records} == {"cik:320193"}  # the filer, not the company's name
    text = single.read_text()
    assert records[2].line == text[:text.index('"item1a"')].count("\n") + 1  # the line its field starts on
    # The same filing saved without a .json name, and an array of filings with the other spellings.
    assert [r.text for r in read(write(tmp_path / "0000320193-23-000106", json.dumps(CRAWLED_10K, indent=2)),
                                 options)] == [r.text for r in records]
    other = {"cik": "0000789019", "company": "KESTREL SOFT", "item_1": "Kestrel Soft writes software.",
             "Item 7A": "Rates moved."}
    array = list(read(write(tmp_path / "filings.json", json.dumps([CRAWLED_10K, other], indent=2)), options))
    assert [r.user for r in array] == ["cik:320193"] * 5 + ["cik:789019"] * 2
    one_line_array = write(tmp_path / "more.json", json.dumps([other, other]))
    assert len(list(read(one_line_array, options))) == 4


def test_sec_input_of_no_form_says_which_forms_sec_reads(tmp_path: Path) -> None:
    from uedp.storage.formats.registry import get_format
    from uedp.storage.ingest import IngestOptions

    read, options = get_format("sec").read, IngestOptions(format="sec")
    broken = write(tmp_path / "f.json", json.dumps(CRAWLED_10K, indent=4).replace('"item1a"', "item1a"))
    with pytest.raises(FormatError, match=r"f\.json:\d+: invalid JSON: Expecting property name enclosed in double "
                       r"quotes at column 5: .*>>>item1a.* \(sec reads EDGAR-CORPUS JSONL"):
        list(read(broken, options))
    no_text = write(tmp_path / "g.json", json.dumps({"cik": 1, "names": ["X"], "body": "text"}, indent=2))
    with pytest.raises(FormatError, match=r"no 'section_\*' or 'item\*' text fields in this filing \(its fields: "
                       r"body, cik, names\); sec reads"):
        list(read(no_text, options))
    with pytest.raises(FormatError, match=r"h\.json: a filing without a 'cik' field"):
        list(read(write(tmp_path / "h.json", json.dumps({"item1": "Text."}, indent=2)), options))
    with pytest.raises(FormatError, match=r"notes\.txt: no SEC header .* sec reads EDGAR-CORPUS JSONL .*JSON document"):
        list(read(write(tmp_path / "notes.txt", "Just some notes.\n"), options))


def test_jsonl_syntax_error_names_column_and_shows_the_text_around_it(tmp_path: Path) -> None:
    line = json.dumps({"text": "x" * 80, "user": "u1"})[:-20]  # cut: an unterminated string
    path = write(tmp_path / "broken.jsonl", json.dumps({"text": "fine", "user": "u0"}) + "\n" + line + "\n")
    with pytest.raises(FormatError) as caught:
        list(jsonl_records(path, text_col="text", user_col="user"))
    message = str(caught.value)
    assert message.startswith(f"{path}:2: invalid JSON: Unterminated string starting at column 10: ")
    assert '{"text": >>>"xxxxxxxx' in message and message.endswith("...")  # the excerpt is cut, not the line
    assert len(message) < len(str(path)) + 140


SUBMISSION = """<SEC-DOCUMENT>0000950170-23-000001.txt : 20230301
<SEC-HEADER>0000950170-23-000001.hdr.sgml : 20230301
ACCESSION NUMBER:\t\t0000950170-23-000001
CONFORMED SUBMISSION TYPE:\t10-K
PUBLIC DOCUMENT COUNT:\t\t3

FILER:

\tCOMPANY DATA:\t
\t\tCOMPANY CONFORMED NAME:\t\t\tORCHARD DEVICES INC
\t\tCENTRAL INDEX KEY:\t\t\t0000320193
\t\tSTANDARD INDUSTRIAL CLASSIFICATION:\tELECTRONIC COMPUTERS [3571]
</SEC-HEADER>
<DOCUMENT>
<TYPE>10-K
<SEQUENCE>1
<FILENAME>orch-20221231.htm
<TEXT>
<html><head><title>10-K</title><style>p {color: red}</style></head>
<body><div style="display: none"><div><ix:header>hidden xbrl facts 12345</ix:header></div></div>
<p>Orchard Devices Inc. designs phones&nbsp;and tablets. Its headquarters are in Cardiff.</p>
<script>var x = 1;</script>
<table><tr><td>Revenue rose 4%.</td></tr></table>
</body></html>
</TEXT>
</DOCUMENT>
<DOCUMENT>
<TYPE>EX-21
<SEQUENCE>2
<TEXT>
Subsidiaries: Orchard Devices Ltd. (Wales).
</TEXT>
</DOCUMENT>
<DOCUMENT>
<TYPE>GRAPHIC
<SEQUENCE>3
<TEXT>
begin 644 logo.jpg
M_]C_X  02D9)1@ ! 0$ 8 !@  #_VP!#  @&!@<&!0@'!P<)
end
</TEXT>
</DOCUMENT>
</SEC-DOCUMENT>
"""


def test_raw_edgar_submission_reads_the_main_document_as_visible_text(tmp_path: Path) -> None:
    path = write(tmp_path / "0000950170-23-000001.txt", SUBMISSION)
    records = list(edgar_submission_records(path))
    assert [r.text for r in records] == [
        "Orchard Devices Inc. designs phones and tablets.", "Its headquarters are in Cardiff.", "Revenue rose 4%.",
    ]
    assert {r.user for r in records} == {"cik:320193"}
    assert records[0].doc_id == "0000950170-23-000001/10-K" and records[0].line == 18
    with_exhibit = [r.text for r in edgar_submission_records(path, ("10-K", "EX-21", "GRAPHIC"))]
    assert with_exhibit[-1] == "Subsidiaries: Orchard Devices Ltd. (Wales)." and not any("begin 644" in t for t in with_exhibit)


def test_raw_edgar_errors(tmp_path: Path) -> None:
    no_cik = write(tmp_path / "a.txt", SUBMISSION.replace("\t\tCENTRAL INDEX KEY:\t\t\t0000320193\n", ""))
    with pytest.raises(FormatError, match=r"a\.txt:12: SEC header has no 'CENTRAL INDEX KEY'"):
        list(edgar_submission_records(no_cik))
    truncated = write(tmp_path / "b.txt", SUBMISSION[: SUBMISSION.index("</TEXT>")])
    with pytest.raises(FormatError, match=r"b\.txt:18: <TEXT> is never closed"):
        list(edgar_submission_records(truncated))


def test_generic_jsonl_and_csv_columns(tmp_path: Path) -> None:
    rows = [{"body": "Hello  there", "author": "ann", "topic": "x", "part": "train"},
            {"body": "", "author": "bob", "topic": "y", "part": "test"},
            {"body": "Bye", "author": "bob", "topic": None, "part": "dev"}]
    path = write(tmp_path / "data.jsonl.gz", gzip.compress("\n".join(json.dumps(r) for r in rows).encode()))
    records = list(jsonl_records(path, "body", "author", "topic", "part"))
    assert [(r.text, r.user, r.label, r.split) for r in records] == [("Hello there", "ann", "x", "train"),
                                                                     ("Bye", "bob", None, "valid")]
    with pytest.raises(FormatError, match=r"data\.jsonl\.gz:1: missing column 'writer'"):
        list(jsonl_records(path, "body", "writer"))
    table = write(tmp_path / "notes.csv", "id,text,user\n1,first note,u1\n2,\"second, with comma\",u2\n3,broken\n")
    with pytest.raises(FormatError, match=r"notes\.csv:4: expected 3 columns like the header, got 2"):
        list(csv_records(table, "text", "user"))


@pytest.mark.parametrize(
    ("name", "split"),
    [("eng.train", "train"), ("eng.testa", "valid"), ("eng.testb", "test"), ("wiki.valid.tokens", "valid"),
     ("train.txt", "train"), ("test.csv", "test"), ("validation.jsonl.gz", "valid"), ("demo.conll", None),
     ("filings.txt", None)],
)
def test_split_from_filename(name: str, split: str | None) -> None:
    assert split_from_filename(Path(name)) == split


def test_csv_errors_name_the_true_line_and_column_long_fields_and_a_bom(tmp_path: Path) -> None:
    """Invalid UTF-8 far into a file is reported at its own line and column (it was a byte offset inside
    the decoder's 8 KiB buffer, on the wrong line); fields over Python's 128 KiB default are read; a
    byte-order mark before the header does not rename its first column."""
    filler = "".join(f'"3","Title {i}","Body number {i} of the archive."\n' for i in range(2_000))
    bad = write(tmp_path / "late.csv", filler.encode() + b'"1","caf\xe9 au lait","x"\n')
    with pytest.raises(FormatError, match=r"late\.csv:2001: invalid UTF-8 \(byte 0xe9\) at column 9;"):
        list(agnews_csv_records(bad))

    long_body = "word " * 60_000  # 300 KB in one field
    long = write(tmp_path / "long.csv", f'"2","Long","{long_body}"\n"3","Short","Fine."\n')
    records = list(agnews_csv_records(long))
    assert len(records) == 2 and len(records[0].text) > 290_000 and records[1].line == 2

    bom = write(tmp_path / "bom.csv", b"\xef\xbb\xbftext,writer\nHello there,amara\nBye,okafor\n")
    rows = list(csv_records(bom, "text", "writer", None, None))
    assert [(r.text, r.user, r.line) for r in rows] == [("Hello there", "amara", 2), ("Bye", "okafor", 3)]
