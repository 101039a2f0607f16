"""Crash and resume: every mechanism, resumed from a checkpoint, finishes with exactly the weights and
the epsilon of an uninterrupted run (no privacy spent twice, none forgotten)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.nn.utils import parameters_to_vector

from uedp.models.batching import encode, encode_with_private_mask
from uedp.models.lstm import build_lstm
from uedp.models.metrics import causal_lm_loss, per_sequence_lm_loss
from uedp.privacy.accounting.events import epsilon_after, poisson_gaussian_round
from uedp.privacy.accounting.rounds import RoundAccountant
from uedp.privacy.mechanisms.base import Mechanism, RoundReport, TrainData
from uedp.privacy.mechanisms.checkpoint import Checkpointer, CheckpointMismatch
from uedp.privacy.mechanisms.dpsgd import DpSgd, DpSgdParams
from uedp.privacy.mechanisms.noiseless import Noiseless, NoiselessParams
from uedp.privacy.mechanisms.selective import SelectiveParams, SelectiveTwoPhase
from uedp.privacy.mechanisms.selective_recurrent import SelectiveRecurrent
from uedp.privacy.mechanisms.uedp import UeDp, UeDpParams
from uedp.privacy.mechanisms.userdp import UserDp, UserDpParams
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness

from support import TOKENIZER
from support import tiny_gpt2 as _model

ROUNDS = 6


def _lstm() -> torch.nn.Module:
    torch.manual_seed(1)
    return build_lstm("tiny", len(TOKENIZER))


def _data() -> TrainData:
    texts = {f"u{u}": [f"user {u} met Anna in Leeds, note {i}" if i % 2 else f"user {u} wrote note {i}"
                       for i in range(3)] for u in range(8)}
    masks = {u: encode_with_private_mask(TOKENIZER, ts, [[(t.find("Anna"), t.find("Anna") + 4)] if "Anna" in t else []
                                                         for t in ts], 40)[1] for u, ts in texts.items()}
    entities = {u: [frozenset({"PERSON:anna", "LOC:leeds"}) if i % 2 else frozenset() for i in range(3)] for u in texts}
    redacted = {u: encode(TOKENIZER, [t.replace("Anna", "[PERSON]") for t in ts], 40) for u, ts in texts.items()}
    return TrainData({u: encode(TOKENIZER, t, 40) for u, t in texts.items()}, TOKENIZER.pad_token_id,
                     entities=entities, redacted=redacted, private_masks=masks)


MECHANISMS: dict[str, tuple[Callable[[], Mechanism], Callable]] = {
    "noiseless": (lambda: Noiseless(NoiselessParams(steps=ROUNDS, batch_size=5), seed=3), causal_lm_loss),
    # Seeded: a resumed seeded run derives the same randomness again and replays exactly.
    "userdp": (lambda: UserDp(UserDpParams(rounds=ROUNDS, q_user=0.5, local_steps=2, local_batch_size=2),
                              Population.declared(8), Randomness.seeded(3)), causal_lm_loss),
    # The server optimizers' moments are state too: a resume that lost them would step differently.
    "userdp-adam": (lambda: UserDp(UserDpParams(rounds=ROUNDS, q_user=0.5, local_steps=2, local_batch_size=2,
                                                server_optimizer="adam", server_lr=0.01),
                                   Population.declared(8), Randomness.seeded(3)), causal_lm_loss),
    "uedp-momentum": (lambda: UeDp(UeDpParams(rounds=ROUNDS, q_user=0.5, local_steps=2, local_batch_size=2,
                                              delta=1e-3, server_optimizer="momentum"),
                                   Population.declared(8), Randomness.seeded(3)), causal_lm_loss),
    "uedp": (lambda: UeDp(UeDpParams(rounds=ROUNDS, q_user=0.5, local_steps=2, local_batch_size=2, delta=1e-3),
                          Population.declared(8), Randomness.seeded(3)), causal_lm_loss),
    "dpsgd": (lambda: DpSgd(DpSgdParams(steps=ROUNDS, expected_batch_size=4, delta=1e-3),
                            Population(23.6, "dp-count", 10.0), Randomness.seeded(3)), per_sequence_lm_loss),
    "selective": (lambda: SelectiveTwoPhase(SelectiveParams(public_steps=3, steps=ROUNDS, expected_batch_size=4,
                                                            delta=1e-3), 24,
                                            randomness=Randomness.seeded(3)), per_sequence_lm_loss),
    "selective-recurrent": (lambda: SelectiveRecurrent(SelectiveParams(steps=ROUNDS, expected_batch_size=4,
                                                                                delta=1e-3), 24, Randomness.seeded(3)),
                            causal_lm_loss),
}


class Crash(RuntimeError):
    pass


def _run(name: str, checkpoint: Checkpointer | None = None, crash_at: int | None = None):
    make, loss = MECHANISMS[name]
    model, reports = (_lstm() if name == "selective-recurrent" else _model(seed=1)), []

    def on_round(report: RoundReport) -> None:
        reports.append(report)
        if crash_at is not None and report.round == crash_at:
            raise Crash

    kwargs = {"checkpoint": checkpoint} if checkpoint else {}
    statement = make().train(model, _data(), loss, torch.device("cpu"), on_round, **kwargs).statement
    return parameters_to_vector(model.parameters()).detach(), statement, reports


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_resumed_run_equals_uninterrupted_run(name: str, tmp_path: Path) -> None:
    weights, statement, uninterrupted = _run(name)
    checkpoint = Checkpointer(tmp_path, every=2, fingerprint="config-a")
    crash_at = 5 if name != "selective" else 3 + 5  # selective counts its 3 public steps first
    with pytest.raises(Crash):
        _run(name, checkpoint, crash_at=crash_at)
    assert checkpoint.path is not None and checkpoint.path.is_file()
    resumed_weights, resumed, reports = _run(name, checkpoint)
    assert reports[0].round == crash_at  # the checkpoint of round 4 resumed at round 5, not from scratch
    assert torch.equal(resumed_weights, weights)
    assert resumed.epsilon == statement.epsilon and resumed.rounds == statement.rounds
    # the schedule is planned again from the configuration: the resumed rounds report the same figures
    assert [r.epsilon for r in reports] == [r.epsilon for r in uninterrupted if r.round >= crash_at]
    if name != "noiseless":
        assert 0 < resumed.epsilon < float("inf")


def test_a_checkpoint_of_another_configuration_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Crash):
        _run("userdp", Checkpointer(tmp_path, every=2, fingerprint="config-a"), crash_at=3)
    with pytest.raises(CheckpointMismatch, match="another configuration"):
        _run("userdp", Checkpointer(tmp_path, every=2, fingerprint="config-b"))


def test_accountant_state_cannot_continue_another_mechanism() -> None:
    first = RoundAccountant(poisson_gaussian_round(0.5, 1.0), 1e-5)
    first.schedule_for(3)
    first.spend()
    assert set(first.state_dict()) == {"rounds", "event", "initial", "delta", "kind", "adjacency"}  # no figure
    other = RoundAccountant(poisson_gaussian_round(0.5, 2.0), 1e-5)
    with pytest.raises(ValueError, match="cannot continue"):
        other.load_state_dict(first.state_dict())
    same = RoundAccountant(poisson_gaussian_round(0.5, 1.0), 1e-5)
    same.load_state_dict(first.state_dict())
    assert same.schedule_for(3) == first.schedule  # the schedule is planned again, from the configuration alone
    assert same.rounds == 1 and same.spend() == pytest.approx(epsilon_after(poisson_gaussian_round(0.5, 1.0), 2, 1e-5))
