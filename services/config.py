"""The typed configuration of one training run: the settings every mechanism shares, plus the chosen
mechanism's own parameters (a discriminated union over the registry), validated at the edge and logged
to MLflow as params.

Every default is defined once: shared settings here, mechanism parameters in
:mod:`privacy.mechanisms.params`. The CLI, the Prefect forms, the sweep and ``uedp epsilon`` read them
from these models. A configuration can also be written flat (``mechanism="userdp", q_user=0.1``): the
keys that are not shared settings go to the mechanism's parameters.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    create_model,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from uedp.detection.categories import Categories, default_categories
from uedp.models.checkpoints import checkpoint_kind, has_tokenizer, is_checkpoint_folder, is_run_download
from uedp.models.presets import (
    CHECKPOINT_KINDS,
    LORA_KINDS,
    SIZE_PRESETS,
    Device,
    ModelKind,
    Precision,
    SizePreset,
    Task,
    task_of,
)
from uedp.privacy.mechanisms import registry
from uedp.privacy.mechanisms.params import (
    MechanismParams,
    PrivateParams,
    names_of,
)
from uedp.privacy.mechanisms.registry import MechanismSpec, RunShape
from uedp.privacy.population import DEFAULT_COUNT_NOISE_STD
from uedp.privacy.sanitization.choices import LOCAL_DP_FACTS
from uedp.privacy.statement import RandomnessMode
from uedp.services.run_ids import is_run_id

if TYPE_CHECKING:  # the registry builds these at import; to a type checker they are their common bases
    MechanismName = str
    LocalDpName = str
    MechanismParamsUnion = MechanismParams
else:
    MechanismName = registry.name_literal()  # a choice list in the Prefect UI and in JSON schemas
    LocalDpName = Literal[tuple(LOCAL_DP_FACTS)]
    MechanismParamsUnion = registry.params_union()  # discriminated by ``mechanism``
STATIC_NAMES = frozenset(registry.names())  # the mechanisms the union above admits
# Empty in every deployment's defaults: a flow run on a worker of `uedp serve` writes where the stack
# was told to (UEDP_HOME), not into whatever folder the worker happens to run in.
HOME_HELP = ("data home (datasets, MLflow store); empty: the one `uedp serve` was given (UEDP_HOME), "
             "else ./.uedp")
RANDOMNESS_HELP = ("secure (default): sampling, noise and batch order from the operating system, never stored; "
                   "seeded: from the seed, reproducible, and the guarantee does not hold against anyone who knows it")


class RunSettings(BaseModel):
    """What every mechanism shares: the model, the data shape, randomness, devices, checkpoints, canaries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelKind = Field("gpt2", description="a checkpoint folder (any Hugging Face causal LM or sequence "
                             "classifier, trained with its own tokenizer), or a kind built from --model-config: gpt2 "
                             "or llama (next-word prediction), lstm (the Selective-DP paper's 200/200 LSTM), bert "
                             "(sequence classification), lstm-classifier (that LSTM with a head over classes)")
    model_size: SizePreset | str = Field("tiny", description="a size preset (gpt2, llama: tiny, small; lstm, "
                                         "lstm-classifier: tiny, paper; bert: tiny, small) or a pretrained checkpoint "
                                         "folder")
    tokenizer: str = Field("byte", description="'byte' (leak-free byte-level) or a pretrained tokenizer folder "
                                               "[default for a checkpoint folder: its own]")
    init_from: str | None = Field(None, description="start from the model a finished run logged (its MLflow run id, "
                                  "e.g. a noiseless run on a public corpus) or from a checkpoint folder; what it was "
                                  "trained on is treated as public, so a run on this same dataset is refused")
    tuned: str = Field("", description="a `uedp tune` search (its key) whose chosen learning rates and clip replace "
                       "the run's own; the search ran on public text, and a search on this run's text is refused")
    lora_rank: int = Field(0, ge=0, le=1024, description="train LoRA adapters of this rank instead of every weight "
                           "(0: full fine-tuning); clipping, noise and checkpoints then cover the adapters only")
    lora_alpha: float | None = Field(None, gt=0, description="LoRA's scale alpha (the update is alpha/r B A; "
                                     "unset: twice the rank)")
    lora_targets: list[str] = Field(default_factory=list, description="names of the layers LoRA adapts "
                                    "(default: peft's choice for the architecture, e.g. q_proj,v_proj)")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass: less "
                                         "memory for large models, about a third more compute")
    max_len: int = Field(96, ge=8, le=4096, description="tokens per sentence at most")
    control_codes: bool = Field(False, description="language models on a labelled corpus: read each sentence after "
                                "its class' control code ([label] text), so `uedp generate --labels` can ask the model "
                                "for text of a class; sentences without a class are left out")
    randomness: RandomnessMode = Field("secure", description=RANDOMNESS_HELP)
    public_count: int | None = Field(None, ge=1, description="dpsgd/userdp/uedp: declare the number of privacy units "
                                     "(sequences; users) public; default: a DP count composed into epsilon")
    count_noise: float = Field(DEFAULT_COUNT_NOISE_STD, gt=0, description="std of the Gaussian noise of the DP count "
                               "of units (sensitivity 1)")
    device: Device | str = Field("auto", description="auto (a GPU when there is one), cpu, cuda or cuda:N (or any "
                                 "torch device name in the form's second option)")
    precision: Precision = Field("auto", description="the training forward pass: auto (bf16 autocast on a GPU, float32 "
                                 "on a CPU), float32, or bf16 (autocast on any device: on a CPU with bf16 "
                                 "instructions, e.g. AVX512-BF16 or AMX, a 135M model trains about 1.4x faster). "
                                 "Weights, clipping, noise and evaluation stay float32; --vectorize-users and "
                                 "pretraining always train in float32")
    processes: int = Field(1, ge=1, description="torchrun processes (one per GPU); they split each round's users or "
                                                "examples and sum their clipped contributions")
    threads: int | None = Field(None, ge=1, description="torch threads per process (default: OMP_NUM_THREADS if set, "
                                "else the CPUs this process may use that are free of other work, shared among "
                                "its torchrun processes and UEDP_CONCURRENT_TRAININGS)")
    checkpoint_every: int = Field(25, ge=0, description="save a resumable checkpoint every N rounds (0: never)")
    canaries: int = Field(0, ge=0, description="made-up secrets planted in the training text, for `uedp attack`")
    canary_repeats: int = Field(1, ge=1, description="times each canary is planted")
    canary_formats: list[str] = Field(default_factory=lambda: ["digits:6"],
                                      description="digits:N, name, phone, email (cycled over the canaries)")
    canary_users: list[str] = Field(default_factory=list, description="users whose text hosts canaries (default: any)")
    audit_canaries: int = Field(0, ge=0, description="one-run audit: m made-up canaries at the mechanism's privacy "
                                "unit, each planted by a secret fair coin; `uedp attack RUN --kind audit` scores them "
                                "(0: none; at least 2, and more give tighter bounds, e.g. 256)")
    log_model: bool = Field(False, description="store the trained model as an MLflow artifact")

    @model_validator(mode="before")
    @classmethod
    def _checkpoint_folder(cls, data: Any) -> Any:
        """``model=FOLDER``: the folder's kind (causal LM or classifier) with the folder as its checkpoint, and
        a llama folder is any causal LM's; folders are named by their absolute path (the same checkpoint, the
        same fingerprint, wherever the command ran). A checkpoint kind trains with the folder's own tokenizer
        unless another folder is named (the byte tokenizer never fits a downloaded checkpoint); so does
        ``--init-from FOLDER``."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        model = data.get("model")
        if isinstance(model, str) and model not in SIZE_PRESETS:
            data["model"], data["model_size"] = checkpoint_kind(model), model
        size = data.get("model_size")
        if data.get("model") == "llama" and isinstance(size, str) and is_checkpoint_folder(size):
            data["model"] = "causal-lm"
        for key in ("model_size", "init_from", "tokenizer"):
            if isinstance(data.get(key), str) and is_checkpoint_folder(data[key]):
                data[key] = str(Path(data[key]).expanduser().resolve())
        init = str(data.get("init_from") or "")
        # a plain folder's tokenizer; a run's model folder keeps the run's tokenizer setting (checked against it)
        own = init if is_checkpoint_folder(init) and not is_run_download(init) else None
        if data.get("model") in CHECKPOINT_KINDS and isinstance(data.get("model_size"), str):
            own = own or data["model_size"]
        if own is not None and data.get("tokenizer") in (None, "byte") and has_tokenizer(own):
            data["tokenizer"] = own
        return data

    @model_validator(mode="after")
    def _model_consistent(self) -> RunSettings:
        if self.model in CHECKPOINT_KINDS and self.model_size in get_args(SizePreset):
            raise ValueError(f"model {self.model} loads a checkpoint folder: pass --model FOLDER")
        if self.lora_rank and self.model not in LORA_KINDS:
            raise ValueError(f"LoRA (lora_rank) adapts Hugging Face transformers models, not {self.model}")
        if (self.lora_targets or self.lora_alpha is not None) and not self.lora_rank:
            raise ValueError("lora_alpha and lora_targets need lora_rank > 0")
        if self.gradient_checkpointing and self.model in ("lstm", "lstm-classifier"):
            raise ValueError("gradient checkpointing is for Hugging Face transformers models, not the lstm")
        if self.control_codes and task_of(self.model) != "lm":
            raise ValueError("control_codes write the class into a language model's text; a classifier reads it as "
                             "its label already")
        return self

    @property
    def lora_scale(self) -> float:
        """LoRA's alpha: as set, else twice the rank (a common choice)."""
        return self.lora_alpha if self.lora_alpha is not None else 2.0 * self.lora_rank

    @field_validator("canary_formats")
    @classmethod
    def _known_formats(cls, formats: list[str]) -> list[str]:
        from uedp.privacy.attacks.canaries import canary_format  # torch: only when a configuration names formats

        for name in formats:
            canary_format(name)  # unknown formats fail here, before any work, naming the field
        return formats


class TrainConfig(RunSettings):
    """One configuration: dataset x mechanism (with its parameters) x categories x seed."""

    dataset: str
    categories: Categories = Field(default_factory=default_categories, validate_default=True,
                                   description="entity categories treated as sensitive (names, aliases such as PER, "
                                               "or composites such as PII)")
    seed: int = Field(0, description="initial weights (always); sampling and noise too only with randomness=seeded")
    variant: str = Field("", description="set by a sweep's grid: the grid values this run adds to its name "
                                         "(e.g. q_user=0.1)")
    params: MechanismParamsUnion = Field(description="the mechanism and its parameters")

    @model_validator(mode="before")
    @classmethod
    def _flat_form(cls, data: Any) -> Any:
        """``TrainConfig(dataset=..., mechanism="userdp", q_user=0.1)``: the non-shared keys are the mechanism's."""
        if isinstance(data, dict) and "params" not in data and "mechanism" in data:
            return nest_flat(data, set(cls.model_fields), "params")
        return data

    @field_validator("params", mode="wrap")
    @classmethod
    def _late_registered(cls, value: Any, handler: Any) -> Any:
        """A mechanism registered after this module was imported (a plugin, a test fixture) is validated by
        its own parameters model; the ones known at import go through the union (and the Prefect form)."""
        name = value.get("mechanism") if isinstance(value, dict) else None
        if name is not None and name not in STATIC_NAMES and name in registry.names():
            return registry.get(name).params.model_validate(value)
        return handler(value)

    @field_serializer("params")
    def _dump_params(self, params: MechanismParams, info: SerializationInfo) -> dict[str, Any]:
        """Each mechanism's parameters as its own model dumps them (a late-registered one is not in the union)."""
        return params.model_dump(mode=info.mode)

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        self.spec.check(self.params, self.shape)
        if (self.canaries or self.audit_canaries) and self.task != "lm":
            raise ValueError("canaries are planted in language-model training text (not for classifiers)")
        if self.lora_rank and self.params.vectorizes_users:
            raise ValueError("vectorize_users trains every weight of a GPT-2; with LoRA leave it off")
        if self.audit_canaries:
            if isinstance(self.spec.audit, str):
                raise ValueError(f"audit canaries: {self.mechanism} cannot be audited this way: {self.spec.audit}")
            if self.audit_canaries < 2:
                raise ValueError("audit canaries: at least 2 (e.g. 256)")
            if self.processes > 1:
                raise ValueError("audit canaries are planted by one process (train with processes=1)")
        return self

    @classmethod
    def for_mechanism(cls, mechanism: str, **values: Any) -> TrainConfig:
        """A configuration of ``mechanism`` from flat values shared by several mechanisms (a sweep's or the
        demo's base): shared settings are kept, each mechanism parameter takes the first of its names that
        is set (``rounds``, then ``steps``), and parameters of other mechanisms are left out."""
        own = {k: v for k, v in values.items() if k in cls.model_fields}
        params: dict[str, Any] = {"mechanism": mechanism}
        for name, names in parameter_names(registry.get(mechanism).params).items():
            given = [n for n in names if n in values]
            chosen = next((n for n in given if values[n] is not None), given[0] if given else None)
            if chosen is not None and name != "mechanism":
                params[name] = values[chosen]
        return cls(**own, params=params)

    @classmethod
    def from_logged(cls, data: dict[str, Any]) -> TrainConfig:
        """The configuration a run logged (``resolved_config.json``), also from runs logged before the
        parameters were nested: those are flat, hold every mechanism's fields and a ``local_dp`` block."""
        if "params" in data:
            params = dict(data["params"])
            if params.get("target_epsilon") is not None:  # an older uedp let a target replace a given z
                params["noise_multiplier"] = None
            return cls.model_validate({**data, "params": params})
        legacy = {k: v for k, v in data.items() if k != "local_dp"} | dict(data.get("local_dp") or {})
        if legacy.get("target_epsilon") is not None:
            legacy["noise_multiplier"] = None
        mechanism = str(legacy.pop("mechanism"))
        if "rounds" not in legacy and "rounds" in parameter_names(registry.get(mechanism).params):
            legacy["rounds"] = legacy.pop("steps", None)  # flat runs counted userdp/uedp rounds as steps
        return cls.for_mechanism(mechanism, **{k: v for k, v in legacy.items() if v is not None or k == "noise_multiplier"})

    @property
    def mechanism(self) -> str:
        return str(self.params.mechanism)

    @property
    def spec(self) -> MechanismSpec:
        return registry.get(self.mechanism)

    @property
    def task(self) -> Task:
        return task_of(self.model)

    @property
    def utility_metric(self) -> str:
        """What the held-out splits are scored by: perplexity (language models) or error (classifiers)."""
        return "error" if self.task == "classification" else "perplexity"

    @property
    def shape(self) -> RunShape:
        return RunShape(self.model, self.task == "classification", self.processes, self.canaries, self.seed,
                        self.audit_canaries, byte_tokens=self.tokenizer == "byte")

    @property
    def is_private(self) -> bool:
        return self.spec.private

    @property
    def delta(self) -> float:
        """The run's delta; for a mechanism without one, the default delta (what an audit's bound is stated at)."""
        stated = self.params.stated_delta
        return float(stated if stated is not None else PrivateParams.model_fields["delta"].default)

    @property
    def total_steps(self) -> int:
        return sum(steps for _, steps in self.spec.schedule(self.params, self.shape))

    def size_is_preset(self) -> bool:
        return self.model_size in SIZE_PRESETS[self.model]

    def run_name(self, with_length: bool = True) -> str:
        """What tells runs apart, most telling first, so a truncated name in MLflow's runs table still
        reads: ``uedp-eps8-PERSON+LOC-s0``, ``userdp-eps8-s0`` (its training ignores categories),
        ``dpsgd-lstm-eps3-s1`` (a model other than the default GPT-2), ``dpsgd-SmolLM2-135M-lora8-eps3-s0`` (a
        checkpoint folder by its name, with LoRA's rank), ``noiseless-from-734e0e8a-steps150-s0`` (steps or
        rounds other than the mechanism's default: a 1-step and a 150-step run are not one name).
        ``with_length=False``: the name without that part, as uedp named every run before it had one."""
        budget = self.params.budget
        model = Path(self.model_size).name if self.model in CHECKPOINT_KINDS else self.model
        parts = [self.label, *([model] if model != "gpt2" else []), *([f"lora{self.lora_rank}"] if self.lora_rank else []),
                 *([f"from-{_start_name(self.init_from)}"] if self.init_from else []),
                 *(self._length_part() if with_length else []),
                 *([f"eps{budget:g}"] if budget and self.is_private else []),
                 *(["+".join(self.categories)] if self.spec.uses_categories(self.params) else []), f"s{self.seed}"]
        return "-".join(parts)

    def _length_part(self) -> list[str]:
        """``steps150`` / ``rounds50`` when the training's length is not its mechanism's default."""
        length = self.params.length()
        if length is None or length[1] == length[2]:
            return []
        return [f"{length[0]}{length[1]}"]

    @property
    def starts_from_a_model(self) -> bool:
        """Whether training starts from trained weights (``--init-from``, or a checkpoint folder as the model)
        rather than from random ones."""
        return bool(self.init_from) or self.model in CHECKPOINT_KINDS

    @property
    def step_word(self) -> str:
        """What a configuration counts: ``round`` (the federated mechanisms) or ``step``."""
        return "round" if "rounds" in type(self.params).model_fields else "step"

    @property
    def label(self) -> str:
        """The mechanism as reports and run names show it: with k for uedp-bounded, and a sweep's other
        grid values."""
        return self.params.label() + (f"-{self.variant}" if self.variant else "")

    def settings(self) -> dict[str, Any]:
        """Everything that defines this configuration, flat: what a report must not average across. The
        seed is left out (seeds of one configuration are averaged), and so is what changes how a run is
        carried out but not its result (device, threads, processes, checkpoints, logging)."""
        ignored = NOT_A_SETTING | ({"categories"} if not self.spec.uses_categories(self.params) else set())
        return {k: v for k, v in self.model_dump(mode="json", exclude={"params"}).items()
                if k not in ignored} | self.params.model_dump(mode="json")

    def flat(self) -> dict[str, Any]:
        """Shared settings and the mechanism's parameters side by side (MLflow params, one level)."""
        return {**self.model_dump(exclude={"params"}), **self.params.model_dump()}

    def fingerprint(self) -> str:
        """Content hash of everything that shapes training (not the device): names its checkpoint, and finds
        a finished run again. A setting added later is left out at the value that trains as before it existed,
        so a configuration's fingerprint does not move when uedp gains a setting it does not use."""
        fields = self.model_dump(exclude={"device", "threads", "log_model", "checkpoint_every", "variant"})
        fields = {k: v for k, v in fields.items() if not _as_before(k, v)}
        fields["params"] = {k: v for k, v in fields["params"].items() if not _as_before(k, v)}
        return hashlib.sha256(repr(sorted(fields.items())).encode()).hexdigest()[:16]


# Settings added after runs were fingerprinted, with the value at which a configuration trains exactly as it did
# before the setting existed (TrainConfig.fingerprint leaves them out at that value).
AS_BEFORE_ADDED: dict[str, Any] = {"user_text": "sentences", "control_codes": False, "precision": "auto"}


def _as_before(name: str, value: Any) -> bool:
    return name in AS_BEFORE_ADDED and AS_BEFORE_ADDED[name] == value


# What does not make a different configuration (TrainConfig.settings).
NOT_A_SETTING = frozenset({"seed", "device", "threads", "processes", "checkpoint_every", "log_model", "variant"})


def _start_name(init_from: str) -> str:
    """A starting model in a run name: a run by the first 8 characters of its id (also the folder
    ``--init-from`` downloads it to), a checkpoint folder by its name."""
    name = Path(init_from).name
    return name[:8] if is_run_id(name) else name


def nest_flat(data: dict[str, Any], own: set[str], nested: str, others: dict[str, set[str]] | None = None
              ) -> dict[str, Any]:
    """Move the keys of a flat mapping that are not ``own`` fields into the block ``nested`` (or into the
    block of ``others`` whose field names hold them), so configurations can be written flat."""
    out: dict[str, Any] = {k: v for k, v in data.items() if k in own}
    for key, value in data.items():
        if key in own:
            continue
        block = next((name for name, fields in (others or {}).items() if key in fields), nested)
        out.setdefault(block, {})
        if isinstance(out[block], BaseModel):
            out[block] = out[block].model_dump()
        out[block][key] = value
    return out


def parameter_names(params: type[MechanismParams]) -> dict[str, list[str]]:
    """Each parameter's field name and the other names it accepts, in order (``rounds``: also ``steps``)."""
    return names_of(params)


def _settings_fields() -> dict[str, tuple[Any, FieldInfo]]:
    """Every mechanism parameter once, with its one default (first definition in registry order)."""
    fields: dict[str, tuple[Any, FieldInfo]] = {}
    for spec in registry.mechanisms().values():
        for name, info in spec.params.model_fields.items():
            if name != "mechanism" and name not in fields:
                plain = FieldInfo.merge_field_infos(info, validation_alias=None)
                fields[name] = (info.annotation, plain)
    return fields


# The sweep's and the demo's base: every mechanism parameter, each with its one default. A configuration
# of one mechanism takes the parameters it knows (``TrainConfig.for_mechanism``).
MechanismSettings: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "MechanismSettings", __config__=ConfigDict(extra="forbid", frozen=True), **_settings_fields())
