"""The second independent audit (issue 32): one test or more per finding, each failing on the code the
audit found (landed main 0b7f401).

1. dropout drawn from torch's global generator on a checkpoint folder (every unit's masks shifted by an
   added unit); any other layer drawing from it is refused;
2. uedp's DP count moved by one per writer whose every sentence holds the removed entity;
3. membership inference (train file vs test file) was shown as a lower bound on epsilon;
4. recurrent selective's unit is one *byte* of a name with the byte-level tokenizer;
5. uedp's truncation (and count bound) failure was charged to delta as p, not p (1 + e^epsilon);
6. a count released exactly (public by adjacency) makes another run's DP count moot: statements say so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch.nn.utils import parameters_to_vector
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from uedp.errors import UedpError
from uedp.models.batching import encode
from uedp.models.causal_lm import load_causal_lm
from uedp.models.gpt2 import load_gpt2
from uedp.models.lora import LoraSettings, with_lora
from uedp.models.metrics import causal_lm_loss, per_sequence_lm_loss
from uedp.privacy.accounting.worst_case import UeDpAccounting, max_sampled_users
from uedp.privacy.mechanisms import registry
from uedp.privacy.mechanisms.base import TrainData
from uedp.privacy.mechanisms.dpsgd import DpSgd, DpSgdParams
from uedp.privacy.mechanisms.fedavg import LocalTrainer
from uedp.privacy.mechanisms.params import SelectiveParams, UeDpBoundedParams
from uedp.privacy.mechanisms.registry import BuildContext, RunShape
from uedp.privacy.mechanisms.selective import SelectiveTwoPhase
from uedp.privacy.mechanisms.uedp import UeDp, UeDpParams
from uedp.privacy.mechanisms.uedp_bounded import KeptHolders, UeDpBounded
from uedp.privacy.mechanisms.userdp import UserDp, UserDpParams
from uedp.privacy.population import Population, anchored_users, exact_count
from uedp.privacy.randomness import Randomness

from support import REPO, TOKENIZER

CPU = torch.device("cpu")
CLIP = 0.01  # far below a random GPT-2's gradient and delta norms: every contribution is clipped


# 1. Dropout and other layers' own randomness -----------------------------------------------------------


@dataclass(frozen=True)
class DropoutCheckpoint:
    """A checkpoint folder as users download them, with the dropout its family ships, and how a run loads it."""

    folder: Path
    family: str
    lora: bool


@pytest.fixture(scope="module", params=["gpt2", "llama", "llama+lora"])
def dropout_checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> DropoutCheckpoint:
    """GPT-2 with Hugging Face's default dropout (0.1 everywhere); a Llama-family folder with attention dropout
    0.1, fully fine-tuned and with LoRA adapters (only they train)."""
    family, _, lora = request.param.partition("+")
    folder = tmp_path_factory.mktemp(f"{family}-with-dropout")
    ids = {"vocab_size": len(TOKENIZER), "bos_token_id": TOKENIZER.eos_token_id,
           "eos_token_id": TOKENIZER.eos_token_id, "pad_token_id": TOKENIZER.eos_token_id}
    if family == "gpt2":
        config = GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=128, **ids)
        assert config.resid_pdrop == config.attn_pdrop == config.embd_pdrop == 0.1
        model_class = GPT2LMHeadModel
    else:
        config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=128, attention_dropout=0.1, **ids)
        model_class = LlamaForCausalLM
    torch.manual_seed(0)
    model_class(config).save_pretrained(folder)
    return DropoutCheckpoint(folder, family, bool(lora))


def _checkpoint(checkpoint: DropoutCheckpoint) -> torch.nn.Module:
    """Loaded as ``--model FOLDER`` (``--lora-rank 2``) loads it, with training's seeding of torch's global
    generator (services.training.set_up seeds it with the configuration's seed, in secure mode too)."""
    model = load_gpt2(checkpoint.folder) if checkpoint.family == "gpt2" else load_causal_lm(checkpoint.folder)
    torch.manual_seed(0)
    if checkpoint.lora:
        model = with_lora(model, LoraSettings(rank=2, alpha=4.0))
        for name, param in model.named_parameters():  # peft starts B at 0; a nonzero B makes A's gradient nonzero
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.02)
    return model


def _texts(user: str, n: int) -> list[str]:
    return [f"{user} wrote note {i}: the harbour ferry left at {7 + i} with {user}'s parcel aboard" for i in range(n)]


def _users(names: list[str], per_user: int = 3) -> TrainData:
    return TrainData({u: encode(TOKENIZER, _texts(u, per_user), 64) for u in names}, TOKENIZER.pad_token_id,
                     {u: [frozenset()] * per_user for u in names})


def test_dpsgd_adding_an_example_moves_the_clipped_sum_by_at_most_clip_on_a_dropout_checkpoint(
        dropout_checkpoint: DropoutCheckpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """D' = D + one sequence, listed first (so a shared stream would shift every other example's masks);
    q = 1 and the run's real path: its root, its loop, its ghost clipping."""
    sums: list[torch.Tensor] = []
    original = DpSgd.clipped_gradient_sum

    def recorded(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        total = original(self, *args, **kwargs)
        sums.append(torch.cat([t.flatten() for t in total]).detach().clone())
        return total

    monkeypatch.setattr(DpSgd, "clipped_gradient_sum", recorded)
    root = Randomness.secure()
    names = [f"w{i}" for i in range(12)]
    statements = []
    params = DpSgdParams(steps=1, batch_size=13, clip=CLIP, noise_multiplier=1.0, accountant="rdp")  # q = 1
    for data in (_users(names, 1), _users(["added", *names], 1)):
        mechanism = DpSgd(params, Population.declared(13), root)
        statements.append(mechanism.train(_checkpoint(dropout_checkpoint), data, per_sequence_lm_loss, CPU,
                                          lambda r: None).statement)
    moved = float(torch.linalg.vector_norm(sums[1] - sums[0]))
    assert 0.1 * CLIP < moved <= CLIP * (1 + 1e-4)  # the added example's own clipped gradient, nothing more
    assert all("dropout switched off" in s.notes for s in statements)


def _recorded_deltas(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Every user's local delta as the real round computes it, in the order the round trains them."""
    deltas: list[torch.Tensor] = []
    original = LocalTrainer.local_delta

    def recorded(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        delta = original(self, *args, **kwargs)
        deltas.append(delta.detach().clone())
        return delta

    monkeypatch.setattr(LocalTrainer, "local_delta", recorded)
    return deltas


def _clipped(delta: torch.Tensor) -> torch.Tensor:
    return delta * min(1.0, CLIP / float(torch.linalg.vector_norm(delta)))


def test_userdp_adding_a_user_changes_no_other_users_delta_on_a_dropout_checkpoint(
        dropout_checkpoint: DropoutCheckpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    deltas = _recorded_deltas(monkeypatch)
    root = Randomness.secure()
    names = [f"w{i}" for i in range(10)]
    params = UserDpParams(rounds=1, q_user=1.0, clip=CLIP, noise_multiplier=1.0, local_steps=2, local_batch_size=2,
                          weight_cap=1.0, accountant="rdp")
    runs = {}
    for key, data in (("D", _users(names)), ("D+u", _users(["added", *names]))):
        start = len(deltas)
        statement = UserDp(params, Population.declared(11), root).train(_checkpoint(dropout_checkpoint), data,
                                                                         causal_lm_loss, CPU, lambda r: None).statement
        runs[key] = dict(zip(data.by_user, deltas[start:], strict=True))
        assert "dropout switched off" in statement.notes
    for user in names:  # every other user's delta is bit for bit what it was
        assert torch.equal(runs["D"][user], runs["D+u"][user]), user
    moved = torch.stack([_clipped(runs["D+u"][u]) for u in runs["D+u"]]).sum(0) - \
        torch.stack([_clipped(runs["D"][u]) for u in runs["D"]]).sum(0)
    assert float(torch.linalg.vector_norm(moved)) <= CLIP * (1 + 1e-4)


def test_uedp_bounded_changing_a_user_and_an_entity_moves_only_its_group_on_a_dropout_checkpoint(
        dropout_checkpoint: DropoutCheckpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Substitution: the contents of user u0's sentences and of every sentence naming SHARED change (to
    texts of other lengths, so a shared stream would draw another number of masks), the graph stays."""
    deltas = _recorded_deltas(monkeypatch)
    shared = "PERSON:imelda okafor"
    k = 1

    def data(changed: bool) -> TrainData:
        by_user, sets = {}, {}
        for u in range(10):
            texts = [f"plain note {u} about the weather", f"Imelda Okafor signed chart {u}" if u < 4 else "no one"]
            entity_sets = [frozenset(), frozenset({shared}) if u < 4 else frozenset()]
            if changed:
                texts = [("a much longer substitute text that changes the shapes " * 2 + str(i))
                         if u == 0 or shared in s else t for i, (t, s) in enumerate(zip(texts, entity_sets))]
            by_user[f"u{u}"], sets[f"u{u}"] = encode(TOKENIZER, texts, 96), entity_sets
        return TrainData(by_user, TOKENIZER.pad_token_id, sets)

    root = Randomness.secure()
    params = UeDpBoundedParams(rounds=1, q_user=1.0, clip=CLIP, noise_multiplier=1.0, local_steps=2,
                               local_batch_size=2, holders_per_entity=k)
    runs = {}
    for key, dataset in (("D", data(False)), ("D'", data(True))):
        mechanism = UeDpBounded(params, root)
        start = len(deltas)
        trained = mechanism.train(_checkpoint(dropout_checkpoint), dataset, causal_lm_loss, CPU, lambda r: None)
        statement, kept = trained.statement, trained.sampling
        assert isinstance(kept, KeptHolders)
        holders = {user for user, kept, user_sets in zip(kept.graph.users, kept.choice.kept,
                                                         dataset.entities.values())  # type: ignore[union-attr]
                   if any(keep and shared in s for keep, s in zip(kept, user_sets))}
        runs[key] = dict(zip(dataset.by_user, deltas[start:], strict=True))
        assert "dropout switched off" in statement.notes
    group = {"u0", *holders}
    assert len(group) <= 1 + k
    for user in set(runs["D"]) - group:
        assert torch.equal(runs["D"][user], runs["D'"][user]), user
    moved = sum((_clipped(runs["D'"][u]) - _clipped(runs["D"][u]) for u in runs["D"]), torch.zeros(1))
    assert float(torch.linalg.vector_norm(moved)) <= 2 * CLIP * (1 + k) * (1 + 1e-4)


def test_dropout_is_restored_after_training_and_a_preset_without_dropout_says_nothing(
        dropout_checkpoint: DropoutCheckpoint) -> None:
    model = _checkpoint(dropout_checkpoint)
    params = DpSgdParams(steps=1, batch_size=4, clip=CLIP, noise_multiplier=1.0, accountant="rdp")
    statement = DpSgd(params, Population.declared(8)).train(model, _users(["a", "b"], 4), per_sequence_lm_loss, CPU,
                                                            lambda r: None).statement
    assert re.search(r"dropout switched off for private training \(\d+ layer rates set to 0\)", statement.notes)
    base = model.get_base_model() if dropout_checkpoint.lora else model
    if dropout_checkpoint.family == "gpt2":  # the user's config, as loaded
        assert base.config.attn_pdrop == 0.1 and base.transformer.drop.p == 0.1
    else:
        assert base.config.attention_dropout == 0.1 and base.model.layers[0].self_attn.attention_dropout == 0.1
    from support import tiny_gpt2

    plain = DpSgd(params, Population.declared(8)).train(tiny_gpt2(), _users(["a", "b"], 4), per_sequence_lm_loss,
                                                        CPU, lambda r: None).statement
    assert "dropout" not in plain.notes


class _NoisyBlock(torch.nn.Module):
    """A layer with randomness of its own (noise injection), drawn from torch's global generator."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + 1e-3 * torch.randn_like(hidden) if self.training else hidden


def test_a_layer_drawing_from_torchs_global_generator_is_refused_in_private_training() -> None:
    from support import tiny_gpt2

    model = tiny_gpt2()
    noisy = _NoisyBlock()
    model.transformer.h[0].register_forward_hook(lambda module, args, out: (noisy(out[0]), *out[1:])
                                                 if isinstance(out, tuple) else noisy(out))
    data = _users(["a", "b", "c"], 2)
    with pytest.raises(UedpError, match="drew from torch's global CPU generator"):
        DpSgd(DpSgdParams(steps=2, batch_size=6, clip=CLIP, noise_multiplier=1.0, accountant="rdp"),
              Population.declared(6)).train(model, data, per_sequence_lm_loss, CPU, lambda r: None)
    with pytest.raises(UedpError, match="drew from torch's global CPU generator"):
        UserDp(UserDpParams(rounds=1, q_user=1.0, noise_multiplier=1.0, accountant="rdp"),
               Population.declared(3)).train(model, data, causal_lm_loss, CPU, lambda r: None)


# 2. uedp counts what one unit moves by at most one -------------------------------------------------------


def _entity_data(writers: dict[str, list[frozenset[str]]]) -> TrainData:
    return TrainData({u: encode(TOKENIZER, [f"{u} sentence {i}" for i in range(len(s))], 32)
                      for u, s in writers.items()}, TOKENIZER.pad_token_id, dict(writers))


def _uedp_neighbours(extra_writers: int = 10) -> tuple[TrainData, TrainData]:
    """D, and D' = D + user u' + ``extra_writers`` one-sentence writers about entity e' (the audit's neighbour)."""
    e, f = "PERSON:e prime", "LOC:leeds"
    base = {f"w{i}": [frozenset(), frozenset({f})] if i % 2 else [frozenset({f}), frozenset()] for i in range(8)}
    base["only-entities"] = [frozenset({f}), frozenset({f})]  # no sentence without an entity: never anchored
    bigger = {**base, "u-prime": [frozenset(), frozenset({e})],
              **{f"about-e{i}": [frozenset({e})] for i in range(extra_writers)}}
    return _entity_data(base), _entity_data(bigger)


def test_uedps_count_moves_by_at_most_one_for_a_user_and_an_entity_with_ten_writers_about_it() -> None:
    smaller, larger = _uedp_neighbours()
    spec = registry.get("uedp")
    assert spec.counts is not None
    moved = exact_count(spec.counts, larger) - exact_count(spec.counts, smaller)
    assert moved == 1  # u' alone; counting writers with text moved it by 11
    assert larger.n_users - smaller.n_users == 11
    assert "only-entities" not in anchored_users(smaller.entities or {})


def test_uedp_trains_only_the_writers_it_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    from support import tiny_gpt2

    _, larger = _uedp_neighbours()
    trained: list[int] = []
    original = LocalTrainer.local_clipped_sum

    def recorded(self, theta, users, weights, streams, clip):  # type: ignore[no-untyped-def]
        trained.append(len(users))
        return original(self, theta, users, weights, streams, clip)

    monkeypatch.setattr(LocalTrainer, "local_clipped_sum", recorded)
    params = UeDpParams(rounds=1, q_user=1.0, q_entity=1.0, q_extended=1.0, noise_multiplier=1.0, local_steps=1,
                        accountant="rdp")
    anchored = len(anchored_users(larger.entities or {}))
    statement = UeDp(params, Population.declared(anchored)).train(tiny_gpt2(), larger, causal_lm_loss, CPU,
                                                                  lambda r: None).statement
    assert trained == [anchored] and anchored == larger.n_users - 11  # neither the 10 writers nor only-entities
    assert "names no detected entity" in statement.notes


# 3. is in test_attacks.py (test_attack_command_adds_scores_to_the_run): no epsilon bound from membership.

# 4. Recurrent selective with byte tokens protects one byte -------------------------------------------------


def test_recurrent_selective_says_its_unit_is_one_byte_with_the_byte_tokenizer() -> None:
    spec = registry.get("selective")
    params = SelectiveParams(noise_multiplier=1.0, accountant="pld")
    byte = spec.build(params, BuildContext(RunShape("lstm", byte_tokens=True), Randomness.secure(), None, 20))
    word = spec.build(params, BuildContext(RunShape("lstm", byte_tokens=False), Randomness.secure(), None, 20))
    assert byte.unit.startswith("one byte's value") and "13 letters is 13 units" in byte.unit
    assert word.unit.startswith("one token's value")
    assert any("group privacy" in c for c in byte.statement_caveats())  # type: ignore[attr-defined]
    assert not any("group privacy" in c for c in word.statement_caveats())  # type: ignore[attr-defined]


# 5. uedp's failure events cost p (1 + e^epsilon) -----------------------------------------------------------


@pytest.mark.parametrize(("z", "target"), [(2.0, None), (0.8, None), (None, 4.0)])
@pytest.mark.parametrize("counted", [True, False])
def test_uedps_truncation_and_count_bound_are_charged_by_total_variation(z: float | None, target: float | None,
                                                                        counted: bool) -> None:
    population = Population(946.0, "dp-count", 10.0) if counted else Population.declared(946)
    delta = 1e-5
    plan, noise = UeDpAccounting.for_run(population, 0.05, 0.5, 0.5, 100, delta, False, 0.1, "rdp", 0.1, z, target)
    epsilon = plan.epsilon(noise)
    # delta = the accountant's share + (P[some round truncates] + P[the count bound fails]) (1 + e^epsilon)
    total = plan.delta_accountant + (plan.delta_trunc + plan.delta_bound) * (1 + math.exp(epsilon))
    assert total <= delta * (1 + 1e-9)
    assert plan.delta_accountant == pytest.approx(delta * (0.8 if counted else 0.9))
    # M is sound for the failure probability it was given, and larger than charging p alone would need.
    n = plan.n_users_bound + 1
    assert 100 * __import__("scipy").stats.binom.sf(plan.max_users, n, 0.05) <= plan.delta_trunc
    assert plan.max_users > max_sampled_users(n, 0.05, 100, 0.1 * delta)


@pytest.mark.slow
def test_an_epsilon_that_promises_nothing_is_refused_by_uedp() -> None:
    with pytest.raises(ValueError, match="guarantees nothing"):
        UeDp(UeDpParams(noise_multiplier=0.3, rounds=300, q_user=0.5), Population.declared(100))  # epsilon ~1400


# 6. Exact counts released by adjacency are named for every mechanism that releases one ---------------------


def test_statements_that_release_an_exact_count_say_what_it_does_to_other_runs() -> None:
    from support import tiny_gpt2

    data = _users(["a", "b", "c"], 2)
    redacted = TrainData(dict(data.by_user), data.pad_id)
    selective = SelectiveTwoPhase(SelectiveParams(steps=1, public_steps=1, batch_size=2, noise_multiplier=1.0),
                                  len(data.sequences), randomness=Randomness.secure())
    selective_data = TrainData(data.by_user, data.pad_id, redacted=redacted.by_user)
    statements = {
        "selective": selective.train(tiny_gpt2(), selective_data, per_sequence_lm_loss, CPU, lambda r: None).statement,
        "uedp-bounded": UeDpBounded(UeDpBoundedParams(rounds=1, noise_multiplier=1.0)).train(
            tiny_gpt2(), data, causal_lm_loss, CPU, lambda r: None).statement,
        "dpsgd": DpSgd(DpSgdParams(steps=1, batch_size=2, noise_multiplier=1.0),
                       Population.dp_count(6, 10.0, Randomness.secure())).train(
            tiny_gpt2(), data, per_sequence_lm_loss, CPU, lambda r: None).statement,
    }
    for name in ("selective", "uedp-bounded"):
        assert any("releases the exact number of its units" in c and "DP count" in c
                   for c in statements[name].caveats), name
    assert not any("releases the exact number" in c for c in statements["dpsgd"].caveats)
    # Every central mechanism that counts its units by adjacency (no DP count) is named in the docs.
    exact = [name for name, spec in registry.mechanisms().items()
             if spec.guarantee == "central" and spec.counts is None]
    assert set(exact) == {"selective", "uedp-bounded"}
    several_runs = (REPO / "docs" / "PRIVACY.md").read_text(encoding="utf-8").split("**Several runs on the same data**")[1]
    paragraph = several_runs.split("\n- ")[0]
    assert all(f"`{name}`" in paragraph for name in exact), paragraph


def test_sampling_noise_and_batch_order_do_not_depend_on_torchs_global_seed() -> None:
    """Training seeds torch's global generator with the logged seed; userdp's own draws (sampling, noise,
    local batch order) must not come from it: two global seeds, one root, the same model."""
    from support import tiny_gpt2

    data = _users(["a", "b", "c"], 2)
    root = Randomness.secure()
    models = []
    for seed in (1, 2):
        model = tiny_gpt2()
        torch.manual_seed(seed)
        UserDp(UserDpParams(rounds=2, q_user=0.5, noise_multiplier=1.0, accountant="rdp"), Population.declared(3),
               root).train(model, data, causal_lm_loss, CPU, lambda r: None)
        models.append(parameters_to_vector(model.parameters()))
    assert torch.equal(models[0], models[1])
