"""The flags derived from the configuration models (each setting's default and help defined once, on its
model) and the mechanism names the help lists. Importing this imports the configuration models and the
mechanism registry, so only the command groups that take these flags do (:mod:`uedp.commands`)."""

from __future__ import annotations

from uedp.options import derived_parameters, list_fields
from uedp.privacy.mechanisms import registry
from uedp.services.config import MechanismSettings, RunSettings, TrainConfig
from uedp.services.pretrain import PretrainConfig
from uedp.services.sanitize_config import SanitizeConfig

MECHANISMS_HELP = ", ".join(registry.names())


ALIASES = {"model_size": ["--model-config"], "strategy": ["--sanitize-strategy"]}


# Every shared run setting and every mechanism parameter is a flag of train (and of sweep); its default
# and help come from the configuration models, where each is defined once.
TRAIN_OPTIONS = derived_parameters([RunSettings, TrainConfig, MechanismSettings], skip={"dataset", "params"},
                                   aliases=ALIASES)


SWEEP_OPTIONS = derived_parameters([RunSettings, MechanismSettings], aliases=ALIASES)


DEMO_OPTIONS = derived_parameters([MechanismSettings], aliases=ALIASES)


PLAN_OPTIONS = derived_parameters([MechanismSettings], skip={"embeddings", "k", "mapping", "metric", "strategy", "keep",
                                                             "vocab_limit", "attack_model", "epsilon"})


SANITIZE_OPTIONS = derived_parameters([SanitizeConfig], skip={"dataset", "randomness"}, aliases=ALIASES)


PRETRAIN_OPTIONS = derived_parameters([PretrainConfig], skip={"home", "files", "eval_files"},
                                      aliases={"dataset": ["--name"]})


LISTED = list_fields(RunSettings, TrainConfig, MechanismSettings, SanitizeConfig)
