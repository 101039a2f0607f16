"""Pretraining task: a thin Prefect wrapper over :func:`uedp.services.pretrain.pretrain` that logs the base."""

from __future__ import annotations

from prefect import get_run_logger

from uedp.services.pretrain import Base, PretrainConfig, pretrain
from uedp.storage.home import DataHome
from uedp.tasks.retry import retried_task


@retried_task("pretrain-public-base")
def pretrain_task(home: DataHome, config: PretrainConfig) -> Base:
    """Build (or reuse) a public base; a retry resumes the pretraining from its checkpoint."""
    logger = get_run_logger()
    base = pretrain(home, config, say=logger.info, progress=False)
    logger.info("base %s (%s %s, %d parameters): run %s; start a private run with %s", base.key, base.model,
                base.size, base.parameters, base.run_id, " ".join(base.start_flags()))
    return base
