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
to another. Accounting: :func:`privacy.accounting.events.group_replace_round` (conservative; PLD only).

Adaptive clipping (as userdp, :mod:`privacy.mechanisms.userdp`): each sampled user also adds ``b_u - 1/2``
to a count noised with std ``sigma_b``. Divide the update by its noise ``z_Delta C_t`` and the count by
``sigma_b``: a user then adds ``(x_u / (z_Delta C_t), (b_u - 1/2) / sigma_b)`` under ``N(0, I)``, a vector
of norm at most ``(z_Delta^-2 + (2 sigma_b)^-2)^(1/2) = 1 / z`` (``b_u - 1/2`` lies within 1/2 of 0,
as ``x_u`` lies within C_t of 0). That is the bound group_replace_round takes for each of the ``1 + k``
changed users (one vector of norm <= 1 in units of z replaced by another, its own coin), so its split
into ``1 + k`` shares of the joint noise holds unchanged and the round event at z covers both releases.
A changed user's bit may flip (0 to 1), moving its term by 1: twice the 1/2 accounted, as its delta moves
by up to twice C_t; dp_accounting's REPLACE_ONE counts that factor 2 itself. So the count's sensitivity
is 1/2 here too, not 1 (1 would hold for bits that are not centred).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import dp_accounting

from uedp.privacy.accounting.events import (
    MIN_NOISE_MULTIPLIER,
    epsilon_after,
    group_replace_round,
    poisson_gaussian_round,
)
from uedp.privacy.attribution import AttributionGraph, HolderChoiceResult, choose_holders
from uedp.privacy.mechanisms.auto_holders import FIXED_NOISE_K, AutoHolders, choose_k, fixed_noise_choice
from uedp.privacy.mechanisms.base import HostUnits, SamplesUnits, TrainData
from uedp.privacy.mechanisms.params import UeDpBoundedParams
from uedp.privacy.mechanisms.registry import BuildContext, EpsilonQuote
from uedp.privacy.mechanisms.userdp import Selection, UserDp
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness
from uedp.privacy.signal import NoiseToSignal

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
    return TrainData(by_user, data.pad_id, entities, max_len=data.max_len)


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
    unit = UeDpBoundedParams.unit_words
    adjacency = "replace"

    def __init__(self, params: UeDpBoundedParams, randomness: Randomness | None = None,
                 chosen: AutoHolders | None = None):
        if params.holders_per_entity == "auto":
            if params.target_epsilon is not None:
                raise ValueError("holders_per_entity auto with a target epsilon is chosen from the training data's "
                                 "attribution graph first (resolve_auto)")
            params, chosen = with_k(params, FIXED_NOISE_K), fixed_noise_choice()  # a fixed z: no trade to make
        assert isinstance(params.holders_per_entity, int)
        self.k: int = params.holders_per_entity
        self.chosen = chosen  # how auto chose k, said in the statement (None: k was given)
        self._choice: tuple[AttributionGraph, HolderChoiceResult] | None = None  # the last graph's holder choice
        self.group_size = 1 + self.k
        self.noise_floor = MIN_NOISE_MULTIPLIER * math.sqrt(self.group_size)  # per-release noise >= the floor
        super().__init__(params, None, randomness)
        self.params: UeDpBoundedParams = params

    def round_event(self, noise_multiplier: float) -> dp_accounting.DpEvent:
        return group_replace_round(self.params.q_user, noise_multiplier, self.group_size)

    def noise_to_signal(self, units: float) -> NoiseToSignal:
        """userdp's, with the z a group of 1 + k needs, and a smaller k as one more way down."""
        smaller = ("a smaller --holders-per-entity (k), or auto",) if self.k else ()
        return replace(super().noise_to_signal(units), mechanism=f"uedp-bounded (k = {self.k})", extra_fixes=smaller)

    def holder_choice(self, graph: AttributionGraph) -> HolderChoiceResult:
        """The k holders of each entity on ``graph``: auto's (made while choosing k), else made once and kept,
        so the warning before training and the selection share it."""
        if self.chosen is not None and (made := self.chosen.choice_on(graph)) is not None:
            return made
        if self._choice is None or self._choice[0] != graph:
            self._choice = (graph, choose_holders(graph, self.k, self.params.holder_choice))
        return self._choice[1]

    def select(self, data: TrainData) -> Selection:
        """Each entity's at most k holders, from the graph alone; the sentences they do not hold left out."""
        if data.entities is None:
            raise ValueError(f"{self.name} needs the sentences' entity sets (TrainData.entities)")
        graph = AttributionGraph.from_entity_sets(data.entities)
        kept = KeptHolders(graph, self.holder_choice(graph), data.entities, users=self)
        return Selection(bounded_training_data(data, graph, kept.choice), sampling=kept,
                         extra={"holders_per_entity": float(self.k),
                                "group_size": float(self.group_size), **kept.extra()},
                         public=(kept.public(self.k)
                                 + (f"; {self.chosen.reason}" if self.chosen is not None else ""),))


# Below this share of the sentences that name an entity, a run is warned as loudly as past the noise threshold:
# it trains on the text without entities and learns (almost) none of the entity text it was chosen to protect.
KEEP_WARNING = 0.5


def dropped_entities_warning(mechanism: UeDpBounded, entities: Mapping[str, Sequence[frozenset[str]]]) -> str | None:
    """Said before training when k keeps less than :data:`KEEP_WARNING` of the sentences with an entity, with the
    trade-off in one line. From the attribution graph and the configuration only (public under the substitution
    adjacency; the statement lists the same counts)."""
    graph = AttributionGraph.from_entity_sets(entities)
    if not graph.n_sensitive:
        return None
    chosen, choice = mechanism.chosen, mechanism.holder_choice(graph)
    share = choice.sensitive_kept / graph.n_sensitive
    if share >= KEEP_WARNING:
        return None
    larger = next((c for c in chosen.candidates if c.k > mechanism.k and c.kept is not None), None) if chosen else None
    if larger is not None and larger.kept is not None:
        past = (f" (past {larger.signal.limit:g}, where measured runs stopped learning)"
                if larger.signal.past_limit else "")
        trade = (f"k = {larger.k} would keep {larger.kept / graph.n_sensitive:.0%} at noise-to-signal "
                 f"{larger.signal.ratio:.3g}{past}")
    else:
        trade = "a larger --holders-per-entity keeps more of them and needs more noise"
    return (f"uedp-bounded (k = {mechanism.k}) trains on {choice.sensitive_kept} of the {graph.n_sensitive} sentences "
            f"that name an entity ({share:.0%}): the model learns {'no' if not choice.sensitive_kept else 'little'} "
            f"entity text. Trade-off: {trade}; userdp keeps every sentence and protects users only")


def with_k(params: UeDpBoundedParams, k: int) -> UeDpBoundedParams:
    return params.model_copy(update={"holders_per_entity": k})


def resolve_auto(params: UeDpBoundedParams, entities: Mapping[str, Sequence[frozenset[str]]],
                 randomness: Randomness | None = None) -> UeDpBounded:
    """``holders_per_entity auto``: k from the training data's attribution graph and the planner
    (:mod:`privacy.mechanisms.auto_holders`), both public under the substitution adjacency."""
    if params.target_epsilon is None:
        return UeDpBounded(params, randomness)  # a fixed z: every k gets the same noise (fixed_noise_choice)
    graph = AttributionGraph.from_entity_sets(entities)
    users = float(len(graph.users))
    built: dict[int, UeDpBounded] = {}  # each candidate calibrates its z once
    chosen = choose_k(graph, _signal_of(params, users, built, randomness), params.holder_choice)
    mechanism = built[chosen.k]
    mechanism.chosen = chosen
    return mechanism


def _signal_of(params: UeDpBoundedParams, users: float, built: dict[int, UeDpBounded],
               randomness: Randomness | None = None) -> Callable[[int], NoiseToSignal]:
    def signal_for(k: int) -> NoiseToSignal:
        built[k] = UeDpBounded(with_k(params, k), randomness)
        return built[k].noise_to_signal(users)
    return signal_for


def planned_auto(params: UeDpBoundedParams, users: float, randomness: Randomness | None = None) -> UeDpBounded:
    """``holders_per_entity auto`` before the data is read (``uedp epsilon --users N``): k from the signal
    alone, the largest training may take (the graph may make it smaller)."""
    if params.target_epsilon is None:
        return UeDpBounded(params, randomness)
    built: dict[int, UeDpBounded] = {}
    chosen = choose_k(None, _signal_of(params, users, built, randomness))
    mechanism = built[chosen.k]
    mechanism.chosen = chosen
    return mechanism


def build(params: UeDpBoundedParams, context: BuildContext) -> UeDpBounded:
    """The mechanism a run trains: k from the training data's attribution graph (``auto``), from the count a plan
    gives, or as configured."""
    if params.holders_per_entity == "auto":
        if context.entities is not None:
            return resolve_auto(params, context.entities, context.randomness)
        if context.population is not None:  # a plan from a count the user gives, before any data
            return planned_auto(params, context.population.value, context.randomness)
        raise ValueError("holders_per_entity auto needs the training data's attribution graph")
    return UeDpBounded(params, context.randomness)


def quote(params: UeDpBoundedParams, population: Population) -> EpsilonQuote:
    """What ``uedp epsilon`` prints for a configuration, before any data is read."""
    auto = ""
    mechanism = planned_auto(params, population.value) if params.holders_per_entity == "auto" else UeDpBounded(params)
    if mechanism.chosen is not None and params.target_epsilon is not None:
        chosen = mechanism.chosen
        shown = ", ".join(f"k = {c.k}: {c.signal.ratio:.3g}" for c in chosen.candidates)
        auto = (f"  holders_per_entity auto: noise-to-signal {shown}; training takes k = {chosen.k} at most (a "
                "smaller one if it already keeps every sentence with an entity: the graph decides)")
    params = mechanism.params
    if mechanism.chosen is not None and not auto:
        auto = f"  holders_per_entity auto: {mechanism.chosen.reason}"
    z, epsilon = mechanism.noise_multiplier, mechanism.epsilon()
    same_z = epsilon_after(poisson_gaussian_round(params.q_user, z), params.rounds, params.delta, "pld",
                           initial=population.event())
    return EpsilonQuote(epsilon, z, (
        f"uedp-bounded: epsilon = {epsilon:.4g} at delta = {params.delta:g} after {params.rounds} rounds, z = {z:.4g} "
        f"(pld, substitution; unit: one user and one detected entity; k = {params.holders_per_entity} holders per "
        "entity, the attribution graph public)",
        f"  a change moves at most 1 + k = {mechanism.group_size} users' clipped deltas; accounted as "
        f"{mechanism.group_size} replace-one releases at z / sqrt({mechanism.group_size}) each (conservative)",
        f"  for comparison, userdp with the same q_user and z: epsilon = {same_z:.4g} (add/remove one user; "
        "protects users only)",
        *mechanism.adaptive_clip_lines(population),
        *([auto] if auto else []),
    ), mechanism.noise_to_signal(population.value))
