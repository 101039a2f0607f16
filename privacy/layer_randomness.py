"""Randomness that layers of a model draw for themselves, kept out of private training.

The sensitivity bound of every central mechanism holds only if each unit's contribution is a function of
that unit's data, the global weights and the unit's own random stream (PRIVACY.md, rule 5). A layer that
draws its own randomness breaks this silently: dropout (Hugging Face checkpoints ship it at 0.1 for GPT-2,
BERT and most others) takes its masks from torch's *global* generator, which every user (userdp, uedp,
uedp-bounded) or every example of a batch (dpsgd, selective) consumes in turn. Adding one unit then
shifts the masks of every unit drawn after it, and the clipped sum moves by far more than the accounted
sensitivity (measured on a GPT-2 folder with dropout 0.1: 1.46 clip for userdp, 2.30 for dpsgd, where 1
is accounted).

So private training does two things, both here:

* :func:`dropout_switched_off` sets every dropout rate of the model to zero for the duration of
  training (``nn.Dropout`` modules, rates kept as plain float attributes of a layer such as Llama's
  ``attention_dropout``, and the ``*dropout*`` / ``*pdrop*`` fields of a Hugging Face config that a layer
  may read at call time) and restores them afterwards, so a logged checkpoint keeps the user's config;
  the statement says how many rates it switched off;
* :func:`no_global_draws` is the backstop for any other self-drawing layer (stochastic depth, random
  token dropping, noise injection, whatever a future architecture adds): it compares the state of
  torch's global CPU and CUDA generators, which torch layers draw from when handed none, before and
  after a round, and refuses the run when one moved. A round that drew from a shared stream has already
  mixed units' randomness; nothing of it may be released. (numpy's and Python's global generators are
  not watched: no torch layer draws from them, and background threads of the tracking and
  orchestration libraries may, which would refuse sound runs.)

Drawing the masks from the secret per-(round, unit) streams instead would keep dropout, but every
architecture draws them differently (modules, functional calls, fused attention kernels), so switching
them off is the choice that holds for any checkpoint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from uedp.errors import UedpError

# Config fields whose name says they are a dropout rate (GPT-2: resid_pdrop, embd_pdrop, attn_pdrop; BERT:
# hidden_dropout_prob, attention_probs_dropout_prob, classifier_dropout; Llama, Qwen, Mistral:
# attention_dropout; others: dropout, activation_dropout, summary_first_dropout, lora_dropout ...).
_RATE_WORDS = ("dropout", "pdrop")

DROPOUT_NOTE = ("dropout switched off for private training ({count} layer rates set to 0): its masks come from a "
                "generator all units share, so one added unit would move every other unit's contribution")


def _is_rate_name(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _RATE_WORDS)


@contextlib.contextmanager
def dropout_switched_off(model: torch.nn.Module) -> Iterator[int]:
    """Every dropout rate of ``model`` at 0 inside the block, restored after it; yields how many nonzero
    rates held by layers it switched off (0: the model's layers had none, and nothing needs saying)."""
    restore: list[tuple[Any, str, float]] = []  # (owner, attribute, old rate)
    seen: set[tuple[int, str]] = set()  # a config shared by submodules is reached more than once
    in_layers = 0  # rates a layer holds (a config's fields may be read by no layer: not counted)

    def zero(owner: Any, name: str) -> bool:
        value = getattr(owner, name)
        if not (isinstance(value, float) and value > 0 and (id(owner), name) not in seen):
            return False
        seen.add((id(owner), name))
        restore.append((owner, name, value))
        setattr(owner, name, 0.0)
        return True

    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            in_layers += zero(module, "p")
        in_layers += sum(zero(module, name) for name in [n for n in vars(module) if _is_rate_name(n)])
        config = getattr(module, "config", None)
        if config is not None:
            for name in [n for n in vars(config) if _is_rate_name(n)]:
                zero(config, name)
    try:
        yield in_layers
    finally:
        for owner, name, value in reversed(restore):
            setattr(owner, name, value)


def _global_states() -> dict[str, list[torch.Tensor]]:
    """The state of every generator a torch layer draws from when it is handed none."""
    states = {"torch": [torch.get_rng_state()]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _moved(before: dict[str, list[torch.Tensor]], after: dict[str, list[torch.Tensor]]) -> list[str]:
    return [name for name, states in before.items()
            if len(states) != len(after.get(name, [])) or not all(map(torch.equal, states, after[name]))]


GENERATOR_NAMES = {"torch": "torch's global CPU generator", "cuda": "torch's global CUDA generator"}


@contextlib.contextmanager
def no_global_draws(mechanism: str, round_index: int) -> Iterator[None]:
    """Refuse a private round during which anything drew from a generator that all units share."""
    before = _global_states()
    yield
    moved = _moved(before, _global_states())
    if moved:
        which = ", ".join(GENERATOR_NAMES[name] for name in moved)
        raise UedpError(
            f"{mechanism}: round {round_index} drew from {which} (a layer with randomness of its own, such as "
            "stochastic depth or noise injection); such draws are shared by all units, so one added unit would move "
            "every other unit's contribution beyond the accounted sensitivity. Nothing of this run is released: "
            "switch that layer's randomness off in the model's config and train again")
