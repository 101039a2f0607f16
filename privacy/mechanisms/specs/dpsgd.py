"""``dpsgd`` as the registry lists it: example-level DP-SGD, one training sequence the unit
(:mod:`uedp.privacy.mechanisms.dpsgd`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from uedp.privacy.mechanisms.params import DpSgdParams
from uedp.privacy.mechanisms.registry import AuditDesign, BuildContext, EpsilonQuote, MechanismSpec, register
from uedp.privacy.statement import PrivacyUnit

if TYPE_CHECKING:
    from uedp.privacy.mechanisms.dpsgd import DpSgd
    from uedp.privacy.population import Population


def _build(params: DpSgdParams, context: BuildContext) -> DpSgd:
    from uedp.privacy.mechanisms.dpsgd import DpSgd

    return DpSgd(params, context.counted(), context.randomness)


def _quote(params: DpSgdParams, population: Population) -> EpsilonQuote:
    from uedp.privacy.accounting.events import epsilon_after
    from uedp.privacy.mechanisms.dpsgd import DpSgd

    mechanism = DpSgd(params, population)
    z, q = mechanism.noise_multiplier, mechanism.sample_rate
    epsilon = epsilon_after(mechanism.round_event(z), params.steps, params.delta, params.accountant,
                            initial=population.event())
    return EpsilonQuote(epsilon, z, (f"dpsgd: epsilon = {epsilon:.4g} at delta = {params.delta:g} after {params.steps} "
                                    f"steps, z = {z:.4g}, q = {q:.4g} ({params.accountant}; unit: one sequence)",),
                       mechanism.noise_to_signal(population.value))


register(MechanismSpec(
    name="dpsgd", rank=10, summary="example-level DP-SGD (one sequence is the unit), per-example clipping by ghost norms (or Opacus)",
    params=DpSgdParams, unit=DpSgdParams.unit_words, guarantee="central", build=_build, counts="sequences",
    privacy_unit=PrivacyUnit("add/remove", "sequence", DpSgdParams.unit_words),
    per_example_loss=True, audit=AuditDesign("sequence"), quote=_quote,
    uses_categories=lambda p: False,  # no category changes what it trains: a sweep trains it once
))
