"""``uedp`` and ``uedp-naive`` as the registry lists them: one user and one sensitive entity the unit
(UeDP-Alg with the estimators f_E+ and f_E, :mod:`uedp.privacy.mechanisms.uedp`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from uedp.privacy.mechanisms.params import UeDpParams
from uedp.privacy.mechanisms.registry import AuditDesign, BuildContext, EpsilonQuote, MechanismSpec, register
from uedp.privacy.mechanisms.specs.userdp import check_user_level
from uedp.privacy.statement import PrivacyUnit

if TYPE_CHECKING:
    from uedp.privacy.mechanisms.uedp import UeDp
    from uedp.privacy.population import Population


def _build(params: UeDpParams, context: BuildContext) -> UeDp:
    from uedp.privacy.mechanisms.uedp import UeDp

    return UeDp(params, context.counted(), context.randomness)


def _quote(params: UeDpParams, population: Population) -> EpsilonQuote:
    from uedp.privacy.accounting.events import epsilon_after, poisson_gaussian_round
    from uedp.privacy.mechanisms.uedp import UeDp

    mechanism = UeDp(params, population)
    plan, z = mechanism.accounting, mechanism.noise_multiplier
    cases = plan.epsilons(z)
    same = epsilon_after(poisson_gaussian_round(params.q_user, z), params.rounds, params.delta, params.accountant,
                         initial=population.event())
    return EpsilonQuote(max(cases.values()), z, (
        f"{params.mechanism}: epsilon = {max(cases.values()):.4g} at delta = {params.delta:g} after {params.rounds} "
        f"rounds, z = {z:.4g} ({params.accountant}; unit: one user and one sensitive entity)",
        "  cases: " + ", ".join(f"{c} {e:.4g}" for c, e in cases.items())
        + f"; at most M = {plan.max_users} users per round (more are drawn with probability {plan.delta_trunc:.2g}, "
        f"charged to delta times 1 + e^epsilon), "
        f"sensitivity (2M+1) * clip = {plan.sensitivity_factor} * clip",
        f"  for comparison, userdp with the same q_user and z: epsilon = {same:.4g} (protects users only)",
    ), mechanism.noise_to_signal(population.value))


for _name, _summary, _missed in (
    ("uedp", "user- and entity-level DP (UeDP-Alg, estimator f_E+), with sound accounting",
     " (uedp: only through the ordinary noise of their user's and sentences' contributions)"),
    ("uedp-naive", "UeDP-Alg with the naive estimator f_E: sensitive sentences only",
     " (uedp: only through the ordinary noise of their user's and sentences' contributions)"),
):
    register(MechanismSpec(
        name=_name, rank=40 + int(_name.endswith("naive")), summary=_summary, params=UeDpParams, unit=UeDpParams.unit_words,
        guarantee="central", build=_build, privacy_unit=PrivacyUnit("add/remove", "user+entity", UeDpParams.unit_words),
        counts="anchored writers", needs=lambda shape: frozenset({"entities"}),
        audit=AuditDesign("entity"),
        missed_entities=_missed, quote=_quote, check=check_user_level, min_train_users=2,
    ))
