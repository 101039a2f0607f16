"""``custext`` and ``santext`` as trainable mechanisms: the train split is first released under local DP
(:mod:`privacy.sanitization`), then trained noiselessly; the guarantee is the release's (post-processing),
and the training itself adds nothing to it. The registry lists them from :mod:`.specs.local_dp`."""

from __future__ import annotations

from uedp.privacy.mechanisms.noiseless import Noiseless
from uedp.privacy.mechanisms.params import LocalDpParams, NoiselessParams


def noiseless_after_release(params: LocalDpParams, seed: int) -> Noiseless:
    """The training on a local-DP release: noiseless, named for the release's mechanism."""
    trainer = Noiseless(NoiselessParams(steps=params.steps, batch_size=params.batch_size, lr=params.lr), seed)
    trainer.name = params.mechanism
    return trainer
