"""``uedp-bounded`` as the registry lists it: one user and one detected entity the unit, under the substitution
adjacency with the attribution graph public (:mod:`uedp.privacy.mechanisms.uedp_bounded`, which also builds and
plans it: both choose k from the graph or the signal, machinery of that module)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from uedp.privacy.mechanisms.params import UeDpBoundedParams
from uedp.privacy.mechanisms.registry import AuditDesign, BuildContext, EpsilonQuote, MechanismSpec, register
from uedp.privacy.mechanisms.specs.userdp import check_user_level
from uedp.privacy.statement import PrivacyUnit

if TYPE_CHECKING:
    from uedp.privacy.mechanisms.uedp_bounded import UeDpBounded
    from uedp.privacy.population import Population


def _build(params: UeDpBoundedParams, context: BuildContext) -> UeDpBounded:
    from uedp.privacy.mechanisms.uedp_bounded import build

    return build(params, context)


def _quote(params: UeDpBoundedParams, population: Population) -> EpsilonQuote:
    from uedp.privacy.mechanisms.uedp_bounded import quote

    return quote(params, population)


def _data_warnings(mechanism: Any, entities: Mapping[str, Sequence[frozenset[str]]]) -> tuple[str, ...]:
    from uedp.privacy.mechanisms.uedp_bounded import dropped_entities_warning

    return tuple(w for w in (dropped_entities_warning(mechanism, entities),) if w)


register(MechanismSpec(
    name="uedp-bounded", rank=42,
    summary="user- and entity-level DP at userdp's noise: at most k users per entity keep its sentences "
            "(multi-attribution DP)",
    params=UeDpBoundedParams, unit=UeDpBoundedParams.unit_words, guarantee="central", build=_build, counts=None,
    # the contents of a user's and an entity's sentences change, the attribution graph stays: not uedp's
    # add/remove unit, so its releases compose apart from uedp's
    privacy_unit=PrivacyUnit("substitution", "user+entity", UeDpBoundedParams.unit_words),
    needs=lambda shape: frozenset({"entities"}), audit=AuditDesign("entity", "replace"),
    missed_entities=" (uedp-bounded: their sentences are kept in every user and protected only as part of their "
                    "user's contribution)",
    quote=_quote, check=check_user_level, min_train_users=2, data_warnings=_data_warnings,
))
