"""Parameters of the mechanisms: one immutable, validated model per mechanism, discriminated by its name.

These models are the per-mechanism block of a training configuration: every default and bound is
defined here once, and the CLI options, the Prefect forms and the epsilon planner read them from here.
Fields with the same name in several mechanisms mean the same thing and share one default (a test
checks it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from uedp.privacy.accounting.kinds import AccountantKind
from uedp.privacy.attribution import HolderChoice
from uedp.privacy.sanitization.choices import MappingMode, Metric, check_strategy


def names_of(params: type[BaseModel]) -> dict[str, list[str]]:
    """Each parameter's field name and the other names it accepts, in order (``rounds``: also ``steps``)."""
    out: dict[str, list[str]] = {}
    for name, info in params.model_fields.items():
        choices = getattr(info.validation_alias, "choices", None) or [name]
        out[name] = [name, *(c for c in choices if isinstance(c, str) and c != name)]
    return out


def one_name_only(mechanism: str, given: list[str]) -> str:
    """The rule for a parameter given under several of its names, in one place for every front end."""
    others = " and ".join(given[1:])
    return (f"{mechanism} takes {given[0]} under one name: give {given[0]} only ({others} "
            f"{'is its alias' if len(given) == 2 else 'are its aliases'})")


class MechanismParams(BaseModel):
    """Common base: frozen, unknown fields rejected (a typo must not silently fall back to a default)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    mechanism: str
    # The parameters :meth:`label` shows (a sweep's grid names the others in the run's name).
    label_fields: ClassVar[tuple[str, ...]] = ()
    # The privacy unit, in words, of the mechanisms these parameters configure: read by the registry's spec
    # (privacy/mechanisms/specs/) and by the mechanism's statement, each without importing the other.
    unit_words: ClassVar[str] = "none"
    # The field that sets the training's length (a run's name shows it when it is not the default).
    length_field: ClassVar[str] = "steps"
    # sampling=planned ranks the candidate splits with this accountant (milliseconds a candidate where PLD takes
    # seconds); None: with the run's own. The chosen split is then planned with the run's own either way.
    rank_accountant: ClassVar[AccountantKind | None] = "rdp"

    @model_validator(mode="before")
    @classmethod
    def _one_name_each(cls, data: Any) -> Any:
        """A parameter is given under one of its names: ``rounds`` and its alias ``steps`` together are
        refused wherever a configuration is written (flags, --config, --set, a Prefect form), never
        resolved by which came first. (Shared settings of several mechanisms, a sweep's or the demo's,
        hold ``steps`` as dpsgd's own parameter: ``TrainConfig.for_mechanism`` passes each one name.)"""
        if isinstance(data, dict):
            for names in names_of(cls).values():
                given = [n for n in names if data.get(n) is not None]
                if len(given) > 1:
                    raise ValueError(one_name_only(str(data.get("mechanism", cls.__name__)), given))
        return data

    def label(self) -> str:
        """The name runs of these parameters are shown under (report rows, run names): the mechanism's,
        plus a parameter that makes a different mechanism of it (uedp-bounded's k)."""
        return self.mechanism

    @property
    def steps_run(self) -> int:
        """Optimizer steps or rounds this configuration asks for."""
        raise NotImplementedError

    # What services ask of any mechanism's parameters, answered here so that none reads a field by name
    # (tests/test_architecture.py refuses getattr on parameters outside privacy/).

    @property
    def stated_delta(self) -> float | None:
        """The delta the run states; None for a mechanism without a central guarantee."""
        return None

    @property
    def clip_bound(self) -> float | None:
        """The L2 bound a unit's contribution is clipped to (the sensitivity's scale); None without clipping."""
        return None

    @property
    def plans_sampling(self) -> bool:
        """Whether the planner chooses the sampling rate and rounds (``sampling=planned``) before training."""
        return False

    @property
    def vectorizes_users(self) -> bool:
        """Whether a round's users train at once (torch.func.vmap over every weight)."""
        return False

    def tokens_per_update(self, max_len: int) -> int | None:
        """The most tokens one sampled user's update reads (its contribution cap), for the planner's compute
        budget; None for a mechanism that samples no users."""
        return None

    def length(self) -> tuple[str, int, int] | None:
        """The training's length as its field names it, its value and the field's default (None: parameters
        without that field, such as a plugin's that count their length otherwise)."""
        field = type(self).model_fields.get(self.length_field)
        if field is None:
            return None
        return self.length_field, int(getattr(self, self.length_field)), int(field.default)

    def holds(self, values: Mapping[str, Any]) -> bool:
        """Whether every one of ``values`` (parameter name -> value) is already this configuration's."""
        current = self.model_dump()
        return all(name in current and current[name] == value for name, value in values.items())

    @property
    def budget(self) -> float | None:
        """The epsilon the run is set to reach, when it is set by one (names the run)."""
        return None


class NoiselessParams(MechanismParams):
    """Ordinary training (noiseless, deid, and training on a local-DP release)."""

    mechanism: Literal["noiseless", "deid"] = "noiseless"
    steps: int = Field(300, ge=1, description="optimizer steps of step-based training (noiseless, deid, dpsgd, "
                                              "selective, local DP); userdp/uedp count rounds instead")
    batch_size: int = Field(32, ge=1, description="batch size; dpsgd: expected Poisson batch size")
    lr: float = Field(1e-3, gt=0, description="learning rate (Adam) of step-based training")

    @property
    def steps_run(self) -> int:
        return self.steps


# One rule for the noise of every mechanism with a central guarantee, stated here once: the parameter
# texts below, the validator, the CLI's errors, config files and the Prefect forms all read it.
DEFAULT_NOISE_MULTIPLIER = 1.0
NOISE_OR_TARGET = "give at most one of noise_multiplier and target_epsilon"


class PrivateParams(MechanismParams):
    """What every mechanism with a central guarantee takes: noise or a target, delta, the accountant."""

    noise_multiplier: float | None = Field(
        None, gt=0, description=f"noise multiplier z (noise std = z * sensitivity); {DEFAULT_NOISE_MULTIPLIER:g} when "
                                f"target_epsilon is unset ({NOISE_OR_TARGET})")
    target_epsilon: float | None = Field(None, gt=0, description=f"calibrate z so the run ends at this epsilon "
                                                                 f"({NOISE_OR_TARGET})")
    clip: float = Field(1.0, gt=0, description="L2 clipping bound: per example (dpsgd, selective) or per user delta")
    delta: float = Field(1e-5, gt=0, lt=1, description="target delta")
    accountant: AccountantKind = Field("pld", description="pld (tightest) or rdp")
    max_epsilon: float | None = Field(None, gt=0, description="budget: stop before a round that would exceed it")

    @property
    def budget(self) -> float | None:
        return self.target_epsilon

    @property
    def stated_delta(self) -> float | None:
        return self.delta

    @property
    def clip_bound(self) -> float | None:
        return self.clip

    @model_validator(mode="before")
    @classmethod
    def _noise_or_target(cls, data: Any) -> Any:
        """Both given: refused (which one would win is not the user's to guess). Neither: the default z."""
        if not isinstance(data, dict):
            return data
        noise, target = data.get("noise_multiplier"), data.get("target_epsilon")
        if noise is not None and target is not None:
            raise ValueError(NOISE_OR_TARGET)
        return {**data, "noise_multiplier": DEFAULT_NOISE_MULTIPLIER} if noise is None and target is None else data


class DpSgdParams(PrivateParams):
    mechanism: Literal["dpsgd"] = "dpsgd"
    unit_words: ClassVar[str] = "one training sequence"
    steps: int = Field(300, ge=1, description="optimizer steps")
    batch_size: int = Field(32, ge=1, validation_alias=AliasChoices("batch_size", "expected_batch_size"),
                            description="batch size; dpsgd: expected Poisson batch size")
    lr: float = Field(1e-3, gt=0, description="learning rate (Adam) of step-based training")
    per_sample: Literal["ghost", "exact", "opacus"] = Field(
        "ghost", description="dpsgd, selective: per-example clipping by ghost norms (fast; layers without a rule are "
                             "materialised exactly; a model family not verified for it takes the exact path with a "
                             "warning), exact (each example's own backward pass: any model, slowest) or Opacus' "
                             "per-sample gradients (recurrent selective always uses Opacus)")
    max_physical_batch: int | None = Field(
        None, ge=1, description="process the Poisson batch in micro-batches of at most this many sequences (memory); "
                                "the sampled batch is never truncated or resized")

    @property
    def steps_run(self) -> int:
        return self.steps


class SelectiveParams(DpSgdParams):
    """Selective DP: DP-SGD under replace-one adjacency (pld only), after a noiseless phase on redacted
    text (transformers) or with the state after each private token noised (LSTM)."""

    unit_words: ClassVar[str] = ("one sensitive token's value (Selective DP, replace-one; spans the detector missed "
                                 "are not covered)")

    mechanism: Literal["selective"] = "selective"  # type: ignore[assignment]
    public_steps: int = Field(300, ge=0, description="selective (transformers): noiseless steps on the redacted "
                                                     "corpus first")
    hidden_clip: float = Field(1.0, gt=0, description="selective with lstm: L2 bound of the state after a private token")

    @property
    def steps_run(self) -> int:
        return self.public_steps + self.steps


ServerOptimizerKind = Literal["sgd", "momentum", "adam"]
# The server learning rate each server optimizer takes when none is given (privacy/mechanisms/server_optimizer.py).
DEFAULT_SERVER_LR: dict[str, float] = {"sgd": 1.0, "momentum": 0.1, "adam": 1e-3}


class UserDpParams(PrivateParams):
    """DP-FedAvg (userdp) and the rounds of uedp."""

    mechanism: Literal["userdp"] = "userdp"
    unit_words: ClassVar[str] = "one user (all of their sentences)"
    length_field: ClassVar[str] = "rounds"
    rounds: int = Field(30, ge=1, validation_alias=AliasChoices("rounds", "steps"),
                        description="DP-FedAvg rounds (userdp, uedp)")
    q_user: float = Field(0.5, gt=0, le=1, description="sampling probability of a user per round")
    local_steps: int = Field(5, ge=1, description="local SGD steps per sampled user")
    local_batch_size: int = Field(8, ge=1, description="batch size of the local steps")
    local_lr: float = Field(0.5, ge=0, description="learning rate of the local steps")
    user_text: Literal["sentences", "chunks"] = Field(
        "sentences", description="userdp, uedp-bounded, uedp: what a sampled user's local batches hold: sentences "
                                 "(each its own sequence) or chunks (the user's consecutive sentences packed into "
                                 "sequences of at most max_len tokens, drawn at random: Chua et al. 2024). Either way "
                                 "an update reads at most local_steps x local_batch_size of them and is clipped as one "
                                 "user's delta")
    local_update: Literal["steps", "gradient"] = Field(
        "steps", description="userdp, uedp: what a sampled user returns: steps (DP-FedAvg: local_steps SGD steps) or "
                             "gradient (user-level DP-SGD: the gradient of one batch of local_batch_size of its own "
                             "sentences, i.e. one step at local_lr 1; the server optimizer defaults to adam)")
    server_optimizer: ServerOptimizerKind = Field(
        "sgd", description="userdp, uedp: what the server does with each round's noised average (post-processing, no "
                           "epsilon): sgd (DP-FedAvg), momentum (DP-FedAvgM) or adam (DP-FedAdam, Reddi et al. 2021)")
    server_lr: float = Field(1.0, gt=0, description="server learning rate applied to the averaged noised update "
                                                    "(when not given: 1 for sgd, 0.1 for momentum, 0.001 for adam)")
    server_beta1: float = Field(0.9, ge=0, lt=1, description="server momentum (momentum) or Adam's beta1 (adam)")
    server_beta2: float = Field(0.99, ge=0, lt=1, description="adam: the server's second-moment decay beta2")
    server_tau: float = Field(1e-3, gt=0, description="adam: the server's adaptivity tau, added to sqrt(v)")
    sampling: Literal["fixed", "planned"] = Field(
        "fixed", description="userdp, uedp-bounded, uedp with a target epsilon: fixed (q_user and rounds as given) or "
                             "planned (the planner's split of the same budget, rounds x q_user x the DP or declared "
                             "count of users, with the least noise-to-signal: `uedp epsilon --choose-sampling`)")
    weight_cap: float = Field(1.0, gt=0, description="userdp: w_u = min(n_u / weight_cap, 1); uedp weighs every user 1")
    vectorize_users: bool = Field(False, description="train a round's users at once (torch.func.vmap; GPT-2 only)")
    adaptive_clip: bool = Field(False, description="userdp, uedp-bounded: clip to a DP estimate of the target_quantile "
                                "of the users' update norms (Andrew et al. 2021); clip is the starting value")
    target_quantile: float = Field(0.5, gt=0, lt=1, description="adaptive_clip: the quantile gamma of the users' update "
                                   "norms the clip tracks")
    clip_lr: float = Field(0.2, gt=0, description="adaptive_clip: the clip's learning rate eta, each round "
                           "C <- C exp(-eta (share of users within C - gamma))")
    quantile_noise: float | None = Field(None, gt=0, description="adaptive_clip: noise std sigma_b of the count of "
                                         "users within the clip (default: expected sampled users / 20, q_user N / 20); "
                                         "must exceed z / 2")

    @property
    def steps_run(self) -> int:
        return self.rounds

    @property
    def plans_sampling(self) -> bool:
        return self.sampling == "planned"

    def tokens_per_update(self, max_len: int) -> int | None:
        """The most tokens one user's update reads: its contribution cap, local_steps x local_batch_size
        sequences (sentences, or chunks of them) of at most ``max_len`` tokens each."""
        return self.local_steps * self.local_batch_size * max_len

    @property
    def vectorizes_users(self) -> bool:
        return self.vectorize_users

    @model_validator(mode="after")
    def _planned_for_a_target(self) -> UserDpParams:
        if self.sampling == "planned" and self.target_epsilon is None:
            raise ValueError("sampling=planned splits the budget at a target epsilon: give target_epsilon")
        return self

    @model_validator(mode="before")
    @classmethod
    def _defaults_of_the_update_rule(cls, data: Any) -> Any:
        """Defaults that depend on other settings, filled only where not given:

        * ``local_update=gradient`` is one local step at learning rate 1 (the user's delta is minus its
          gradient) with Adam on the server (Charles et al. 2024; Chua et al. 2024); other local settings
          given with it are refused, as they would silently mean something else;
        * the server learning rate suits the server optimizer (Adam's step is about its learning rate per
          coordinate whatever the update's scale; sgd's is the update itself)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("local_update") == "gradient":
            for name, value in (("local_steps", 1), ("local_lr", 1.0)):
                if data.get(name) is not None and float(data[name]) != value:
                    raise ValueError(f"local_update=gradient takes one local step at learning rate 1: {name} "
                                     f"{data[name]} would make it local SGD (use local_update=steps for that)")
                data[name] = value
            data.setdefault("server_optimizer", "adam")
        if data.get("server_lr") is None and data.get("server_optimizer"):
            data["server_lr"] = DEFAULT_SERVER_LR.get(str(data["server_optimizer"]), 1.0)
        return data


class UeDpParams(UserDpParams):
    """userdp's parameters plus the entity sampling rates; ``uedp-naive`` selects the f_E estimator."""

    mechanism: Literal["uedp", "uedp-naive"] = "uedp"  # type: ignore[assignment]
    unit_words: ClassVar[str] = ("one user and one sensitive entity (all sentences of the user, and all sentences "
                                 "with the entity)")
    q_entity: float = Field(0.5, gt=0, le=1, description="uedp: sampling probability of a detected entity per round")
    q_extended: float = Field(0.5, gt=0, le=1, description="uedp: sampling probability of a sentence with no entity")
    truncation_share: float = Field(0.1, gt=0, lt=1, description="uedp: share of delta charged to more than M users "
                                                                 "being sampled in some round")
    count_bound_share: float = Field(0.1, gt=0, lt=1, description="uedp: share of delta charged to a failed DP upper "
                                                                  "bound on the number of users")

    @property
    def naive(self) -> bool:
        return self.mechanism == "uedp-naive"

    @model_validator(mode="after")
    def _fixed_clip(self) -> UeDpParams:
        if self.adaptive_clip:
            raise ValueError("uedp does not adapt its clip (adaptive_clip is implemented for userdp and uedp-bounded): "
                             "give it a fixed clip")
        return self

    @model_validator(mode="after")
    def _weight_one(self) -> UeDpParams:
        if self.weight_cap != 1.0:
            raise ValueError("uedp weighs every user 1: a weight counting a user's sentences changes when an entity "
                             "is added, even in rounds where it is not sampled (weight_cap applies to userdp only)")
        return self


class UeDpBoundedParams(UserDpParams):
    """userdp's parameters plus the bound on holders per entity (multi-attribution DP)."""

    mechanism: Literal["uedp-bounded"] = "uedp-bounded"  # type: ignore[assignment]
    unit_words: ClassVar[str] = ("one user and one detected entity: the contents of every sentence of the user and "
                                 "of every sentence with the entity (substitution adjacency; the attribution graph "
                                 "public)")
    holders_per_entity: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto", description="uedp-bounded: k, the most users per entity whose sentences with it are kept; noise grows "
                            "with 1 + k. auto (with a target epsilon): the largest k whose noise-to-signal stays where "
                            "measured runs learn, from the attribution graph (the data kept) and the planner (the noise)")
    holder_choice: HolderChoice = Field("best", description="uedp-bounded: how holders are chosen from the attribution "
                                        "graph: best (of gain and top-count, each improved by local search, and the "
                                        "baseline), gain, top-count, ascending-degree (the baseline greedy)")
    label_fields: ClassVar[tuple[str, ...]] = ("holders_per_entity",)
    rank_accountant: ClassVar[AccountantKind | None] = None  # rdp cannot account substitution: ranked with pld

    def label(self) -> str:
        """k makes a different mechanism of it: uedp-bounded-k4 and -k1 are separate rows and run names."""
        return f"uedp-bounded-k{self.holders_per_entity}"

    @field_validator("holders_per_entity", mode="before")
    @classmethod
    def _k_or_auto(cls, value: Any) -> Any:
        """One message for every bad k (the union's own errors name its branches, not the setting), and no
        boolean taken for 0 or 1."""
        number = value
        if isinstance(value, str) and value != "auto":
            try:
                number = int(value)
            except ValueError:
                number = None
        if value != "auto" and (isinstance(value, bool) or not isinstance(number, int) or number < 0):
            raise ValueError(f"k is a whole number >= 0, or auto (got {value!r})")
        return number

    @model_validator(mode="after")
    def _pld_only(self) -> UeDpBoundedParams:
        if self.accountant != "pld":
            raise ValueError("uedp-bounded is accounted under substitution (replace-one), which only the pld "
                             "accountant supports for Poisson sampling")
        return self


Keep = Literal["none", "stopwords", "non-entities"]


class SanitizationSettings(BaseModel):
    """How custext / santext rewrite a train split (shared by ``uedp sanitize`` and training on a release)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    embeddings: str | None = Field(None, description="custext/santext: vector file (GloVe/word2vec text, .npz) or "
                                                     "model:<pretrained folder>")
    k: int = Field(50, ge=1, description="custext: size of each token's output set")
    mapping: MappingMode = Field("balanced", description="custext: aggressive, balanced or conservative")
    metric: Metric = Field("euclidean", description="custext: euclidean (GloVe) or cosine (counter-fitted)")
    strategy: str = Field("token", description="custext/santext: token (one independent draw per occurrence; "
                                               "record and dataset were withdrawn)")
    keep: Keep = Field("none", description="custext/santext: none; stopwords (the thesis' + variants); non-entities "
                                           "(sanitize only detected entities of the chosen categories)")
    vocab_limit: int | None = Field(None, ge=2, description="custext/santext: use the first N vectors (most frequent)")
    attack_model: str | None = Field(None, description="custext/santext: the attacker's folder for the mask-token "
                                                       "inference attack on the release: a Hugging Face masked LM "
                                                       "(save_pretrained, e.g. bert-base-uncased) or a bigram cloze "
                                                       "model (privacy/attacks/cloze.py)")

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, value: str) -> str:
        return check_strategy(value)


class LocalDpParams(NoiselessParams, SanitizationSettings):
    """custext / santext: the train split is sanitized under local DP (per-token ``epsilon``), then trained
    noiselessly; the valid and test splits stay original."""

    mechanism: Literal["custext", "santext"] = "custext"  # type: ignore[assignment]
    epsilon: float | None = Field(None, gt=0, validation_alias=AliasChoices("epsilon", "target_epsilon"),
                                  description="custext/santext: per-token epsilon of the exponential mechanism")

    @property
    def budget(self) -> float | None:
        return self.epsilon

    @model_validator(mode="after")
    def _release_settings(self) -> LocalDpParams:
        if self.embeddings is None or self.epsilon is None:
            raise ValueError(f"{self.mechanism} needs embeddings and its per-token epsilon (target_epsilon)")
        return self
