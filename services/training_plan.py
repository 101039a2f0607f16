"""A run's training plan: what it will train with and spend, fixed before round 1 from its configuration
and public facts only (in the spirit of jax_privacy's frozen execution plan).

The plan is built from a :class:`~services.config.TrainConfig` and :class:`PublicFacts`: counts that are
public or DP, and the attribution graph where the mechanism's adjacency makes it public. It holds the
built mechanism, the configuration as it trains (``sampling=planned`` applied), the privacy unit, the
epsilon the run plans to state, the privacy ledger's reservation, the noise-to-signal and the warnings
said before training. ``uedp epsilon``, the pre-flight of a sweep, the ledger and training all read the
same plan: it is the only way a run learns its epsilon before it trains.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from uedp.errors import UedpError
from uedp.models.metrics import causal_lm_loss, classification_loss
from uedp.privacy.mechanisms.auto_sampling import SamplingChoice, choose_for
from uedp.privacy.mechanisms.base import Mechanism
from uedp.privacy.mechanisms.registry import BuildContext, EpsilonQuote
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness
from uedp.privacy.signal import MORE_USERS, NoiseToSignal
from uedp.services.config import TrainConfig


@dataclass(frozen=True)
class PublicFacts:
    """What a plan may read besides the configuration: each fact public, DP, or public by adjacency."""

    population: Population | None = None  # the public or DP count of the mechanism's units
    # Whether the count's value is drawn: a pre-flight plans with a DP count not drawn yet (its cost is
    # known, its value is not), so it plans the epsilon and skips what needs the value.
    count_drawn: bool = True
    n_examples: int = 0  # training sequences, used where neighbours have the same number (selective)
    train_users: int = 0  # uedp-bounded's denominator: public under its substitution adjacency
    # Per training user, per sentence, its entities' keys: the attribution graph uedp-bounded's auto k reads.
    entities: Mapping[str, Sequence[frozenset[str]]] | None = None
    more_users: str = MORE_USERS  # the dataset format's fix for too few users, in the warning's words
    trainable: int = 0  # the model's trainable coordinates (LoRA: its adapters'), public: the architecture's


@dataclass(frozen=True)
class TrainingPlan:
    """A run as planned before round 1; nothing in it depends on private data beyond ``PublicFacts``."""

    config: TrainConfig  # as it trains (sampling=planned: with the planner's q_user and rounds)
    mechanism: Mechanism  # built from the registry; trains with the plan's z, sampling and rounds
    unit: str  # the privacy unit in words (MLflow's privacy_unit, the result's, the ledger's)
    epsilon: float  # what the run states if it runs its planned rounds (or to its budget stop); inf: none
    delta: float
    noise_to_signal: NoiseToSignal | None = None
    noise_warning: str | None = None  # the noise-to-signal past its measured threshold, with what lowers it
    said: tuple[str, ...] = ()  # said before training (the planner's choice, in words)
    warnings: tuple[str, ...] = ()  # said as warnings before training (uedp-bounded dropping most entity text)
    # The mechanism's own account of the plan (``spec.quote``), asked for by ``uedp epsilon`` only
    description: EpsilonQuote | None = None


def plan_training(config: TrainConfig, facts: PublicFacts, randomness: Randomness | None = None,
                  describe: bool = False) -> TrainingPlan:
    """The plan of ``config`` from ``facts``; ``randomness`` is the run's (a plan for printing draws nothing).
    ``describe``: add the mechanism's own lines on its plan (``uedp epsilon`` prints them)."""
    config, chosen = planned_sampling(config, planning_count(config, facts))
    mechanism = build_mechanism(config, facts.population, facts.n_examples, randomness, facts.entities)
    signal = (noise_to_signal_of(mechanism, facts.population, facts.train_users)
              if facts.count_drawn else None)
    if signal is not None and facts.trainable:
        signal = replace(signal, coordinates=facts.trainable)
    description = (config.spec.quote(config.params, facts.population) if describe and config.spec.quote is not None
                   and facts.population is not None else None)
    return TrainingPlan(
        config=config, mechanism=mechanism, unit=mechanism.unit,
        epsilon=float(mechanism.planned_epsilon()) if config.is_private else math.inf,
        delta=float(config.params.stated_delta or 0.0) if config.is_private else 0.0,
        noise_to_signal=signal, noise_warning=signal.warning(facts.more_users, pretrained=config.starts_from_a_model)
        if signal is not None else None,
        said=(f"sampling planned: {chosen.reason}",) if chosen else (),
        warnings=(config.spec.data_warnings(mechanism, facts.entities)
                  if config.spec.data_warnings is not None and facts.entities is not None else ()),
        description=description)


def build_mechanism(config: TrainConfig, population: Population | None, n_examples: int,
                    randomness: Randomness | None = None,
                    entities: Mapping[str, Sequence[frozenset[str]]] | None = None) -> Mechanism:
    """The mechanism a configuration names, from the registry. ``population`` is the public or DP count of
    the mechanism's units (sequences, users, writers), which sets sampling rates, denominators and uedp's
    bound on sampled users; ``n_examples`` is used only where neighbours have the same count (selective)."""
    randomness = randomness or Randomness.for_mode(config.randomness, config.seed)
    public_loss = classification_loss if config.task == "classification" else causal_lm_loss
    context = BuildContext(config.shape, randomness, population, n_examples, public_loss, entities)
    try:
        return config.spec.build(config.params, context)
    except ValueError as exc:
        raise UedpError(f"{config.mechanism}: {exc}") from None


def planned_population(config: TrainConfig) -> Population | None:
    """Before any data is read (to check a target epsilon early): the declared count, or a DP count whose
    value is not known yet (its privacy cost is; its value here is a placeholder no plan may read)."""
    if config.spec.counts is None:
        return None
    if config.public_count is not None:
        return Population.declared(config.public_count)
    return Population(1.0, "dp-count", config.count_noise)


def preflight_skipped(config: TrainConfig) -> str | None:
    """Why the pre-flight cannot plan ``config`` (None: it can). ``sampling=planned`` chooses q_user and rounds
    from the count of users, and before the data is read only a declared count is known: a DP count is drawn
    by training, and uedp-bounded counts its training users (public under its adjacency) when it opens the
    data. Planning from a placeholder would refuse, or pass, a split the run never trains."""
    if not config.params.plans_sampling or config.spec.quote is None:
        return None
    if config.spec.counts is None:
        count = "the number of training users (public under its adjacency), read when training opens the data"
    elif config.public_count is None:
        count = "the DP count of users training draws"
    else:
        return None
    return (f"{config.label}: sampling=planned chooses q_user and rounds from {count}, not known before the data "
            "is read: the pre-flight does not plan it (training plans the chosen split and checks its target "
            "epsilon before round 1" + ("; a declared --public-count is planned here" if config.spec.counts else "")
            + ")")


def preflight_plan(config: TrainConfig) -> TrainingPlan | None:
    """The plan a configuration can have before its data is read: a target epsilon out of reach is a
    configuration error found in seconds (mechanisms whose z does not depend on the unit count). None when
    the plan needs a count not known yet (:func:`preflight_skipped` says why)."""
    if preflight_skipped(config) is not None:
        return None
    return plan_training(config, PublicFacts(planned_population(config), count_drawn=config.public_count is not None))


def planning_count(config: TrainConfig, facts: PublicFacts) -> Population | None:
    """The count of users ``sampling=planned`` splits the budget over: the mechanism's public or DP count, or,
    for a mechanism that counts no units of its own (uedp-bounded), its training users, public under its
    substitution adjacency (the number it divides by when it trains)."""
    if facts.population is not None:
        return facts.population if facts.count_drawn else None  # a DP count not drawn yet has no value to read
    if config.spec.counts is None and facts.train_users > 0:
        return Population.public_by_adjacency(facts.train_users)
    return None


def planned_sampling(config: TrainConfig, population: Population | None) -> tuple[TrainConfig, SamplingChoice | None]:
    """``sampling=planned``: the configuration with the planner's q_user and rounds for its budget, from the
    run's public or DP count of users (never the exact one of an add/remove unit), candidates ranked with the
    RDP accountant where the mechanism's accounting admits it (else with its own). A planned configuration
    without a count to plan from is refused: it would train the given split while saying "planned"."""
    if not config.params.plans_sampling or config.spec.quote is None:
        return config, None
    if population is None:
        raise UedpError(f"{config.mechanism} sampling=planned: no count of users to plan from yet (the pre-flight "
                        "skips such a configuration; training plans it once it has its count)")
    rank = config.params.rank_accountant
    try:
        params, choice = choose_for(config.spec.quote, config.params, population, rank_accountant=rank)
    except ValueError:  # its words quote the DP count, drawn but not charged to a run that stops here
        raise UedpError(f"{config.mechanism} sampling=planned: no split of this configuration's budget (rounds x "
                        "q_user) keeps 10 users a round over at least 10 rounds of this dataset: raise --rounds or "
                        "--q-user (`uedp epsilon --choose-sampling --users N` shows the splits for a count you "
                        "give)") from None
    return config.model_copy(update={"params": params}), choice


def noise_to_signal_of(mechanism: Mechanism, population: Population | None, users: int) -> NoiseToSignal | None:
    """The built mechanism's noise-to-signal, from its public or DP count of units; a mechanism without a
    count of its own (uedp-bounded) counts the training users, public under its substitution adjacency."""
    try:
        return mechanism.noise_to_signal(population.value if population is not None else float(users))
    except ValueError as exc:  # a setting refused once the count is known (adaptive clipping's room)
        raise UedpError(f"{mechanism.name}: {exc}") from None
