"""``uedp-bounded``: user- and entity-level DP at about userdp's noise, by bounding how many users each
entity reaches (multi-attribution DP: Ganesh, McKenna, McMahan, Smith, Wu, ICML 2025; docs/PRIVACY.md).

Unit: one user u' and one detected entity e' together; neighbouring datasets differ in the *contents* of
every sentence of u' and every sentence that mentions e' (substitution), the attribution graph (which
sentences share a user or an entity, not their text) fixed and public.

Before training, and from the graph alone (:mod:`privacy.attribution`), each entity gets at most
``k = holders_per_entity`` holder users; a sentence with entities is kept only in a user that holds all
of them (sentences without an entity are always kept). Then DP-FedAvg exactly as userdp: Poisson users,
per-user clipped delta, weights from the user's own kept sentence count (public: the graph fixes it),
Gaussian noise ``z * clip``, the fixed denominator ``q_user * N`` (N public under substitution).

Sensitivity: changing (u', e') changes u''s contribution and those of e''s at most k holders, every
other user's data and randomness (batch order from its own stream, over a kept count the graph fixes)
staying the same: at most ``1 + k`` clipped contributions, each moving from one vector of norm <= clip
to another. Accounting: :func:`privacy.accounting.group_replace_round` (conservative; PLD only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import dp_accounting

from uedp.privacy.accounting import MIN_NOISE_MULTIPLIER, epsilon_after, group_replace_round, poisson_gaussian_round
from uedp.privacy.attribution import AttributionGraph, HolderChoiceResult, choose_holders
from uedp.privacy.mechanisms.base import HostUnits, SamplesUnits, TrainData
from uedp.privacy.mechanisms.params import UeDpBoundedParams
from uedp.privacy.mechanisms.registry import AuditDesign, BuildContext, EpsilonPlan, MechanismSpec, register
from uedp.privacy.mechanisms.userdp import Selection, UserDp, check_vectorizable
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness

__all__ = ["KeptHolders", "UeDpBounded", "UeDpBoundedParams", "bounded_training_data"]

GRAPH_PUBLIC = ("the attribution graph: which sentences share a user or a detected entity (not their text), "
                "hence every user's number of kept sentences")


def bounded_training_data(data: TrainData, graph: AttributionGraph, choice: HolderChoiceResult) -> TrainData:
    """``data`` with each user's sensitive sentences it does not hold every entity of left out (users are
    matched to the graph's by name, sentences by position; a mismatch is a bug, not a silent truncation)."""
    kept = dict(zip(graph.users, choice.kept, strict=True))
    if list(kept) != list(data.by_user) or any(len(kept[u]) != len(s) for u, s in data.by_user.items()):
        raise ValueError("the holder choice was made on another dataset's attribution graph")
    by_user = {user: [seq for seq, keep in zip(seqs, kept[user]) if keep] for user, seqs in data.by_user.items()}
    entities = None if data.entities is None else {
        user: [e for e, keep in zip(sets, kept[user]) if keep] for user, sets in data.entities.items()}
    return TrainData(by_user, data.pad_id, entities)


@dataclass(frozen=True)
class KeptHolders:
    """One training's holder choice (made from the public attribution graph before the first round): which
    users keep which sentences. The audit's participation record counts only hosts that kept the canary's
    sentence; the statement says how much of the data the choice kept."""

    graph: AttributionGraph
    choice: HolderChoiceResult
    entity_sets: Mapping[str, Sequence[frozenset[str]]]
    users: SamplesUnits  # userdp's per-user Poisson coins

    def rounds_with(self, units: HostUnits, rounds: range) -> int:
        """Rounds that sample a host the holder choice kept one of the entity's sentences in (audit
        canaries): a host whose sentence with the entity was dropped does not carry it."""
        if not units.entities:
            return self.users.rounds_with(units, rounds)
        index = {user: u for u, user in enumerate(self.graph.users)}
        keepers = tuple(user for user in units.users if user in index and any(
            kept and set(units.entities) & keys
            for kept, keys in zip(self.choice.kept[index[user]], self.entity_sets[user])))
        return self.users.rounds_with(replace(units, users=keepers), rounds)

    def extra(self) -> dict[str, float]:
        sensitive = self.graph.n_sensitive
        return {"sensitive_sentences": float(sensitive),
                "sensitive_sentences_kept": float(self.choice.sensitive_kept),
                "sensitive_share_kept": self.choice.sensitive_kept / sensitive if sensitive else 1.0,
                "sentences_without_entity": float(self.graph.n_plain),
                "data_share_used": (self.choice.sensitive_kept + self.graph.n_plain) / max(1, self.graph.n_sentences)}

    def public(self, k: int) -> str:
        """The graph, with k and what it keeps (figures of the public graph)."""
        extra = self.extra()
        return (f"{GRAPH_PUBLIC}: k = {k} holders per entity ({self.choice.strategy}) keep "
                f"{self.choice.sensitive_kept} of {extra['sensitive_sentences']:.0f} sentences with an entity "
                f"({extra['sensitive_share_kept']:.1%}), and all {extra['sentences_without_entity']:.0f} without one")


class UeDpBounded(UserDp):
    name = "uedp-bounded"
    unit = ("one user and one detected entity: the contents of every sentence of the user and of every sentence "
            "with the entity (substitution adjacency; the attribution graph public)")
    adjacency = "replace"

    def __init__(self, params: UeDpBoundedParams, randomness: Randomness | None = None):
        self.group_size = 1 + params.holders_per_entity
        self.noise_floor = MIN_NOISE_MULTIPLIER * math.sqrt(self.group_size)  # per-release noise >= the floor
        super().__init__(params, None, randomness)
        self.params: UeDpBoundedParams = params

    def round_event(self, noise_multiplier: float) -> dp_accounting.DpEvent:
        return group_replace_round(self.params.q_user, noise_multiplier, self.group_size)

    def select(self, data: TrainData) -> Selection:
        """Each entity's at most k holders, from the graph alone; the sentences they do not hold left out."""
        if data.entities is None:
            raise ValueError(f"{self.name} needs the sentences' entity sets (TrainData.entities)")
        graph = AttributionGraph.from_entity_sets(data.entities)
        kept = KeptHolders(graph, choose_holders(graph, self.params.holders_per_entity, self.params.holder_choice),
                           data.entities, users=self)
        return Selection(bounded_training_data(data, graph, kept.choice), sampling=kept,
                         extra={"holders_per_entity": float(self.params.holders_per_entity),
                                "group_size": float(self.group_size), **kept.extra()},
                         public=(kept.public(self.params.holders_per_entity),))


def _build(params: UeDpBoundedParams, context: BuildContext) -> UeDpBounded:
    return UeDpBounded(params, context.randomness)


def _plan(params: UeDpBoundedParams, population: Population) -> EpsilonPlan:
    mechanism = UeDpBounded(params)
    z, epsilon = mechanism.noise_multiplier, mechanism.epsilon()
    same_z = epsilon_after(poisson_gaussian_round(params.q_user, z), params.rounds, params.delta, "pld",
                           initial=population.event())
    return EpsilonPlan(epsilon, z, (
        f"uedp-bounded: epsilon = {epsilon:.4g} at delta = {params.delta:g} after {params.rounds} rounds, z = {z:.4g} "
        f"(pld, substitution; unit: one user and one detected entity; k = {params.holders_per_entity} holders per "
        "entity, the attribution graph public)",
        f"  a change moves at most 1 + k = {mechanism.group_size} users' clipped deltas; accounted as "
        f"{mechanism.group_size} replace-one releases at z / sqrt({mechanism.group_size}) each (conservative)",
        f"  for comparison, userdp with the same q_user and z: epsilon = {same_z:.4g} (add/remove one user; "
        "protects users only)",
    ))


register(MechanismSpec(
    name="uedp-bounded", rank=42,
    summary="user- and entity-level DP at userdp's noise: at most k users per entity keep its sentences "
            "(multi-attribution DP)",
    params=UeDpBoundedParams, unit=UeDpBounded.unit, guarantee="central", build=_build, counts=None,
    needs=lambda shape: frozenset({"entities"}), audit=AuditDesign("entity", "replace"),
    missed_entities=" (uedp-bounded: their sentences are kept in every user and protected only as part of their "
                    "user's contribution)",
    plan=_plan, check=check_vectorizable,
))
