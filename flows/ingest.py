"""``uedp ingest``: corpus files into a dataset's Parquet sentence and user tables.

Input files may be local paths or fsspec URLs (``s3://raw/eng.train``); with a table store the tables
are published there for the machines that detect and train."""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, ConfigDict, Field

from uedp.storage.home import DataHome
from uedp.storage.ingest import FORMATS, IngestOptions, IngestResult, SplitByUser
from uedp.tasks.config import HOME_HELP
from uedp.tasks.ingest import ingest_task


class IngestConfig(BaseModel):
    """Parameters of the ingest flow; the Prefect UI renders these as a form."""

    model_config = ConfigDict(extra="forbid")

    home: str = Field("", description=HOME_HELP)
    dataset: str = Field(description="the dataset's name in the data home (a folder under datasets/)")
    format: str = Field(description=f"one of {', '.join(FORMATS)}")
    files: list[str] = Field(min_length=1, description="local paths (on the worker), fsspec URLs (s3://, gs://, "
                             "https://) or a corpus shipped with uedp (bundled:demo.conll)")
    split_of: dict[str, str] = Field(default_factory=dict, description="file name -> train | valid | test, for "
                                     "files whose names do not say which split they are")
    users: str | None = Field(None, description="source | chunk:N (ag_news, jsonl, csv); fixed for the others")
    text_col: str | None = Field(None, description="jsonl/csv: the column holding the text")
    user_col: str | None = Field(None, description="jsonl/csv: the column naming each record's writer (the privacy "
                                 "unit of user-level mechanisms)")
    label_col: str | None = Field(None, description="jsonl/csv: a class label column to keep (classification)")
    split_col: str | None = Field(None, description="jsonl/csv: a column holding train, valid or test")
    split: str = Field("auto", description="auto (files, else by user) | files | users")
    split_seed: int = Field(0, description="seed of the by-user split's hash")
    valid_fraction: float = Field(0.1, ge=0, lt=1, description="by-user split: share of users in valid")
    test_fraction: float = Field(0.1, ge=0, lt=1, description="by-user split: share of users in test")
    detokenize: bool = Field(False, description="wikitext: undo @-@ and the tokenised spacing of punctuation")
    sec_document_types: list[str] = Field(default_factory=list, description="sec raw submissions: document types "
                                          "to read (e.g. 10-K, EX-99.1); empty: the submission's own type")
    store: str | None = Field(None, description="fsspec URL of the shared table store (s3://bucket/uedp); "
                                                "empty: the data home only")

    def options(self) -> IngestOptions:
        return IngestOptions(
            format=self.format, users=self.users, text_col=self.text_col, user_col=self.user_col,
            label_col=self.label_col, split_col=self.split_col, split=self.split,  # type: ignore[arg-type]
            split_by_user=SplitByUser(self.split_seed, self.valid_fraction, self.test_fraction),
            detokenize=self.detokenize, sec_document_types=tuple(self.sec_document_types),
            split_of=tuple(sorted(self.split_of.items())),
        )


@flow(name="uedp-ingest")
def ingest_flow(config: IngestConfig, progress: bool = False) -> IngestResult:
    """Read corpus files into a dataset's sentences and users tables (reused when unchanged).

    Args:
        config: the files, their format, who the users are and how the splits are made.
        progress: report progress on stderr (the worker's log), besides the flow run's log.
    """
    return ingest_task(DataHome.from_env(config.home or None), config.dataset, config.files, config.options(), progress,
                       config.store)
