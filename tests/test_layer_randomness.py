"""Randomness that a model's layers draw for themselves (``privacy.layer_randomness``), on its own.

Private training switches every dropout rate off and refuses a round that drew from torch's global
generator: both keep one unit's contribution a function of that unit's data and stream alone. The
mechanism tests (tests/test_second_audit.py) show the end effect on adjacency; these pin each part: what
counts as a rate, that everything is restored however the block ends, and that the backstop refuses a
round that drew and passes one that drew from its own generator.
"""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from uedp.errors import UedpError
from uedp.privacy.layer_randomness import DROPOUT_NOTE, dropout_switched_off, no_global_draws


class HandRolled(torch.nn.Module):
    """A layer that keeps its rate as a plain attribute (as Llama's attention keeps ``attention_dropout``),
    a stochastic-depth rate under another word, and a float that is not a rate."""

    def __init__(self) -> None:
        super().__init__()
        self.attention_dropout = 0.2
        self.drop_path_pdrop = 0.05
        self.scale = 0.5
        self.dense = torch.nn.Linear(4, 4)
        self.dropout = torch.nn.Dropout(0.3)


def _rates(model: torch.nn.Module) -> list[float]:
    return [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]


def _gpt2() -> GPT2LMHeadModel:
    config = GPT2Config(vocab_size=50, n_layer=2, n_head=2, n_embd=8, n_positions=16)
    return GPT2LMHeadModel(config)


def test_every_rate_a_layer_holds_is_zero_inside_and_restored_after() -> None:
    layer = HandRolled()
    with dropout_switched_off(layer) as switched:
        assert (layer.attention_dropout, layer.drop_path_pdrop, layer.dropout.p) == (0.0, 0.0, 0.0)
        assert layer.scale == 0.5  # a float whose name is no rate is left alone
        assert switched == 3
    assert (layer.attention_dropout, layer.drop_path_pdrop, layer.dropout.p, layer.scale) == (0.2, 0.05, 0.3, 0.5)


def test_a_hugging_face_config_shared_by_submodules_is_switched_once_and_not_counted_as_a_layer() -> None:
    model = _gpt2()
    config = model.config
    assert (config.resid_pdrop, config.embd_pdrop, config.attn_pdrop) == (0.1, 0.1, 0.1)
    modules = len(_rates(model))
    with dropout_switched_off(model) as switched:
        assert (config.resid_pdrop, config.embd_pdrop, config.attn_pdrop) == (0.0, 0.0, 0.0)
        assert set(_rates(model)) == {0.0}
        # the layers' own rates (nn.Dropout modules and GPT-2 attention's plain attributes), not the config's
        # fields: a config field no layer reads would otherwise be said to be switched off
        assert switched >= modules
    assert (config.resid_pdrop, config.embd_pdrop, config.attn_pdrop) == (0.1, 0.1, 0.1)
    assert set(_rates(model)) == {0.1}


def test_rates_are_restored_when_training_fails_inside_the_block() -> None:
    layer = HandRolled()
    with pytest.raises(RuntimeError, match="a round failed"), dropout_switched_off(layer):
        raise RuntimeError("a round failed")
    assert (layer.attention_dropout, layer.dropout.p) == (0.2, 0.3)


def test_a_model_without_dropout_has_nothing_to_say() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.0))
    with dropout_switched_off(model) as switched:
        assert switched == 0


def test_a_model_in_training_mode_gives_the_same_output_twice_only_with_dropout_switched_off() -> None:
    torch.manual_seed(0)
    model = _gpt2().train()
    ids = torch.randint(0, 50, (2, 8))
    with dropout_switched_off(model):
        first, second = model(ids).logits, model(ids).logits
    assert torch.equal(first, second)
    assert not torch.equal(model(ids).logits, model(ids).logits)  # back on: masks drawn again


def test_the_dropout_note_counts_what_was_switched() -> None:
    assert DROPOUT_NOTE.format(count=4).startswith("dropout switched off for private training (4 layer rates")


def test_a_round_that_draws_from_the_global_generator_is_refused_naming_the_round() -> None:
    with pytest.raises(UedpError, match=r"userdp: round 7 drew from torch's global CPU generator.*Nothing of this run"), \
            no_global_draws("userdp", 7):
        torch.rand(3)


def test_a_layer_that_draws_by_itself_is_refused_in_a_forward_pass() -> None:
    """Dropout left on in training mode is exactly such a layer: the backstop catches it even if a model
    hid its rate under a name the switch does not know."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).train()
    with pytest.raises(UedpError, match="round 0"), no_global_draws("dpsgd", 0):
        model(torch.ones(2, 4))


def test_draws_from_a_rounds_own_generator_pass() -> None:
    own = torch.Generator().manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).eval()  # built outside: init draws
    before = torch.get_rng_state()
    with no_global_draws("uedp", 2):
        torch.rand(5, generator=own)
        model(torch.ones(2, 4))  # dropout in eval mode draws nothing
    assert torch.equal(before, torch.get_rng_state())


def test_an_error_inside_the_round_is_the_rounds_own_not_a_refusal() -> None:
    """A round that fails for its own reason says that reason; the generator check runs only after a round
    that ended (its draws no longer matter: nothing of a failed round is released)."""
    with pytest.raises(ValueError, match="bad batch"), no_global_draws("dpsgd", 1):
        torch.rand(2)
        raise ValueError("bad batch")
