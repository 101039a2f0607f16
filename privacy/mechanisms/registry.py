"""The mechanism registry: every mechanism module describes itself here (in the spirit of Opacus'
accountant and grad-sampler registries), and every caller (the train task, data preparation, the sweep,
the attacks, the CLI's help and choices, the Prefect forms, ``uedp epsilon``, the report's units) iterates
over it instead of naming mechanisms. Adding a mechanism is its module (what it does when it trains), a module
under :mod:`.specs` that calls :func:`register` (what it is, importing none of the machinery until it is built
or planned: the CLI, the configuration models and the ledger list the mechanisms without torch or
dp_accounting), its name in :data:`MODULES`, and its tests.

What a mechanism must say is six fields of :class:`MechanismSpec` (name, summary, params, unit, guarantee,
build); everything else has a default that fits a mechanism needing nothing more. What a built mechanism
must do is :meth:`Mechanism.train`, which returns everything a caller needs after training (:class:`Trained`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Union

from pydantic import Field

from uedp.privacy.mechanisms.params import MechanismParams
from uedp.privacy.signal import NoiseToSignal
from uedp.privacy.statement import PrivacyUnit

if TYPE_CHECKING:  # the mechanisms' machinery (torch, dp_accounting): what is registered needs none of it
    from uedp.privacy.attacks.audit_canaries import AuditAdjacency, AuditUnit
    from uedp.privacy.mechanisms.base import LossFn, Mechanism
    from uedp.privacy.population import CountedUnits, Population
    from uedp.privacy.randomness import Randomness

Guarantee = Literal["none", "central", "local"]
# What the training text is: the corpus, the corpus with detected spans redacted, or a local-DP release.
TextSource = Literal["original", "redacted", "sanitized"]
# Extra training data a mechanism needs beside the token ids grouped by user.
TrainingNeed = Literal["entities", "redacted", "private_masks"]


@dataclass(frozen=True)
class AuditDesign:
    """How the one-run audit plants canaries for a mechanism: at its privacy unit, and with its
    adjacency (a tails coin removes the canary, or substitutes a decoy)."""

    unit: AuditUnit
    adjacency: AuditAdjacency = "add_remove"


@dataclass(frozen=True)
class RunShape:
    """What a mechanism may need to know about the run around it to build or to refuse it."""

    model: str  # model kind: gpt2, lstm, bert
    classification: bool = False
    processes: int = 1
    canaries: int = 0
    seed: int = 0
    audit_canaries: int = 0
    byte_tokens: bool = True  # the byte-level tokenizer: a token is one byte (recurrent selective's unit)


@dataclass(frozen=True)
class BuildContext:
    """Everything a mechanism is built from besides its parameters."""

    shape: RunShape
    randomness: Randomness
    population: Population | None = None  # the public or DP count of its units, when it counts them
    n_examples: int = 0  # training sequences, where neighbours have the same number (selective)
    public_loss: LossFn | None = None  # the ordinary objective, for a noiseless phase
    # Per training user, per sentence, its detected entities' keys: the attribution graph a mechanism may
    # choose from before training (uedp-bounded's auto k); None before the data is read.
    entities: Mapping[str, Sequence[frozenset[str]]] | None = None

    def counted(self) -> Population:
        """The count of units of a mechanism that counts them (``spec.counts``); building one without is a bug."""
        if self.population is None:
            raise ValueError("needs the count of its privacy units (public or DP)")
        return self.population


@dataclass(frozen=True)
class EpsilonQuote:
    """What ``uedp epsilon`` prints: the epsilon a configuration would report, before any data is read."""

    epsilon: float
    noise_multiplier: float
    lines: tuple[str, ...] = ()
    noise_to_signal: NoiseToSignal | None = None  # whether it can learn (printed, and warned past the threshold)


@dataclass(frozen=True)
class MechanismSpec:
    """A mechanism as every caller sees it. The first six fields are what each must say; the rest are
    what a mechanism may add, each defaulting to "needs nothing more"."""

    name: str
    summary: str  # one line, for --help and the docs
    params: type[MechanismParams]  # a frozen pydantic model whose ``mechanism`` field is ``Literal[name]``
    unit: str  # the privacy unit, in words (the built mechanism states it; the docs' table reads it from here)
    guarantee: Guarantee
    build: Callable[[Any, BuildContext], Mechanism]
    # --- optional: what it may add ---
    # The unit as the privacy ledger composes it (adjacency and kind; ``unit`` is its wording). None: the
    # ledger composes its releases with those that state ``unit`` word for word, and with nothing else.
    privacy_unit: PrivacyUnit | None = None
    counts: CountedUnits | None = None  # None: needs no count of its units (none, or public by adjacency)
    text: TextSource = "original"
    needs: Callable[[RunShape], frozenset[TrainingNeed]] = lambda shape: frozenset()
    per_example_loss: bool = False  # DP-SGD clips per example: the loss must be a mean of per-example losses
    # Steps of each phase, in order (one phase, or a noiseless phase then a private one).
    schedule: Callable[[Any, RunShape], tuple[tuple[str, int], ...]] = lambda p, shape: (("train", p.steps_run),)
    # How the one-run audit plants canaries (``--audit-canaries``); a string: why it cannot, in words.
    audit: AuditDesign | str = "no audit design"
    # Entity-level mechanisms: what a missed detection leaves (appended to the coverage caveat).
    missed_entities: str | None = None
    # Whether the chosen entity categories change what is trained (noiseless: never).
    uses_categories: Callable[[Any], bool] = lambda p: True
    quote: Callable[[Any, Population], EpsilonQuote] | None = None
    # Whether a target epsilon can be calibrated before the data is read (z does not depend on the
    # unit count): the CLI then checks it before any work starts.
    early_calibration: bool = False
    check: Callable[[Any, RunShape], None] = lambda p, shape: None  # raises ValueError on a combination it refuses
    # The fewest training users it can train on. User-level mechanisms need two: with one, every round's
    # update is that user's clipped delta or nothing, under noise scaled to it, and there is nothing to learn.
    min_train_users: int = 1
    # What the built mechanism will not train on, said before training when that is most of what it
    # protects (uedp-bounded's k), from the entity sets of the training users; None: nothing to say.
    data_warnings: Callable[[Any, Mapping[str, Sequence[frozenset[str]]]], tuple[str, ...]] | None = None
    rank: int = 100  # where it is listed (help, forms): baselines first, then by unit

    @property
    def private(self) -> bool:
        return self.guarantee != "none"

    def default_params(self, **settings: Any) -> MechanismParams:
        return self.params(mechanism=self.name, **settings)

    def loss(self, classification: bool) -> LossFn:
        """The training objective: per-example for DP-SGD's clipping, the ordinary mean otherwise."""
        from uedp.models.metrics import causal_lm_loss, classification_loss, per_sequence_lm_loss

        if classification:
            return classification_loss
        return per_sequence_lm_loss if self.per_example_loss else causal_lm_loss


# The modules of .specs that register mechanisms, imported on first use of the registry (listed, not discovered,
# so what is registered is read here; a test checks that every module calling register() is listed).
MODULES = ("noiseless", "dpsgd", "selective", "userdp", "uedp", "uedp_bounded", "local_dp")

_REGISTRY: dict[str, MechanismSpec] = {}
_DISCOVERED = False


def register(spec: MechanismSpec) -> MechanismSpec:
    """Add a mechanism; its module calls this at import. A name can be registered once."""
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"mechanism {spec.name!r} is registered twice")
    if spec.name not in _literal_values(spec.params):
        raise ValueError(f"{spec.params.__name__}.mechanism does not admit {spec.name!r}")
    _REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a mechanism registered by a plugin or a test fixture (the listed modules' stay)."""
    _REGISTRY.pop(name, None)


def _discover() -> None:
    global _DISCOVERED
    if _DISCOVERED:
        return
    package = (__package__ or "uedp.privacy.mechanisms") + ".specs"
    for module in MODULES:
        importlib.import_module(f"{package}.{module}")
    _DISCOVERED = True


def mechanisms() -> dict[str, MechanismSpec]:
    """Every registered mechanism, in listing order (``rank``: baselines first, then by unit)."""
    _discover()
    return dict(sorted(_REGISTRY.items(), key=lambda item: item[1].rank))


def names() -> tuple[str, ...]:
    return tuple(mechanisms())


def get(name: str) -> MechanismSpec:
    specs = mechanisms()
    if name not in specs:
        raise ValueError(f"unknown mechanism {name!r}; valid: {', '.join(specs)}")
    return specs[name]


def unit_of(mechanism: str, wording: str = "") -> PrivacyUnit | None:
    """The structured unit of ``mechanism`` as a ledger entry names it: a registered name, or a label built
    on one (``uedp-bounded-k4``, a sweep's ``dpsgd-<variant>``: the longest registered name it extends); for
    a mechanism not registered here, that of a registered one whose unit is worded ``wording``. None when
    neither says (or the mechanism states no structured unit)."""
    specs = mechanisms()
    if mechanism not in specs:
        mechanism = max((name for name in specs if mechanism.startswith(name + "-")), key=len, default="")
    if mechanism:
        return specs[mechanism].privacy_unit
    return next((spec.privacy_unit for spec in specs.values() if wording and spec.unit == wording
                 and spec.privacy_unit is not None), None)


def params_union() -> Any:
    """The discriminated union of every mechanism's parameters (pydantic picks the model by ``mechanism``)."""
    from typing import Annotated

    types = tuple(dict.fromkeys(spec.params for spec in mechanisms().values()))
    return Annotated[Union[types], Field(discriminator="mechanism")]


def name_literal() -> Any:
    """``Literal[...]`` of every mechanism name: a choice list in the Prefect UI and in JSON schemas."""
    return Literal[names()]


def _literal_values(params: type[MechanismParams]) -> tuple[str, ...]:
    annotation = params.model_fields["mechanism"].annotation
    return tuple(getattr(annotation, "__args__", ()))
