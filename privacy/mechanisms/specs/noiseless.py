"""``noiseless`` and ``deid`` as the registry lists them: no guarantee; deid trains on the redacted text
(:mod:`uedp.privacy.mechanisms.noiseless`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from uedp.privacy.mechanisms.params import NoiselessParams
from uedp.privacy.mechanisms.registry import AuditDesign, BuildContext, MechanismSpec, register
from uedp.privacy.statement import PrivacyUnit

if TYPE_CHECKING:
    from uedp.privacy.mechanisms.noiseless import Noiseless

NO_UNIT = PrivacyUnit("none", "none", "none")  # no guarantee: in no total


def _build(params: NoiselessParams, context: BuildContext) -> Noiseless:
    from uedp.privacy.mechanisms.noiseless import Noiseless

    return Noiseless(params, context.shape.seed)


register(MechanismSpec(
    name="noiseless", rank=0, summary="no privacy (epsilon = inf); the utility ceiling", params=NoiselessParams,
    unit=NoiselessParams.unit_words, guarantee="none", build=_build, audit=AuditDesign("sequence"), uses_categories=lambda p: False,
    privacy_unit=NO_UNIT,
))
register(MechanismSpec(
    name="deid", rank=1, summary="detected spans replaced by [CATEGORY] placeholders, then noiseless (epsilon = inf)",
    params=NoiselessParams, unit=NoiselessParams.unit_words, guarantee="none", build=_build, text="redacted",
    audit=AuditDesign("sequence"), privacy_unit=NO_UNIT,
))
