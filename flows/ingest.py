"""``uedp ingest``: corpus files into a dataset's Parquet sentence and user tables.

Input files may be local paths or fsspec URLs (``s3://raw/eng.train``); with a table store the tables
are published there for the machines that detect and train."""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, ConfigDict, Field, field_validator

from uedp.services.config import HOME_HELP
from uedp.storage.home import DataHome, validate_dataset_name
from uedp.storage.ingest import IngestOptions, IngestResult
from uedp.tasks.ingest import ingest_task


class _Inputs(BaseModel):
    """Where the corpus is and which dataset it becomes (first in the form; the settings follow)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    home: str = Field("", description=HOME_HELP)
    dataset: str = Field(description="the dataset's name in the data home (a folder under datasets/)")
    files: list[str] = Field(min_length=1, description="local paths (on the worker), fsspec URLs (s3://, gs://, "
                             "https://) or a corpus shipped with uedp (bundled:demo.conll)")

    @field_validator("dataset")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        return validate_dataset_name(name)


class IngestConfig(IngestOptions, _Inputs):
    """Parameters of the ingest flow; the Prefect UI renders these as a form. The reading settings are
    :class:`IngestOptions`' own fields (declared there once, with their checks)."""

    store: str | None = Field(None, description="fsspec URL of the shared table store (s3://bucket/uedp); "
                                                "empty: the data home only")
    public: str | None = Field(None, description="why this text is public (its source: 'Reuters-21578, public 1987 "
                               "news'), to declare the dataset public: its runs are charged to no privacy ledger "
                               "(a search's proxy, a pretraining corpus). Empty: private")

    def options(self) -> IngestOptions:
        return IngestOptions.model_validate(self.model_dump(include=set(IngestOptions.model_fields)))


@flow(name="uedp-ingest")
def ingest_flow(config: IngestConfig, progress: bool = False) -> IngestResult:
    """Read corpus files into a dataset's sentences and users tables (reused when unchanged).

    Args:
        config: the files, their format, who the users are and how the splits are made.
        progress: report progress on stderr (the worker's log), besides the flow run's log.
    """
    return ingest_task(DataHome.from_env(config.home or None), config.dataset, config.files, config.options(), progress,
                       config.store, config.public or None)
