"""Corpus formats register themselves, every ingest setting is declared once (``IngestOptions``), and the
content key of an ingest is the one it was before either change (so existing data homes are reused)."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from uedp.cli import app
from uedp.errors import UedpError
from uedp.flows.ingest import IngestConfig
from uedp.storage.formats import FormatError, SourceRecord, read_lines
from uedp.storage.formats import registry as format_registry
from uedp.storage.formats.registry import CorpusFormat, format_names, get_format, register_format, unregister_format
from uedp.storage.ingest import DEFAULT_USERS, FORMATS, GOLD_FORMATS, IngestOptions, ingest
from uedp.storage.tables import hash_config, read_manifest, read_table

from support import write

BUILT_IN = ("conll2003", "ag_news", "sec", "wikitext", "jsonl", "csv", "simdial", "reuters21578")


# --- a format registered from outside uedp -------------------------------------------------------------------


def _read_notes(path: Path, options: IngestOptions) -> Iterator[SourceRecord]:
    """``writer<TAB>text`` lines; the writer is the user."""
    for line, text in read_lines(path):
        writer, tab, body = text.partition("\t")
        if not tab:
            raise FormatError(path, line, "expected writer<TAB>text")
        yield SourceRecord(text=body.strip(), user=f"writer:{writer}", doc_id=f"{path.name}:{line}", line=line)


def _check_notes(options: IngestOptions) -> None:
    if options.text_col:
        raise UedpError("format notes has no columns; drop --text-col")


@pytest.fixture
def notes_format() -> Iterator[CorpusFormat]:
    spec = register_format(CorpusFormat(name="notes", summary="writer<TAB>text lines, one user per writer",
                                        read=_read_notes, default_users="writer", fixed_users=True, check=_check_notes))
    try:
        yield spec
    finally:
        unregister_format("notes")


def test_a_registered_format_is_ingested_end_to_end(home, tmp_path: Path, notes_format: CorpusFormat) -> None:
    lines = [f"w{i % 3}\tNote number {i} from a writer." for i in range(12)]
    path = write(tmp_path / "notes.txt", "\n".join(lines) + "\n")
    result = ingest(home, "n", [path], IngestOptions(format="notes", split="users"))
    assert not result.reused and result.sentences == 12 and result.users == 3
    sentences = read_table(home.table_dir("n", "sentences")).to_pylist()
    assert {r["user_id"] for r in sentences} == {"writer:w0", "writer:w1", "writer:w2"}
    assert sentences[4]["text"] == "Note number 4 from a writer." and sentences[4]["source_line"] == 5
    assert sum(r["n_sentences"] for r in read_table(home.table_dir("n", "users")).to_pylist()) == 12
    assert read_manifest(home.table_dir("n", "sentences"))["source"]["options"]["users"] == "writer"
    assert ingest(home, "n", [path], IngestOptions(format="notes", split="users")).reused

    # What the registry says about the format is what ingest's options enforce.
    assert format_names() == (*BUILT_IN, "notes") and get_format("notes") is notes_format
    with pytest.raises(UedpError, match=r"format notes has fixed users \(writer\); drop --users"):
        IngestOptions(format="notes", users="chunk:2")
    with pytest.raises(UedpError, match="format notes has no columns; drop --text-col"):
        IngestOptions(format="notes", text_col="text")
    with pytest.raises(UedpError, match=r"unknown format 'pdf'; valid: conll2003, ag_news, sec, wikitext, jsonl, csv, simdial, reuters21578, notes$"):
        IngestOptions(format="pdf")
    assert IngestConfig(dataset="n", format="notes", files=[str(path)]).options().user_strategy == "writer"


def test_unknown_formats_name_the_valid_ones_and_names_register_once(notes_format: CorpusFormat) -> None:
    unregister_format("notes")
    with pytest.raises(UedpError, match=r"unknown format 'notes'; valid: conll2003, ag_news, sec, wikitext, jsonl, csv, simdial, reuters21578$"):
        IngestOptions(format="notes")
    register_format(notes_format)
    register_format(notes_format)  # the same entry again is no change
    with pytest.raises(ValueError, match="corpus format 'notes' is registered twice"):
        register_format(CorpusFormat(name="notes", summary="another", read=_read_notes, default_users="writer"))


def test_the_names_other_modules_import_are_derived_from_the_registry() -> None:
    assert FORMATS == BUILT_IN == format_names()[:8]
    assert set(GOLD_FORMATS) == {"conll2003"}
    assert DEFAULT_USERS == {"conll2003": "document", "sec": "filer", "wikitext": "article", "ag_news": "source",
                             "jsonl": "column", "csv": "column", "simdial": "dialog", "reuters21578": "author"}
    assert [name for name in BUILT_IN if get_format(name).fixed_users] == ["conll2003", "sec", "wikitext", "simdial"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(format="ag_news", users="column"), r"ag_news users: 'source' \(news agency\) or 'chunk:N'"),
        (dict(format="jsonl"), "format jsonl needs --text-col"),
        (dict(format="csv", text_col="t"), "format csv needs --user-col, or --users chunk:N"),
        (dict(format="wikitext", users="document"), r"format wikitext has fixed users \(article\); drop --users"),
        (dict(format="sec", users="chunk:2"), r"format sec has fixed users \(filer\)"),
        (dict(format="csv", text_col="t", users="chunk:x"), "chunk size must be a positive integer"),
        (dict(format="conll2003", valid_fraction=0.6, test_fraction=0.5), "sum to less than 1"),
        (dict(format="conll2003", split_of=["notes.txt"]), r"--split-of 'notes.txt': expected FILE=SPLIT"),
        (dict(format="conll2003", split_of={"notes.txt": "dev"}), r"--split-of notes.txt=dev: the split must be one of"),
        (dict(format="conll2003", split_of=["a/notes.txt=train", "b/notes.txt=test"]), "names a file twice"),
    ],
)
def test_each_check_of_a_setting_lives_in_the_model(options: dict, message: str) -> None:
    with pytest.raises(UedpError, match=message):
        IngestOptions(**options)
    with pytest.raises(UedpError, match=message):  # the Prefect form is the same model: the same check
        IngestConfig(dataset="d", files=["x"], **options)


# --- the content key ----------------------------------------------------------------------------------------

# Hashes of ``describe()`` computed on the code before the options became a pydantic model and the formats
# registry entries. A different hash means every existing dataset of such options would be ingested again.
PINNED_OPTION_HASHES = [
    (dict(format="conll2003"), "cc23351f84386e0a9325f9413fc4d49c567a087e4ad313bf831b15c5b5a10651"),
    (dict(format="csv", text_col="text", user_col="user", label_col="label", split="users", split_seed=7,
          valid_fraction=0.2, test_fraction=0.15), "1e57efdc2ad71298c03a771c384587b701fe895cc8e920b03c8948f45aa8d67f"),
    # split_of given in any order (the CLI and the form sorted it by file name before, as the model does now)
    (dict(format="jsonl", text_col="text", users="chunk:3", split_of={"b.jsonl": "test", "a.jsonl": "train"}),
     "6f1b50b0dacaa6c55a192339ff1598914865139bbfe4809f26275c5736f6b418"),
    (dict(format="sec", sec_document_types=("10-K", "EX-99.1")),
     "288fc3ff214dde4db029f240578d5ec5b66dac960f54a4fc6041a740c05ec82e"),
    (dict(format="wikitext", detokenize=True, split="files"),
     "1c8f1a7edf7ef8959c74a33d97bd6d0e1a88fc87803fc01ad87fa5d8e7638b2b"),
    (dict(format="ag_news", users="source"), "8c4221db8a860514ff86457da79bda2e6df73e121afc198bf01566b51ffac005"),
]
CSV_NOTES = "text,user,label\nAnna Berg met Imelda.,u1,a\nCall 555.,u2,b\nHello there.,u3,a\n"
CSV_OPTIONS = PINNED_OPTION_HASHES[1][0]
CSV_INGEST_KEY = "b47f8c42382db1d83014e16ba643d8c6c9332e5a03cc60ac0b748a11f7b7eb1f"  # inputs, roles, options, schema


@pytest.mark.parametrize(("options", "digest"), PINNED_OPTION_HASHES, ids=[o["format"] for o, _ in PINNED_OPTION_HASHES])
def test_the_options_hash_as_before(options: dict, digest: str) -> None:
    assert hash_config({"options": IngestOptions(**options).describe()}) == digest
    config = IngestConfig(home="/h", dataset="d", files=["x"], store="s3://b/u", **options)
    assert config.options().describe() == IngestOptions(**options).describe()  # the form: the same options


def test_the_recorded_options_and_the_ingest_key_are_those_of_before(home, tmp_path: Path) -> None:
    assert IngestOptions(format="conll2003").describe() == {
        "format": "conll2003", "users": "document", "text_col": None, "user_col": None, "label_col": None,
        "split_col": None, "split": "auto", "split_by_user": {"seed": 0, "valid_fraction": 0.1, "test_fraction": 0.1},
        "detokenize": False, "sec_document_types": (), "split_of": (),
    }
    result = ingest(home, "n", [write(tmp_path / "notes.csv", CSV_NOTES)], IngestOptions(**CSV_OPTIONS))
    assert result.key == CSV_INGEST_KEY
    assert read_manifest(home.table_dir("n", "sentences"))["source"]["options"]["split_by_user"] == {
        "seed": 7, "valid_fraction": 0.2, "test_fraction": 0.15}


# --- `uedp ingest`: flags derived from the model -----------------------------------------------------------


def test_ingest_help_lists_the_flags_the_model_declares() -> None:
    result = CliRunner().invoke(app, ["ingest", "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    assert result.exit_code == 0, result.output
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.stdout).split())  # the help's words, without rich's boxes
    for name in IngestOptions.model_fields:
        if name != "format":
            assert f"--{name.replace('_', '-')}" in text, name
    for name in ("text_col", "user_col", "split_seed", "split_of"):
        assert IngestOptions.model_fields[name].description in text, name
    for flag in ("--name", "--config", "--set", "--store", "--home", "--no-detokenize"):
        assert flag in text
    for name in BUILT_IN:
        assert f"{name}: {get_format(name).summary}" in text


def test_cli_ingest_takes_set_config_and_the_old_flags(tmp_path: Path, prefect_server: None) -> None:
    corpus = write(tmp_path / "notes.csv", CSV_NOTES)
    home = str(tmp_path / "h")
    runner = CliRunner()
    by_set = runner.invoke(app, ["ingest", "csv", str(corpus), "--name", "x", "--home", home, "--set", "text_col=text",
                                 "--set", "user_col=user", "--set", "label_col=label", "--split", "users",
                                 "--split-seed", "7", "--set", "valid_fraction=0.2", "--test-fraction", "0.15"])
    assert by_set.exit_code == 0, by_set.output
    assert "x: 3 sentences" in by_set.stdout and "[users = column]" in by_set.stdout
    manifest = read_manifest(Path(home) / "datasets" / "x" / "sentences")
    assert manifest["key"] == CSV_INGEST_KEY  # the same ingest as the Python API's with the same options

    config = write(tmp_path / "ingest.yaml", "text_col: text\nuser_col: user\nlabel_col: label\nsplit: users\n"
                                            "split_seed: 7\nvalid_fraction: 0.2\ntest_fraction: 0.15\n")
    again = runner.invoke(app, ["ingest", "csv", str(corpus), "--name", "x", "--home", home, "--config", str(config)])
    assert again.exit_code == 0, again.output
    assert "reused the existing tables" in again.stdout

    flags = runner.invoke(app, ["ingest", "csv", str(corpus), "--name", "y", "--home", home, "--text-col", "text",
                                "--users", "chunk:2", "--split-of", f"{corpus}=train", "--config", str(config)])
    assert flags.exit_code == 0, flags.output  # flags override the file: users in chunks of 2, all of it train
    assert "y: 3 sentences (train 3), 2 users [users = chunk:2]" in flags.stdout
    options = read_manifest(Path(home) / "datasets" / "y" / "sentences")["source"]["options"]
    assert options["split_of"] == [["notes.csv", "train"]] and options["users"] == "chunk:2"

    bad = runner.invoke(app, ["ingest", "csv", str(corpus), "--name", "z", "--home", home, "--set", "text_column=text"])
    assert bad.exit_code == 2 and "error: invalid text_column" in bad.stderr
    missing = runner.invoke(app, ["ingest", "csv", str(corpus), "--name", "z", "--home", home])
    assert missing.exit_code == 2 and "error: format csv needs --text-col" in missing.stderr
    assert not (Path(home) / "datasets" / "z").exists()
    assert json.loads(json.dumps(manifest["source"]["options"])) == json.loads(
        json.dumps(IngestOptions(**CSV_OPTIONS).describe()))

    # a folder stands for its files of the format, sorted and named (issue 68, 5); the rest of it is left alone
    folder = tmp_path / "corpus"
    write(folder / "notes.csv", CSV_NOTES)
    write(folder / "SOURCE.txt", "where these notes came from\n")
    from_folder = runner.invoke(app, ["ingest", "csv", str(folder), "--name", "x", "--home", home, "--config",
                                      str(config)])
    assert from_folder.exit_code == 0, from_folder.output
    assert f"{folder}: 1 csv file(s): notes.csv" in from_folder.stdout
    assert "reused the existing tables" in from_folder.stdout  # the same input as naming the file
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = runner.invoke(app, ["ingest", "csv", str(empty), "--name", "w", "--home", home, "--config", str(config)])
    assert nothing.exit_code == 2 and f"error: {empty}: a folder with no csv files (*.csv)" in nothing.stderr
    assert not (Path(home) / "datasets" / "w").exists()


def test_every_module_that_registers_a_format_is_listed() -> None:
    """A format module missing from ``MODULES`` would be known only once something else imported it."""
    folder = Path(format_registry.__file__).parent
    registering = {path.stem for path in folder.glob("*.py")
                   if any(isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "register_format"
                          for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))}
    assert registering == set(format_registry.MODULES)


# --- every fix uedp suggests for too few users is one the command accepts for that dataset ------------------


def _suggested_ingests(text: str, own_format: str) -> list[dict[str, str]]:
    """The ingest options each clause of a suggestion names (``--users``, ``--user-col``, ``--format``)."""
    found = []
    for clause in re.split(r";|, or | or ", text):
        flags = dict(re.findall(r"--(format|users|user-col|text-col) ([\w:.-]+)", clause))
        if "user-col" in clause and "user-col" not in flags:
            flags["user-col"] = "writer"  # "--user-col names a writer column"
        if not flags.keys() & {"users", "user-col"}:
            continue
        named = re.search(r"uedp ingest (\w+)", clause)  # "convert it ... with `uedp ingest jsonl FILE ...`"
        target = named.group(1) if named else flags.get("format", own_format)
        options = {"format": target, "users": flags.get("users", "").replace("chunk:N", "chunk:5") or None,
                   "user_col": flags.get("user-col")}
        if target in ("jsonl", "csv"):
            options["text_col"] = flags.get("text-col", "text")
        found.append(options)
    return found


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_suggested_user_fix_is_accepted_for_its_format(name: str) -> None:
    """Issue 50 item 2: `--users chunk:N` was suggested for sec, whose users are fixed (its filers)."""
    from uedp.privacy.signal import NoiseToSignal
    from uedp.storage.formats.registry import user_fix
    from uedp.storage.ingest import IngestResult, UserStructure

    few = IngestResult("d", False, 10, 3, "k", {"train": 10}, UserStructure(3, "u1", 0.5), name)
    noisy = NoiseToSignal("userdp", noise_std=10.0, clip=1.0, units=5.0, rule="server-sgd")
    texts = [user_fix(name), few.user_warning or "", noisy.warning(user_fix(name)) or ""]
    assert all(user_fix(name) in text for text in texts)
    for text in texts:
        for options in _suggested_ingests(text, name):
            IngestOptions(**{k: v for k, v in options.items() if v is not None})  # raises if refused
    fixed = get_format(name).fixed_users
    assert ("--users chunk:N" in user_fix(name)) == (not fixed or "uedp ingest " in user_fix(name))


def test_a_fix_the_format_refuses_is_caught() -> None:
    """The check above can fail: `--users chunk:N` for sec is refused by the options model."""
    (options,) = _suggested_ingests("more users (or chunked pseudo-users: --users chunk:N at ingest)", "sec")
    with pytest.raises(UedpError, match="format sec has fixed users"):
        IngestOptions(**{k: v for k, v in options.items() if v is not None})


def test_ingest_checks_every_reading_option_before_the_flow_starts() -> None:
    """``uedp ingest`` validates the settings that are not the flow's own as reading options before Prefect is
    imported: the two lists must split the flow's form exactly."""
    from uedp.commands.data import INGEST_FLOW_FIELDS
    from uedp.flows.ingest import IngestConfig
    from uedp.storage.ingest import IngestOptions

    assert set(IngestConfig.model_fields) - set(IngestOptions.model_fields) == set(INGEST_FLOW_FIELDS)
