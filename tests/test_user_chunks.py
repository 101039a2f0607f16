"""A user's contribution as chunks (``user_text=chunks``, Chua et al. 2024's random chunks): a writer's
consecutive sentences packed into sequences of at most max_len tokens, of which an update reads at most
local_steps x local_batch_size, drawn by the user's own stream. Packing is a function of one user's own
sentences, so a user's clipped delta keeps its sensitivity; the adjacency is checked here with the run's
real (secret) randomness, and the delta is shown to be the one trained on exactly those chunks."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils import parameters_to_vector

from uedp.models.batching import pack_consecutive
from uedp.models.metrics import causal_lm_loss
from uedp.privacy.mechanisms.base import TrainData
from uedp.privacy.mechanisms.fedavg import LocalTrainer
from uedp.privacy.mechanisms.params import UeDpBoundedParams, UeDpParams, UserDpParams
from uedp.privacy.mechanisms.userdp import UserDp, make_local_trainer, server_notes, server_optimizer
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness

from support import fedavg_data, move_by_one_added_user, tiny_gpt2

CHUNK = 96  # the tiny GPT-2 takes 128 positions; fedavg_data's sentences are about 36 byte tokens


def _ids(*lengths: int) -> list[torch.Tensor]:
    start, out = 0, []
    for length in lengths:
        out.append(torch.arange(start, start + length))
        start += length
    return out


def test_packing_keeps_the_writers_order_and_every_sentence_whole_within_the_length() -> None:
    sentences = _ids(5, 4, 3, 9, 2, 10)
    chunks = pack_consecutive(sentences, 10)
    assert [len(c) for c in chunks] == [9, 3, 9, 2, 10]  # 5+4 | 3 (3+9 > 10) | 9 | 2 (2+10 > 10) | 10
    assert torch.equal(torch.cat(chunks), torch.cat(sentences))  # nothing lost, nothing reordered
    assert pack_consecutive(_ids(12), 10)[0].tolist() == list(range(10))  # a longer one is cut, not split
    assert pack_consecutive([], 10) == []
    with pytest.raises(ValueError, match="only language-model sentences"):
        pack_consecutive([(torch.arange(3), 1)], 10)
    with pytest.raises(ValueError, match="at least one token"):
        pack_consecutive(sentences, 0)


def test_a_chunked_users_delta_is_the_delta_trained_on_its_chunks_with_its_own_stream() -> None:
    """The chunked trainer reads the packed chunks, batched in the order the user's stream draws: the same
    delta as a sentence trainer handed those chunks (so packing is the only change, and it happens)."""
    params = UserDpParams(noise_multiplier=1.0, user_text="chunks", local_steps=2, local_batch_size=2, clip=1e9)
    data = fedavg_data(users=1, per_user=6)
    (sentences,) = data.by_user.values()
    chunks = pack_consecutive(sentences, CHUNK)
    assert len(chunks) < len(sentences) and max(len(c) for c in chunks) <= CHUNK
    theta = parameters_to_vector(tiny_gpt2().parameters()).detach().clone()
    root = Randomness.seeded(3)
    device = torch.device("cpu")
    chunked = make_local_trainer(params, tiny_gpt2(), causal_lm_loss, device, data.pad_id, max_len=CHUNK)
    plain = LocalTrainer(tiny_gpt2(), causal_lm_loss, device, data.pad_id, 1e9, 2, 2, params.local_lr)
    got = chunked.clipped_sum(theta, [sentences], [1.0], [root.stream("local-batches", 1, "u0")])
    want = plain.clipped_sum(theta, [chunks], [1.0], [root.stream("local-batches", 1, "u0")])
    assert torch.equal(got, want)
    unchunked = plain.clipped_sum(theta, [sentences], [1.0], [root.stream("local-batches", 1, "u0")])
    assert not torch.equal(got, unchunked)


@pytest.mark.parametrize("local_update", ["steps", "gradient"])
def test_adding_one_chunked_user_moves_the_clipped_sum_by_at_most_clip(local_update: str) -> None:
    """With a secret root and each user's own stream, as a run draws them; the added user comes first, so a
    shared stream would reorder every other user's chunks."""
    params = UserDpParams(noise_multiplier=1.0, user_text="chunks", local_update=local_update, local_batch_size=2,
                          clip=0.05)
    moved = move_by_one_added_user(params, max_len=CHUNK)
    assert 0.99 * params.clip < moved <= params.clip * (1 + 1e-5)  # clipping was active, and bounded the move


def test_a_chunked_userdp_run_trains_and_its_statement_says_what_an_update_read() -> None:
    params = UserDpParams(noise_multiplier=1.0, user_text="chunks", rounds=2, q_user=0.5, local_steps=2,
                          local_batch_size=2)
    data = fedavg_data(users=6, per_user=4)
    model = tiny_gpt2()
    before = parameters_to_vector(model.parameters()).detach().clone()
    mechanism = UserDp(params, Population.declared(6), Randomness.seeded(0))
    chunked = TrainData(data.by_user, data.pad_id, max_len=CHUNK)
    trained = mechanism.train(model, chunked, causal_lm_loss, torch.device("cpu"), lambda report: None)
    assert not torch.equal(before, parameters_to_vector(model.parameters()))
    said = trained.statement.notes
    assert f"packed, in its own order, into chunks of at most {CHUNK} tokens" in said and "at most 4 of them" in said
    # without the model's length the mechanism cannot pack, and says so before any round
    with pytest.raises(ValueError, match="user_text=chunks packs a user's sentences up to the model's max_len"):
        mechanism.train(tiny_gpt2(), data, causal_lm_loss, torch.device("cpu"), lambda report: None)


def test_every_user_level_mechanism_takes_chunks_and_a_classifier_refuses_them() -> None:
    from uedp.services.config import TrainConfig

    for params in (UserDpParams, UeDpBoundedParams, UeDpParams):
        assert params(noise_multiplier=1.0, user_text="chunks").user_text == "chunks"
    gradient = UserDpParams(noise_multiplier=1.0, user_text="chunks", local_update="gradient", local_batch_size=3)
    assert any("one batch of at most 3 chunks (at most 64 tokens) of its consecutive sentences" in n
               for n in server_notes(server_optimizer(gradient), gradient, 64))
    assert TrainConfig(dataset="d", mechanism="userdp", noise_multiplier=1.0, user_text="chunks").params.user_text == "chunks"
    with pytest.raises(ValueError, match="a classifier's examples each keep their own class"):
        TrainConfig(dataset="d", model="bert", mechanism="userdp", noise_multiplier=1.0, user_text="chunks")


def test_uedp_packs_the_sentences_a_round_selected_for_each_user() -> None:
    """uedp chooses a user's usable sentences each round (sampled entities and sentences with none), then
    packs those: the data's length reaches the trainer through its anchoring of the users."""
    from uedp.privacy.mechanisms.uedp import UeDp

    params = UeDpParams(noise_multiplier=1.0, user_text="chunks", rounds=2, q_user=0.9, q_entity=0.9, q_extended=0.9,
                        local_steps=1, local_batch_size=2)
    data = fedavg_data(users=6, per_user=4)
    entities = {u: [frozenset({"leeds"}), frozenset(), frozenset(), frozenset()] for u in data.by_user}
    model = tiny_gpt2()
    before = parameters_to_vector(model.parameters()).detach().clone()
    trained = UeDp(params, Population.declared(6), Randomness.seeded(0)).train(
        model, TrainData(data.by_user, data.pad_id, entities, max_len=CHUNK), causal_lm_loss, torch.device("cpu"),
        lambda report: None)
    assert not torch.equal(before, parameters_to_vector(model.parameters()))
    assert f"chunks of at most {CHUNK} tokens" in trained.statement.notes


# --- the planner's budget as machine time -------------------------------------------------------------------

def test_a_time_budget_is_the_user_updates_the_throughput_affords_at_the_contribution_cap() -> None:
    from uedp.privacy.mechanisms.auto_sampling import ComputeBudget
    from uedp.privacy.mechanisms.params import DpSgdParams

    params = UserDpParams(noise_multiplier=1.0, local_update="gradient", local_batch_size=8)
    assert params.tokens_per_update(64) == 8 * 64 and DpSgdParams(noise_multiplier=1.0).tokens_per_update(64) is None
    budget = ComputeBudget(3.0, 110.0, params.tokens_per_update(64))
    assert budget.user_updates == pytest.approx(3 * 3600 * 110 / 512)
    assert "3 h at 110 tokens/s, at most 512 tokens a user update: 2,320 user updates" in budget.line()
    with pytest.raises(ValueError, match="positive hours"):
        ComputeBudget(0, 110.0, 512)


def test_uedp_epsilon_splits_hours_of_this_machine_into_rounds_and_users() -> None:
    import re

    from typer.testing import CliRunner

    from uedp.commands import app

    runner = CliRunner()
    args = ["epsilon", "--mechanism", "userdp", "--users", "60", "--target-epsilon", "8", "--set", "accountant=rdp",
            "--count-public", "--local-update", "gradient", "--local-batch-size", "4"]
    planned = runner.invoke(app, [*args, "--choose-sampling", "--cpu-hours", "0.5", "--tokens-per-second", "40",
                                  "--max-len", "48"])
    assert planned.exit_code == 0, planned.output
    assert "0.5 h at 40 tokens/s, at most 192 tokens a user update: 375 user updates" in planned.output
    chosen = re.search(r"q_user ([0-9.]+) and (\d+) rounds chosen", planned.output)
    assert chosen is not None and float(chosen.group(1)) * 60 * int(chosen.group(2)) == pytest.approx(375, rel=0.05)
    alone = runner.invoke(app, [*args, "--choose-sampling", "--cpu-hours", "1"])
    assert alone.exit_code == 2 and "--cpu-hours and --tokens-per-second go together" in alone.stderr
    twice = runner.invoke(app, [*args, "--choose-sampling", "--cpu-hours", "1", "--tokens-per-second", "9",
                                "--user-updates", "100"])
    assert twice.exit_code == 2 and "give the compute budget once" in twice.stderr
    unsplit = runner.invoke(app, [*args, "--cpu-hours", "1", "--tokens-per-second", "9"])
    assert unsplit.exit_code == 2 and "add --choose-sampling" in unsplit.stderr


def test_the_planner_keeps_the_rounds_a_model_needs_to_learn() -> None:
    """The least noise-to-signal alone picks the fewest rounds of the most users; --min-rounds keeps at least as
    many server steps as asked (a noiseless run's steps), and says the floor it chose under."""
    import re

    from typer.testing import CliRunner

    from uedp.commands import app

    runner = CliRunner()
    args = ["epsilon", "--mechanism", "userdp", "--users", "200", "--target-epsilon", "8", "--set", "accountant=rdp",
            "--count-public", "--choose-sampling", "--user-updates", "6000"]
    found = {}
    for floor in ("10", "60"):
        result = runner.invoke(app, [*args, "--min-rounds", floor])
        assert result.exit_code == 0, result.output
        chosen = re.search(r"q_user ([0-9.]+) and (\d+) rounds chosen.*noise-to-signal \(([0-9.]+)\).*at least (\d+) "
                           r"rounds", result.output)
        assert chosen is not None, result.output
        found[floor] = (int(chosen.group(2)), float(chosen.group(3)), int(chosen.group(4)))
    assert found["10"][0] < 60 <= found["60"][0] and found["60"][2] == 60
    assert found["60"][1] > found["10"][1]  # more steps cost noise per step: the planner says so, it does not hide it
    too_many = runner.invoke(app, [*args, "--min-rounds", "100000"])
    assert too_many.exit_code != 0 and "100000 rounds" in too_many.output
