"""``userdp`` as the registry lists it: user-level DP by DP-FedAvg, one user the unit
(:mod:`uedp.privacy.mechanisms.userdp`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from uedp.privacy.mechanisms.params import UserDpParams
from uedp.privacy.mechanisms.registry import AuditDesign, BuildContext, EpsilonQuote, MechanismSpec, RunShape, register
from uedp.privacy.statement import PrivacyUnit

if TYPE_CHECKING:
    from uedp.privacy.mechanisms.userdp import UserDp
    from uedp.privacy.population import Population


def _build(params: UserDpParams, context: BuildContext) -> UserDp:
    from uedp.privacy.mechanisms.userdp import UserDp

    return UserDp(params, context.counted(), context.randomness)


def _quote(params: UserDpParams, population: Population) -> EpsilonQuote:
    from uedp.privacy.mechanisms.userdp import UserDp

    mechanism = UserDp(params, population)
    z, epsilon = mechanism.noise_multiplier, mechanism.epsilon()
    return EpsilonQuote(epsilon, z, (f"userdp: epsilon = {epsilon:.4g} at delta = {params.delta:g} after {params.rounds} "
                                    f"rounds, z = {z:.4g} ({params.accountant}; unit: one user)",
                                    *mechanism.adaptive_clip_lines(population)),
                       mechanism.noise_to_signal(population.value))


def check_user_level(params: UserDpParams, shape: RunShape) -> None:
    """What the user-level mechanisms' local updates support: vectorized users for GPT-2 language models only,
    and chunks of a user's sentences for language models only (a classifier's example has one class)."""
    if params.vectorize_users and shape.model != "gpt2":
        raise ValueError("vectorize_users is implemented for GPT-2 language models only")
    if params.user_text == "chunks" and shape.classification:
        raise ValueError("user_text=chunks packs a writer's sentences for a language model; a classifier's examples "
                         "each keep their own class (use user_text=sentences)")


register(MechanismSpec(
    name="userdp", rank=30, summary="user-level DP by DP-FedAvg: per-user model deltas clipped and noised",
    params=UserDpParams, unit=UserDpParams.unit_words, guarantee="central", build=_build, counts="users",
    privacy_unit=PrivacyUnit("add/remove", "user", UserDpParams.unit_words),
    audit=AuditDesign("user"), quote=_quote, check=check_user_level, min_train_users=2, early_calibration=True,
    uses_categories=lambda p: False,  # no category changes what it trains: a sweep trains it once
))
