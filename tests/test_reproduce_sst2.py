"""``uedp reproduce sanitize-sst2``: the ci scale on small generated files in SST-2's own format (GLUE's
TSV: a header, then one sentence and its label per line), through the real ingest and sweep flows, MLflow
store and Parquet tables; its ci claims must hold and the page must be whole. The sentences are built
from positive and negative word lists, so a classifier has a signal to learn in a few steps.

Also the TSV reading the page relies on (the ``csv`` format reads ``.tsv`` files), with its errors
naming the file and line, and the word tokenizer built from public text.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path

import pytest

from uedp.errors import UedpError
from uedp.experiments.common import Context
from uedp.experiments.reproduce import reproduce, rerender
from uedp.experiments.sanitize_sst2 import SCALES, inputs, read_sentences, read_sst2, word_tokenizer
from uedp.storage.formats import FormatError
from uedp.storage.formats.tabular import is_tsv, read_tsv_rows, tsv_records
from uedp.storage.ingest import IngestOptions, ingest
from uedp.storage.tables import read_table

POSITIVE = ["great", "wonderful", "moving", "funny", "brilliant", "charming", "superb", "delightful", "touching",
            "gripping", "clever", "beautiful"]
NEGATIVE = ["dull", "boring", "awful", "tedious", "clumsy", "bland", "terrible", "lifeless", "stale", "messy",
            "pointless", "ugly"]
SUBJECTS = ["the film", "this movie", "the story", "the cast", "the script", "the director 's work", "it",
            "the plot", "the ending", "the whole thing"]
LINKS = ["is", "feels", "seems", "remains", "turns out"]


def sentences(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` SST-2-like lower-case sentences, each with two words of its polarity, and their labels."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.randrange(2)
        words = POSITIVE if label else NEGATIVE
        first, second = rng.sample(words, 2)
        out.append((f"{rng.choice(SUBJECTS)} {rng.choice(LINKS)} {first} and {second} .", str(label)))
    return out


def write_sst2(folder: Path) -> Path:
    """A corpus folder as GLUE ships SST-2: train.tsv (``sentence<TAB>label``), dev.tsv in the other
    column order with ``content`` (as some copies have it), and GLUE's unlabelled test.tsv."""
    folder.mkdir(parents=True, exist_ok=True)
    train, dev, test = sentences(400, 1), sentences(120, 2), sentences(300, 3)
    (folder / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in train), encoding="utf-8")
    (folder / "dev.tsv").write_text("label\tcontent\n" + "".join(f"{y}\t{s}\n" for s, y in dev), encoding="utf-8")
    (folder / "test.tsv").write_text("index\tsentence\n" + "".join(f"{i}\t{s}\n" for i, (s, _) in enumerate(test)),
                                     encoding="utf-8")
    return folder


@pytest.mark.slow
def test_ci_scale_runs_the_experiment_and_its_claims_hold(home, prefect_server, tmp_path: Path) -> None:
    corpus = write_sst2(tmp_path / "sst2")
    out = tmp_path / "page"
    lines: list[str] = []
    page = reproduce("sanitize-sst2", "ci", home, corpus, out, say=lines.append)
    assert page.verdicts, "a page without claims checks nothing"
    failed = [f"{v.statement}: {v.ours}" for v in page.verdicts if not v.holds]
    assert not failed, f"sanitize-sst2 at the ci scale: claims that do not hold: {failed}"
    files = {p.name for p in out.iterdir()}
    assert {"README.md", "results.json", "sanitize_sst2.png"} <= files
    assert (out / "sanitize_sst2.png").stat().st_size > 10_000  # a drawn figure, not an empty canvas
    text = (out / "README.md").read_text(encoding="utf-8")
    assert "uedp reproduce sanitize-sst2" in text and "ci scale" in text and "minutes" in text
    assert "## The seeds' claims, checked" in text and "Cannot be checked here" in text
    assert "83.83" in text and "91.63" in text  # the thesis' own figures beside ours
    assert "Privacy unit: one token of one row" in text and "label of each train row" in text
    assert "Per writer: larger, and not counted here" in text and "All releases together" in text
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    runs = data["runs"]
    assert {(r["label"], r["target"]) for r in runs} == {("noiseless", None), *((m, e) for m in ("custext", "santext")
                                                                                 for e in SCALES["ci"].epsilons)}
    assert all(r["run_id"] and 0.0 <= r["extra"]["accuracy"] <= 1.0 for r in runs)
    for r in runs:
        assert math.isclose(r["extra"]["accuracy"], 1.0 - r["perplexity"])  # the sweep's utility is the error
        if r["label"] == "custext":  # the accounted per-token epsilon is the one set
            assert r["epsilon"] == pytest.approx(r["target"]) and r["extra"]["epsilon_record_median"] >= r["epsilon"]
        if r["label"] == "santext":  # metric DP: times the vocabulary's diameter (unit vectors: at most 2)
            assert r["target"] < r["epsilon"] <= 2.0 * r["target"] + 1e-6
    from mlflow.tracking import MlflowClient

    from uedp.services.sanitize import LABELS_CAVEAT
    from uedp.services.tracking import tracking_uri

    client = MlflowClient(tracking_uri=tracking_uri(home))
    for r in runs:  # a classifier trained on a release of labelled rows says its labels are outside the guarantee
        caveats = client.get_run(r["run_id"]).data.params["privacy_caveats"]
        assert (LABELS_CAVEAT in caveats) == (r["label"] != "noiseless"), (r["label"], caveats)
    figures = data["figures"]
    assert figures["public_source"].startswith("GLUE's test.tsv") and figures["train_sentences"] == 400
    assert figures["majority_accuracy"] == pytest.approx(max(label_counts(corpus / "dev.tsv")) / 120)
    assert figures["vocabulary_coverage"] == pytest.approx(1.0)  # the public sentences use the same word lists
    again = rerender("sanitize-sst2", home, out)  # --page-only: the same page from results.json, no training
    assert [v.holds for v in again.verdicts] == [v.holds for v in page.verdicts]
    assert "re-rendered from `results.json`" in (out / "README.md").read_text(encoding="utf-8")


def label_counts(path: Path) -> list[int]:
    """How many dev sentences are negative and positive (the dev file puts the label first)."""
    labels = [line.split("\t")[0] for line in path.read_text(encoding="utf-8").splitlines()[1:]]
    return [labels.count("0"), labels.count("1")]


def test_the_corpus_folder_must_hold_train_and_dev(home, tmp_path: Path) -> None:
    folder = tmp_path / "sst2"
    folder.mkdir()
    (folder / "train.tsv").write_text("sentence\tlabel\ngood .\t1\n", encoding="utf-8")
    ctx = Context("sanitize-sst2", "ci", home, folder)
    with pytest.raises(UedpError, match=r"no dev\.tsv; give --sst2-dir .*never downloads"):
        inputs(ctx, SCALES["ci"])


def test_the_normalized_copies_and_the_public_text(home, tmp_path: Path) -> None:
    """Whatever the source's column names and order, the ingested copies are ``sentence<TAB>label``; the
    public text is test.tsv's sentences (its labels never read), else dev.tsv's, and the page says which."""
    corpus = write_sst2(tmp_path / "sst2")
    ctx = Context("sanitize-sst2", "ci", home, corpus)
    data = inputs(ctx, SCALES["ci"])
    assert [p.name for p in data.files] == ["train.tsv", "dev.tsv"]
    assert all(p.read_text(encoding="utf-8").startswith("sentence\tlabel\n") for p in data.files)
    assert data.dev[0] == tuple(reversed(
        (corpus / "dev.tsv").read_text(encoding="utf-8").splitlines()[1].split("\t")))
    assert data.public == [line.split("\t")[1] for line in
                           (corpus / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    (corpus / "test.tsv").unlink()
    fallback = inputs(ctx, SCALES["ci"])
    assert fallback.public == [s for s, _ in fallback.dev] and fallback.public_source.startswith("dev.tsv")


def test_tsv_files_read_through_the_csv_format_one_row_per_line(home, tmp_path: Path) -> None:
    """Tab-separated, no quoting: a quote is text (GLUE's files are not quoted), and a file ingests with
    its labels; the name says it is TSV, compressed or not."""
    path = tmp_path / "train.tsv"
    path.write_text('label\tsentence\n1\t"a quote opens here\n0\tand the next line is its own row .\n\n1\tfine .\n',
                    encoding="utf-8")
    records = list(tsv_records(path, "sentence", label_col="label"))
    assert [(r.text, r.label, r.line) for r in records] == [('"a quote opens here', "1", 2),
                                                            ("and the next line is its own row .", "0", 3),
                                                            ("fine .", "1", 5)]
    packed = tmp_path / "dev.tsv.gz"
    packed.write_bytes(gzip.compress(b"\xef\xbb\xbfsentence\tlabel\r\ngood .\t1\r\n"))
    assert is_tsv(packed) and not is_tsv(tmp_path / "train.csv")
    assert list(read_tsv_rows(packed)) == [(1, ["sentence", "label"]), (2, ["good .", "1"])]
    result = ingest(home, "tsv", [path, packed], IngestOptions(format="csv", text_col="sentence", label_col="label",
                                                              users="chunk:1"))
    assert result.per_split == {"train": 3, "valid": 1, "test": 0}
    table = read_table(home.table_dir("tsv", "sentences")).to_pylist()
    assert table[0]["text"] == '"a quote opens here' and len({row["user_id"] for row in table}) == 4


def test_a_bad_tsv_line_is_named_by_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\ngood .\t1\ntoo\tmany\tfields\n", encoding="utf-8")
    with pytest.raises(FormatError, match=r"train\.tsv:3: expected 2 tab-separated columns like the header, got 3"):
        list(tsv_records(path, "sentence", label_col="label"))
    path.write_bytes(b"sentence\tlabel\ngood .\t1\nbad \xff byte\t0\n")
    with pytest.raises(FormatError, match=r"train\.tsv:3: invalid UTF-8"):
        list(tsv_records(path, "sentence", label_col="label"))
    path.write_text("sentence\tlabel\ngood .\t1\nodd .\tpositive\n", encoding="utf-8")
    with pytest.raises(FormatError, match=r"train\.tsv:3: label 'positive'"):
        read_sst2(path)
    path.write_text("words\tlabel\ngood .\t1\n", encoding="utf-8")
    with pytest.raises(FormatError, match=r"train\.tsv:1: no sentence column in the header \(words, label\)"):
        read_sst2(path)
    path.write_text("sentence\tpolarity\ngood .\t1\n", encoding="utf-8")
    with pytest.raises(FormatError, match=r"train\.tsv:1: no label column"):
        read_sst2(path)
    path.write_text("", encoding="utf-8")
    with pytest.raises(FormatError, match=r"train\.tsv: empty file"):
        read_sentences(path)


def test_the_word_tokenizer_knows_only_the_public_words(tmp_path: Path) -> None:
    from uedp.models.tokenization import load_tokenizer

    folder = word_tokenizer(["the", "film", "is", "great", "'", "s", ".", "well-made"], tmp_path / "tok")
    tokenizer = load_tokenizer(str(folder))
    pieces = tokenizer.convert_ids_to_tokens(tokenizer("The film 's <unk> GREAT, well-made secret .")["input_ids"])
    assert pieces == ["the", "film", "'", "s", "<unk>", "great", "<unk>", "well-made", "<unk>", "."]
    assert tokenizer.pad_token == tokenizer.eos_token and len(tokenizer) == 10
