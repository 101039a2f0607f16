"""Issue 47, items 1-3: a start whose weights saw the text a run protects is refused, however it is named.

Real runs chained through the real CLI (tiny GPT-2s, the real MLflow store, a real local-DP release),
with the demo corpus cut into a "private" text and a "public" one that share no sentence. Every test here
failed on main before the fix (58668b1): the folder, the release and the re-ingested copy were accepted
and stated as public text.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from uedp.commands import app
from uedp.models.checkpoints import INIT_RUN_FILE
from uedp.services.initial_model import init_folder
from uedp.services.lineage import START_LINEAGE_TAG, TEXT_LINEAGE_TAG, text_lineage
from uedp.storage.ingest import IngestOptions, ingest

from support import demo_halves, demo_vectors, write

runner = CliRunner()
SMALL = ["--steps", "2", "--batch-size", "8", "--threads", "1", "--checkpoint-every", "0"]
REFUSED = "that model's weights were trained on the text this run protects"


@pytest.fixture
def texts(home, tmp_path: Path) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    private, public = demo_halves(tmp_path)
    ingest(home, "private", [private], IngestOptions(format="conll2003"))
    ingest(home, "pub", [public], IngestOptions(format="conll2003", split="users", split_seed=1))
    return "private", "pub"


def train(home, dataset: str, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["train", dataset, "--home", str(home.root), *SMALL, *args])


def run_id(result) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code == 0, result.output
    found = re.search(r"MLflow run: ([0-9a-f]{32})", result.output)
    assert found, result.output
    return found.group(1)


def refused(result, named: str) -> None:  # type: ignore[no-untyped-def]
    assert result.exit_code == 2, result.output
    message = result.stderr.replace("\n", " ")
    assert REFUSED in message and named in message, message


def test_a_runs_model_folder_is_checked_as_the_run_by_every_flag_and_its_lineage_is_inherited(
        home, texts: tuple[str, str], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Item 1: noiseless on private (R1) -> noiseless on pub from R1's folder (R2) -> dpsgd on private from R2.
    On main, R2 recorded an empty lineage and the last run called R2's start public text."""
    private, pub = texts
    r1 = run_id(train(home, private, "--mechanism", "noiseless", "--log-model"))
    folder = init_folder(home, r1)  # <home>/init/R1, as --init-from R1 downloads it (init_run.json beside it)
    assert json.loads((folder / INIT_RUN_FILE).read_text())["lineage"]

    for flags in (["--model", str(folder)], ["--model", "gpt2", "--model-config", str(folder)],
                  ["--init-from", str(folder)], ["--init-from", r1]):
        refused(train(home, private, "--mechanism", "dpsgd", "--noise-multiplier", "1", *flags), r1)

    # Another text may start from it; the run it makes inherits its lineage, and its start is named as R1's model
    r2 = run_id(train(home, pub, "--mechanism", "noiseless", "--model", str(folder), "--log-model"))
    tags = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(r2).data.tags
    assert set(text_lineage(home, private)) <= set(tags[START_LINEAGE_TAG].split(","))
    assert tags[TEXT_LINEAGE_TAG] == ",".join(text_lineage(home, pub))
    refused(train(home, private, "--mechanism", "dpsgd", "--noise-multiplier", "1", "--init-from", r2), r2)
    # ... while pub's own text is not in R1's lineage: a run on pub from R2 would be refused, one on private from
    # a model trained on pub alone is not
    r3 = run_id(train(home, pub, "--mechanism", "noiseless", "--log-model"))
    started = train(home, private, "--mechanism", "dpsgd", "--noise-multiplier", "1", "--init-from", r3)
    assert started.exit_code == 0 and f"run {r3} (noiseless on dataset 'pub'" in started.output, started.output


def test_a_copy_of_a_runs_model_without_its_marker_is_known_by_its_files(
        home, texts: tuple[str, str], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The model MLflow stores carries the marker; a copy that lost it is known by the data home's record of
    its files' content hash."""
    private, _ = texts
    r1 = run_id(train(home, private, "--mechanism", "noiseless", "--log-model"))
    client = MlflowClient(tracking_uri=home.mlflow_tracking_uri)
    copy = Path(client.download_artifacts(r1, "model", str(tmp_path / "download")))
    assert json.loads((copy / INIT_RUN_FILE).read_text())["run_id"] == r1  # the logged model names its run
    refused(train(home, private, "--mechanism", "dpsgd", "--noise-multiplier", "1", "--model", str(copy)), r1)
    stripped = tmp_path / "stripped"
    shutil.copytree(copy, stripped)
    (stripped / INIT_RUN_FILE).unlink()
    refused(train(home, private, "--mechanism", "dpsgd", "--noise-multiplier", "1", "--model", str(stripped)), r1)


@pytest.fixture
def vectors(tmp_path: Path) -> Path:
    return demo_vectors(tmp_path / "vectors.txt")


def test_a_local_dp_release_of_the_text_is_no_public_start(home, texts: tuple[str, str], vectors: Path) -> None:  # type: ignore[no-untyped-def]
    """Item 2: `--keep non-entities` copies every other token verbatim; a model trained on the release is refused
    as a start for its source (on main it was named "public")."""
    private, _ = texts
    assert runner.invoke(app, ["detect", private, "--home", str(home.root), "--detector", "gold"]).exit_code == 0
    sanitized = runner.invoke(app, ["sanitize", private, "--home", str(home.root), "--keep", "non-entities",
                                    "--categories", "PER", "--embeddings", str(vectors), "--k", "5", "--epsilon", "1",
                                    "--output", "release"])
    assert sanitized.exit_code == 0, sanitized.output
    release = "release"
    assert (home.dataset_dir(release) / "sentences").is_dir(), sanitized.output
    assert text_lineage(home, private)[0] in text_lineage(home, release)  # the release's lineage holds its source
    on_release = run_id(train(home, release, "--mechanism", "noiseless", "--log-model"))
    refused(train(home, private, "--mechanism", "dpsgd", "--noise-multiplier", "1", "--init-from", on_release),
            on_release)


def test_the_same_text_ingested_again_under_another_name_and_split_is_the_same_text(
        home, texts: tuple[str, str], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Item 3: the dataset id hashes the ingest options; lineage is keyed by the sentences' text."""
    private, pub = texts
    again = runner.invoke(app, ["ingest", "conll2003", str(tmp_path / "private.conll"), "--name", "again",
                                "--home", str(home.root), "--split", "users", "--split-seed", "7"])
    assert again.exit_code == 0, again.output
    assert text_lineage(home, "again") == text_lineage(home, private) != text_lineage(home, pub)
    on_copy = run_id(train(home, "again", "--mechanism", "noiseless", "--log-model"))
    refused(train(home, private, "--mechanism", "dpsgd", "--noise-multiplier", "1", "--init-from", on_copy), on_copy)
    # one changed character is another text
    changed = write(tmp_path / "changed.conll", (tmp_path / "private.conll").read_text().replace("reach", "raech", 1))
    ingest(home, "changed", [changed], IngestOptions(format="conll2003"))
    assert text_lineage(home, "changed") != text_lineage(home, private)
