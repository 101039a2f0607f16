"""A configuration already trained to the end, found again: what lets a sweep or a results page stopped
halfway continue where it stopped instead of training everything again (``SweepConfig.reuse_finished``).

A finished run stands for a configuration when everything its training read is the same now: the
configuration's fingerprint (every setting that shapes training; not the device or the threads), its run
name (the label and grid values a report shows; or the shorter name an older uedp gave it), the dataset's sentences and entities (their keyed content
ids, so re-ingesting or re-detecting with other categories trains again) and the files it started from
(their keyed content id, so a rebuilt base trains again). Reusing one releases nothing new: the run's
model and figures were released, and its privacy charged, when it trained.
"""

from __future__ import annotations

from uedp.errors import UedpError
from uedp.services.config import TrainConfig
from uedp.services.initial_model import resolve_start
from uedp.services.lineage import DATASET_ID_TAG, ENTITIES_ID_TAG, START_ID_TAG, keyed_table_id, start_id
from uedp.services.report import outcome_of_run
from uedp.services.tracking import RunTracker, tracking_uri
from uedp.services.training import TrainResult
from uedp.storage.home import DataHome

FINGERPRINT_TAG = "uedp.config_fingerprint"


def identity_tags(home: DataHome, config: TrainConfig) -> dict[str, str]:
    """The tags a run of ``config`` on this home's current data carries and a reusable run must carry too."""
    start = resolve_start(home, config)
    return {FINGERPRINT_TAG: config.fingerprint(),
            DATASET_ID_TAG: keyed_table_id(home, config.dataset, "sentences"),
            ENTITIES_ID_TAG: keyed_table_id(home, config.dataset, "entities"),
            START_ID_TAG: start_id(home, start.content_hash)}


def finished_result(home: DataHome, config: TrainConfig) -> TrainResult | None:
    """The result of the latest finished run of exactly ``config`` on this home's current data and start,
    read back from MLflow as the sweep saw it; None when there is none (a run of an older uedp, without
    these tags, is never taken for one)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri(home))
    experiment = client.get_experiment_by_name(config.dataset)
    if experiment is None:
        return None
    # Its name now, and the name uedp gave it before names carried a non-default length (the same
    # configuration by its fingerprint: a page stopped before that change continues where it stopped).
    names = [f"attributes.status = 'FINISHED' and attributes.run_name = '{name}'"
             for name in dict.fromkeys([config.run_name(), config.run_name(with_length=False)])]
    names = [named for named in names if client.search_runs([experiment.experiment_id], filter_string=named,
                                                            max_results=1)]
    if not names:
        return None  # nothing of that name finished: the start's files need no hashing
    try:
        wanted = identity_tags(home, config)
    except UedpError:  # a start training would refuse: it refuses it, with its own words
        return None
    for named in names:
        query = " and ".join([*(f"tags.`{k}` = '{v}'" for k, v in wanted.items()), named])
        for run in client.search_runs([experiment.experiment_id], filter_string=query,
                                      order_by=["attributes.start_time DESC"], max_results=5):
            outcome = outcome_of_run(RunTracker.attach(home, run.info.run_id))
            if outcome is not None:
                return outcome[0]
    return None
