"""The step before training that draws what a configuration trains on but does not read as it is: its
local-DP release (custext, santext). The one function that draws a training's release, before any
process trains: the launch (:func:`services.launch.run_training`) and a search's trials
(:mod:`services.tune`) call it, so it is the one way a training's release is charged to the dataset's
privacy ledger (:mod:`services.sanitize` files the draw); set-up then opens it by name
(:func:`services.releases.open_release`) in every process.
"""

from __future__ import annotations

from uedp.services.config import TrainConfig
from uedp.services.releases import SanitizeResult, sanitize_config
from uedp.services.sanitize import sanitize_dataset
from uedp.storage.home import DataHome
from uedp.storage.remote import TableStore

RELEASE_TABLES = ("sentences", "users", "entities")


def draw_inputs(home: DataHome, config: TrainConfig, store: TableStore | None = None) -> SanitizeResult | None:
    """Draw (or reuse) the release a configuration trains on; None for a configuration that trains on its
    dataset as it is. Drawn once across machines: with a table store, the store's release if it has one
    (pulled), else one drawn here and pushed, so a training on another machine reuses it instead of
    drawing its own (two draws of the same text would compose). Two machines that draw the same release
    at the same moment still draw twice: sanitize first (`uedp sanitize`, or one training) where
    trainings of a release run side by side."""
    if config.spec.text != "sanitized":
        return None
    settings = sanitize_config(config)
    if store:
        for table in RELEASE_TABLES:
            store.pull(home, settings.output_name, table)
    release = sanitize_dataset(home, settings)
    if store and not release.reused:
        for table in RELEASE_TABLES:
            store.push(home, settings.output_name, table)  # data and manifest only: the draws stay in this home
    return release
