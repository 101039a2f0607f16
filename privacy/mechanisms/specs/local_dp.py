"""``custext`` and ``santext`` as the registry lists them: the train split is first released under local DP
(:mod:`uedp.privacy.sanitization`), then trained noiselessly (:mod:`uedp.privacy.mechanisms.local_dp`); the
guarantee is the release's (post-processing), and the training itself adds nothing to it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from uedp.privacy.mechanisms.params import LocalDpParams
from uedp.privacy.mechanisms.registry import BuildContext, MechanismSpec, RunShape, register
from uedp.privacy.sanitization.choices import LOCAL_DP_FACTS
from uedp.privacy.statement import PrivacyUnit

if TYPE_CHECKING:
    from uedp.privacy.mechanisms.noiseless import Noiseless


def _build(params: LocalDpParams, context: BuildContext) -> Noiseless:
    from uedp.privacy.mechanisms.local_dp import noiseless_after_release

    return noiseless_after_release(params, context.shape.seed)


def _check(params: LocalDpParams, shape: RunShape) -> None:
    if shape.canaries:
        raise ValueError("canaries are planted in the training text after sanitization would have run; they are not "
                         "supported with custext/santext yet")


_SUMMARIES = {
    "custext": "local DP: each train token replaced by the exponential mechanism over its K-token output set "
               "(CusText), then noiseless",
    "santext": "local DP: each train token replaced by the exponential mechanism over the vocabulary (SanText), "
               "then noiseless",
}

# CusText's and SanText's per-token epsilons both bound replacing a sanitized token by another of its CusText
# input set (SanText's, as local DP over the whole vocabulary, bounds any replacement): a token both sanitized
# is exposed by both, so their releases compose into one total.
LOCAL_TOKEN = PrivacyUnit("local", "token-value", "one sanitized token's value (local DP: replaced by another "
                          "token, within its input set for CusText, any vocabulary token for SanText)")

for _rank, (_name, _facts) in enumerate(LOCAL_DP_FACTS.items()):
    register(MechanismSpec(
        name=_name, rank=50 + _rank, summary=_SUMMARIES[_name], params=LocalDpParams, unit=_facts.unit,
        guarantee="local",
        build=_build, text="sanitized", check=_check, privacy_unit=LOCAL_TOKEN,
        audit="canaries would have to be planted before the local-DP release, which is made once per dataset "
              "and reused (not supported yet)",
        # Categories matter only when the release sanitizes the detected entities alone.
        uses_categories=lambda p: p.keep == "non-entities",
    ))
