"""``uedp pretrain`` as a flow: a public base model (BPE vocabulary and noiseless pretraining on a public
corpus), built once and reused by content key, to be scheduled from the Prefect UI like the others."""

from __future__ import annotations

from prefect import flow

from uedp.services.pretrain import Base, PretrainConfig
from uedp.storage.home import DataHome
from uedp.tasks.pretrain import pretrain_task


@flow(name="uedp-pretrain")
def pretrain_flow(config: PretrainConfig) -> Base:
    """Ingest a public corpus, learn its BPE vocabulary and pretrain a base model on it (reused when unchanged).

    Args:
        config: the public corpus, the model and its pretraining settings.
    """
    return pretrain_task(DataHome.from_env(config.home or None), config)
