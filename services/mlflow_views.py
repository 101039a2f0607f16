"""What MLflow's own views show for a run: its model under "Logged models" and its tables under "Datasets".

MLflow 3 lists a run's models from its *logged models* and its inputs from *dataset inputs*; artifacts
alone leave both empty. Both entries here are made of what the run already releases, so they add nothing an
adversary could not read from the run (docs/PRIVACY.md, rule 4):

* **the logged model** is an MLflow *external* model: its weights stay where uedp logs them, in the run's
  ``model`` artifact folder (named in its ``uedp.weights`` tag, so they are stored once, however large),
  and its tags carry the run's privacy statement (unit, epsilon, delta, accountant, randomness, what is
  public, the caveats). It holds an ``MLmodel`` file, so it can be registered in the model registry;
* **a dataset input** names a Parquet table of the data home: its source is the table's folder, its
  digest the keyed content id the run's tags already carry (an HMAC under the home's secret: an unkeyed
  hash of the table would let anyone who can guess the corpus test it), its schema the columns the code
  writes, and its profile no count of anything (a row count is a count of private text).
"""

from __future__ import annotations

import json
import math
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from uedp.privacy.statement import PrivacyStatement
from uedp.services.tracking import RunTracker

WEIGHTS_TAG = "uedp.weights"  # where the logged model's files are: runs:/<run id>/model
MODEL_TYPE = "uedp-language-model"
# MLflow refuses these in a logged model's name (a run name may hold them: dpsgd-eps0.5-s0).
NOT_IN_MODEL_NAMES = re.compile(r"[/:.%\"']")
NO_COUNTS = "no row, user or entity counts: they count private text (docs/PRIVACY.md, rule 4)"
# Arrow's type names as MLflow's column specs name them (the UI shows the schema from these).
_MLFLOW_TYPES = {"string": "string", "large_string": "string", "int64": "long", "int32": "integer",
                 "int16": "integer", "int8": "integer", "double": "double", "float": "float", "bool": "boolean",
                 "binary": "binary"}


@dataclass(frozen=True)
class TableInput:
    """One Parquet table a run reads, as MLflow's "Datasets" view lists it."""

    dataset: str
    table: str  # sentences, entities
    folder: Path
    keyed_id: str  # the table's keyed content id (services.lineage), already among the run's tags
    columns: tuple[tuple[str, str], ...]  # (name, Arrow type), from the Parquet footer
    context: str = "training"  # MLflow's mlflow.data.context tag


def _unrecorded(what: str, tracker: RunTracker, exc: Exception) -> None:
    """These views are a convenience over what the run already logged: a tracking server that cannot hold
    them (an MLflow 2 server has no logged models) costs the views, never a finished training."""
    print(f"warning: MLflow at {tracker.client.tracking_uri} did not record the run's {what} "
          f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); the run and its artifacts are "
          "logged as usual", file=sys.stderr)


def log_table_inputs(tracker: RunTracker, tables: list[TableInput]) -> None:
    """List the run's tables under its "Datasets" (MLflow dataset inputs)."""
    from mlflow.exceptions import MlflowException

    try:
        _log_table_inputs(tracker, tables)
    except MlflowException as exc:
        _unrecorded("dataset inputs", tracker, exc)


def _log_table_inputs(tracker: RunTracker, tables: list[TableInput]) -> None:
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    inputs = []
    for table in tables:
        schema = {"mlflow_colspec": [{"name": name, "type": _MLFLOW_TYPES.get(kind, kind), "required": True}
                                     for name, kind in table.columns]}
        profile = {"table": table.table, "format": "parquet", "counts": NO_COUNTS}
        dataset = Dataset(name=f"{table.dataset}/{table.table}", digest=table.keyed_id or "unkeyed",
                          source_type="local", source=json.dumps({"uri": table.folder.resolve().as_uri()}),
                          schema=json.dumps(schema), profile=json.dumps(profile))
        inputs.append(DatasetInput(dataset, [InputTag(MLFLOW_DATASET_CONTEXT, table.context)]))
    if inputs:
        tracker.client.log_inputs(tracker.run_id, datasets=inputs)


def statement_words(statement: PrivacyStatement) -> dict[str, str]:
    """The statement's figures and lists in the words every MLflow view of the run uses: the run's
    ``epsilon_reported`` / ``privacy_public`` / ``privacy_caveats`` parameters and its logged model's tags."""
    return {"epsilon": "inf" if math.isinf(statement.epsilon) else f"{statement.epsilon:.6g}",
            "public": " | ".join(statement.public) or "none", "caveats": " | ".join(statement.caveats) or "none"}


def statement_tags(statement: PrivacyStatement) -> dict[str, str]:
    """The run's privacy statement as a logged model's tags: the same words as the run's parameters."""
    words = statement_words(statement)
    return {"uedp.mechanism": statement.mechanism, "uedp.privacy_unit": statement.unit,
            "uedp.epsilon": words["epsilon"], "uedp.delta": f"{statement.delta:.3g}",
            "uedp.accountant": statement.accountant, "uedp.randomness": statement.randomness,
            "uedp.privacy_public": words["public"], "uedp.privacy_caveats": words["caveats"],
            "uedp.privacy_statement": "docs/PRIVACY.md"}


def model_name(run_name: str) -> str:
    """The run's name as MLflow accepts a logged model's: ``dpsgd-eps0.5-s0`` -> ``dpsgd-eps0_5-s0``."""
    return NOT_IN_MODEL_NAMES.sub("_", run_name)


def log_model_entry(tracker: RunTracker, name: str, statement: PrivacyStatement, params: dict[str, str],
                    step: int) -> str | None:
    """Record the run's logged ``model`` artifact folder as an MLflow logged model, output of the run at
    ``step``, with the privacy statement in its tags; returns its model id (``models:/<id>`` registers it),
    or None when the tracking server cannot hold one (said on stderr)."""
    from mlflow.exceptions import MlflowException

    try:
        return _log_model_entry(tracker, name, statement, params, step)
    except MlflowException as exc:
        _unrecorded("logged model", tracker, exc)
        return None


def _log_model_entry(tracker: RunTracker, name: str, statement: PrivacyStatement, params: dict[str, str],
                     step: int) -> str:
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus
    from mlflow.models.model import MLMODEL_FILE_NAME
    from mlflow.models.utils import get_external_mlflow_model_spec
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_IS_EXTERNAL

    client, run_id = tracker.client, tracker.run_id
    experiment_id = client.get_run(run_id).info.experiment_id
    model = client.create_logged_model(
        experiment_id, name=model_name(name), source_run_id=run_id, model_type=MODEL_TYPE, params=params,
        tags={MLFLOW_MODEL_IS_EXTERNAL: "true", WEIGHTS_TAG: f"runs:/{run_id}/model", **statement_tags(statement)})
    with tempfile.TemporaryDirectory() as tmp:  # the MLmodel file the model registry asks for
        get_external_mlflow_model_spec(model).save(str(Path(tmp) / MLMODEL_FILE_NAME))
        client.log_model_artifacts(model.model_id, tmp)
    client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step)])
    return str(model.model_id)
