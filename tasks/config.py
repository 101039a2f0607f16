"""The typed configuration of one training run, validated at the edge and logged to MLflow as params."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from uedp.detection.categories import Categories
from uedp.models.factory import SIZE_PRESETS, ModelKind, Task, task_of
from uedp.privacy.attacks.canaries import canary_format
from uedp.privacy.mechanisms import MECHANISMS
from uedp.privacy.population import DEFAULT_COUNT_NOISE_STD
from uedp.privacy.sanitization.mechanisms import check_strategy

MechanismName = Literal["noiseless", "deid", "dpsgd", "selective", "userdp", "uedp", "uedp-naive", "custext", "santext"]
FEDERATED = ("userdp", "uedp", "uedp-naive")
LOCAL_DP = ("custext", "santext")
# Central mechanisms under add/remove adjacency: their unit count is private (PRIVACY.md rule 4).
COUNTED = ("dpsgd", *FEDERATED)
RANDOMNESS_HELP = ("secure (default): sampling, noise and batch order from the operating system, never stored; "
                   "seeded: from --seed, reproducible, and the guarantee does not hold against anyone who knows the seed")


class LocalDpSettings(BaseModel):
    """How custext and santext sanitize the train split (their epsilon is the configuration's target epsilon)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    embeddings: str = Field(description="vector file (GloVe/word2vec text, .npz) or model:<pretrained folder>")
    k: int = Field(50, ge=1, description="custext: output set size")
    mapping: Literal["aggressive", "balanced", "conservative"] = "balanced"
    metric: Literal["euclidean", "cosine"] = "euclidean"
    strategy: str = Field("token", description="token: one independent draw per occurrence (record and dataset "
                                               "were withdrawn: no per-token guarantee holds for them)")
    keep: Literal["none", "stopwords", "non-entities"] = "none"
    vocab_limit: int | None = Field(None, ge=2)
    attack_model: str | None = Field(None, description="masked-LM folder for the mask-token inference attack")

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, value: str) -> str:
        return check_strategy(value)


class TrainConfig(BaseModel):
    """One configuration: dataset x mechanism x categories x privacy parameters x seed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str
    mechanism: MechanismName
    categories: Categories = Field(default_factory=lambda: ["PERSON", "LOC", "ORG", "PHONE_NUMBER", "EMAIL_ADDRESS"],
                                  validate_default=True)
    model: ModelKind = Field("gpt2", description="gpt2 (next-word prediction), lstm (the Selective-DP paper's "
                                                 "200/200 LSTM) or bert (sequence classification)")
    model_size: str = Field("tiny", description="a size preset (gpt2: tiny, small; lstm: tiny, paper; bert: tiny, "
                                                "small) or a pretrained checkpoint folder / hub name")
    tokenizer: str = Field("byte", description="'byte' (leak-free byte-level) or a pretrained path / hub name")
    max_len: int = Field(96, ge=8, le=4096)
    steps: int = Field(300, ge=1, description="optimizer steps (noiseless, deid, dpsgd) or rounds (userdp, uedp)")
    batch_size: int = Field(16, ge=1, description="batch size; dpsgd: expected Poisson batch size")
    public_steps: int = Field(300, ge=0, description="selective: noiseless steps on the redacted corpus first")
    lr: float = Field(1e-3, gt=0)
    # userdp (DP-FedAvg) and uedp
    q_user: float = Field(0.5, gt=0, le=1)
    q_entity: float = Field(0.5, gt=0, le=1, description="uedp: sampling probability of a detected entity")
    q_extended: float = Field(0.5, gt=0, le=1, description="uedp: sampling probability of a sentence with no entity")
    noise_multiplier: float | None = Field(1.0, gt=0)
    target_epsilon: float | None = Field(None, gt=0)
    clip: float = Field(1.0, gt=0)
    hidden_clip: float = Field(1.0, gt=0, description="selective with lstm: L2 bound of the state after a private token")
    local_steps: int = Field(5, ge=1)
    local_batch_size: int = Field(8, ge=1)
    local_lr: float = Field(0.5, gt=0)
    server_lr: float = Field(1.0, gt=0)
    weight_cap: float = Field(1.0, gt=0, description="userdp: w_u = min(n_u / weight_cap, 1); uedp weighs every user 1")
    vectorize_users: bool = Field(False, description="userdp/uedp: train a round's users at once (torch.func.vmap)")
    delta: float = Field(1e-5, gt=0, lt=1)
    accountant: Literal["pld", "rdp"] = "pld"
    max_epsilon: float | None = Field(None, gt=0)
    seed: int = Field(0, description="initial weights (always); sampling and noise too only with randomness=seeded")
    randomness: Literal["secure", "seeded"] = Field("secure", description=RANDOMNESS_HELP)
    public_count: int | None = Field(None, ge=1, description="dpsgd/userdp/uedp: declare the number of units "
                                     "(sequences; users) public; default: a DP count composed into epsilon")
    count_noise: float = Field(DEFAULT_COUNT_NOISE_STD, gt=0, description="std of the Gaussian noise of the DP count "
                               "of units (sensitivity 1)")
    device: str = "auto"
    processes: int = Field(1, ge=1, description="torchrun processes (one per GPU); they split each round's "
                                                "users or examples and sum their clipped contributions")
    checkpoint_every: int = Field(25, ge=0, description="save a resumable checkpoint every N rounds (0: never)")
    canaries: int = Field(0, ge=0, description="made-up secrets planted in the training text, for `uedp attack`")
    canary_repeats: int = Field(1, ge=1, description="times each canary is planted")
    canary_formats: list[str] = Field(default_factory=lambda: ["digits:6"],
                                      description="digits:N, name, phone, email (cycled over the canaries)")
    canary_users: list[str] = Field(default_factory=list, description="users whose text hosts canaries (default: any)")
    log_model: bool = Field(False, description="store the trained model as an MLflow artifact")
    local_dp: LocalDpSettings | None = Field(None, description="custext / santext: the sanitization settings")

    @model_validator(mode="after")
    def _consistent(self) -> "TrainConfig":
        if self.is_private and self.noise_multiplier is None and self.target_epsilon is None:
            raise ValueError(f"{self.mechanism} needs --noise-multiplier or --target-epsilon")
        if self.mechanism in ("uedp", "uedp-naive") and self.weight_cap != 1.0:
            raise ValueError("uedp weighs every user 1 (a weight counting sentences changes when an entity is added); "
                             "weight_cap applies to userdp only")
        if self.vectorize_users and self.model != "gpt2":
            raise ValueError("vectorize_users is implemented for GPT-2 language models only")
        if self.mechanism in LOCAL_DP and (self.local_dp is None or self.target_epsilon is None):
            raise ValueError(f"{self.mechanism} needs sanitization settings (--embeddings) and its per-token "
                             "epsilon (--target-epsilon)")
        if self.mechanism in LOCAL_DP and self.canaries:
            raise ValueError("canaries are planted in the training text after sanitization would have run; "
                             "they are not supported with custext/santext yet")
        if self.processes > 1 and self.mechanism == "selective" and self.model == "lstm":
            raise ValueError("recurrent selective (lstm) runs in one process: its per-token state noise is drawn "
                             "inside the forward pass, which ranks cannot share")
        if self.canaries and self.task != "lm":
            raise ValueError("canaries are planted in language-model training text (not for classifiers)")
        return self

    @field_validator("canary_formats")
    @classmethod
    def _known_formats(cls, formats: list[str]) -> list[str]:
        for name in formats:
            canary_format(name)  # unknown formats fail here, before any work, naming the field
        return formats

    @property
    def task(self) -> Task:
        return task_of(self.model)

    def size_is_preset(self) -> bool:
        return self.model_size in SIZE_PRESETS[self.model]

    @property
    def is_private(self) -> bool:
        return self.mechanism not in ("noiseless", "deid")

    def run_name(self) -> str:
        budget = f"-eps{self.target_epsilon:g}" if self.target_epsilon and self.is_private else ""
        return f"{self.mechanism}-{self.model}-{'+'.join(self.categories)}{budget}-s{self.seed}"

    def fingerprint(self) -> str:
        """Content hash of everything that shapes training (not the device): names its checkpoint."""
        import hashlib

        fields = self.model_dump(exclude={"device", "log_model", "checkpoint_every"})
        return hashlib.sha256(repr(sorted(fields.items())).encode()).hexdigest()[:16]


assert set(MechanismName.__args__) == set(MECHANISMS), "TrainConfig and the mechanism registry disagree"  # type: ignore[attr-defined]
