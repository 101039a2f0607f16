"""Train task: one configuration, end to end — data for the chosen categories, model, mechanism,
per-round epsilon, evaluation — tracked as one MLflow run."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from tqdm.auto import tqdm

from models.batching import encode
from models.device import resolve_device
from models.gpt2 import PRESETS, build_gpt2, load_gpt2
from models.metrics import causal_lm_loss, per_sequence_lm_loss, perplexity
from models.tokenization import load_tokenizer
from privacy.deid import redact
from privacy.mechanisms.base import Mechanism, RoundReport, TrainData
from privacy.mechanisms.dpsgd import DpSgd, DpSgdParams
from privacy.mechanisms.noiseless import Noiseless, NoiselessParams
from privacy.mechanisms.selective import SelectiveParams, SelectiveTwoPhase
from privacy.mechanisms.uedp import UeDp, UeDpParams
from privacy.mechanisms.userdp import UserDp, UserDpParams
from storage.catalog import Catalog
from storage.home import DataHome
from storage.tables import read_manifest
from tasks.config import TrainConfig
from tasks.tracking import RunTracker
from uedp.errors import UedpError


@dataclass(frozen=True)
class TrainResult:
    run_id: str
    mechanism: str
    categories: list[str]
    epsilon: float
    delta: float
    noise_multiplier: float
    perplexity_valid: float
    perplexity_test: float
    rounds: int
    notes: str = ""


def build_mechanism(config: TrainConfig, n_users: int, n_examples: int) -> Mechanism:
    """The mechanism a configuration names; the counts of training users and sequences set UeDP's
    bound on sampled users and DP-SGD's sampling rate."""
    try:
        if config.mechanism in ("noiseless", "deid"):
            return Noiseless(NoiselessParams(steps=config.steps, batch_size=config.batch_size, lr=config.lr,
                                             seed=config.seed))
        shared = dict(
            rounds=config.steps, q_user=config.q_user, noise_multiplier=config.noise_multiplier,
            target_epsilon=config.target_epsilon, clip=config.clip, local_steps=config.local_steps,
            local_batch_size=config.local_batch_size, local_lr=config.local_lr, server_lr=config.server_lr,
            weight_cap=config.weight_cap, delta=config.delta, accountant=config.accountant,
            max_epsilon=config.max_epsilon, seed=config.seed, vectorize_users=config.vectorize_users,
        )
        dpsgd = DpSgdParams(steps=config.steps, expected_batch_size=config.batch_size,
                            noise_multiplier=config.noise_multiplier, target_epsilon=config.target_epsilon,
                            clip=config.clip, lr=config.lr, delta=config.delta, accountant=config.accountant,
                            max_epsilon=config.max_epsilon, seed=config.seed)
        if config.mechanism == "dpsgd":
            return DpSgd(dpsgd, n_examples)
        if config.mechanism == "selective":
            public = NoiselessParams(steps=config.public_steps, batch_size=config.batch_size, lr=config.lr,
                                     seed=config.seed)
            return SelectiveTwoPhase(SelectiveParams(public, dpsgd), n_examples)
        if config.mechanism == "userdp":
            return UserDp(UserDpParams(**shared))
        if config.mechanism in ("uedp", "uedp-naive"):
            return UeDp(UeDpParams(**shared, q_entity=config.q_entity, q_extended=config.q_extended,
                                   naive=config.mechanism == "uedp-naive"), n_users)
    except ValueError as exc:
        raise UedpError(f"{config.mechanism}: {exc}") from None
    raise UedpError(f"mechanism {config.mechanism!r} is not available")


@dataclass(frozen=True)
class TrainingTexts:
    """Train-split texts by user, parallel to them each sentence's entity keys (chosen categories), and
    the texts with those entities redacted."""

    texts: dict[str, list[str]]
    entities: dict[str, list[frozenset[str]]]
    redacted: dict[str, list[str]]


def load_training_texts(catalog: Catalog, config: TrainConfig) -> TrainingTexts:
    """Train-split texts by user; ``deid`` trains on the redacted ones in place of the originals."""
    spans = catalog.entity_spans(config.categories, "train")
    texts: dict[str, list[str]] = {}
    entities: dict[str, list[frozenset[str]]] = {}
    redacted: dict[str, list[str]] = {}
    for sentence_id, user_id, text in catalog.sentences("train"):
        found = spans.get(sentence_id, [])
        clean = redact(text, [(s, e, c) for s, e, c, _ in found]) if found else text
        texts.setdefault(user_id, []).append(clean if config.mechanism == "deid" else text)
        redacted.setdefault(user_id, []).append(clean)
        entities.setdefault(user_id, []).append(frozenset(key for _, _, _, key in found))
    return TrainingTexts(texts, entities, redacted)


def _build_model(config: TrainConfig, vocab_size: int, eos_id: int) -> torch.nn.Module:
    if config.model in PRESETS:
        return build_gpt2(config.model, vocab_size, eos_id)
    return load_gpt2(config.model)


def train_configuration(home: DataHome, config: TrainConfig, flow_run_id: str | None = None,
                        progress: bool = True) -> TrainResult:
    """Train and evaluate one configuration; every figure goes to one MLflow run."""
    device = resolve_device(config.device)
    torch.manual_seed(config.seed)
    with Catalog(home, config.dataset) as catalog:
        training = load_training_texts(catalog, config)
        valid_texts = [t for _, _, t in catalog.sentences("valid")]
        test_texts = [t for _, _, t in catalog.sentences("test")]
        category_counts = catalog.category_counts(config.categories)
    if not training.texts:
        raise UedpError(f"dataset {config.dataset!r} has no training sentences")

    tokenizer = load_tokenizer(config.tokenizer)
    pad_id = tokenizer.pad_token_id
    data = TrainData({u: encode(tokenizer, t, config.max_len) for u, t in training.texts.items()}, pad_id,
                     entities=training.entities,
                     redacted={u: encode(tokenizer, t, config.max_len) for u, t in training.redacted.items()}
                     if config.mechanism == "selective" else None)
    valid = encode(tokenizer, valid_texts, config.max_len)
    test = encode(tokenizer, test_texts, config.max_len)
    model = _build_model(config, len(tokenizer), tokenizer.eos_token_id).to(device)
    mechanism = build_mechanism(config, data.n_users, len(data.sequences))
    loss_fn = per_sequence_lm_loss if config.mechanism in ("dpsgd", "selective") else causal_lm_loss

    tags = {
        "uedp.dataset": config.dataset,
        "uedp.mechanism": config.mechanism,
        "uedp.dataset_key": str((read_manifest(home.table_dir(config.dataset, "sentences")) or {}).get("key", "")),
        "uedp.entities_key": str((read_manifest(home.table_dir(config.dataset, "entities")) or {}).get("key", "")),
        "uedp.device": str(device),
    }
    if flow_run_id:
        tags["uedp.flow_run_id"] = flow_run_id
    tracker = RunTracker(home, config.dataset, config.run_name(), tags)
    try:
        tracker.log_params(
            config.model_dump()
            | {"privacy_unit": mechanism.unit, "n_train_users": data.n_users,
               "n_train_sentences": len(data.sequences), "model_parameters": sum(p.numel() for p in model.parameters())}
        )
        tracker.log_metrics({f"entities_{c.category}": c.entities for c in category_counts}
                            | {f"users_with_{c.category}": c.users for c in category_counts})
        tracker.log_metrics({"perplexity_valid": perplexity(model, valid, pad_id, device)}, step=0)
        rounds: list[int] = []
        epsilons: list[float] = []
        total = config.steps + (config.public_steps if config.mechanism == "selective" else 0)
        bar = tqdm(total=total, desc=config.run_name(), unit="round" if config.is_private else "step",
                   disable=not progress, leave=False)

        def on_round(report: RoundReport) -> None:
            tracker.log_metrics({"epsilon": report.epsilon, "train_loss": report.loss,
                                 "participants": report.participants}, step=report.round)
            if math.isfinite(report.epsilon):
                rounds.append(report.round)
                epsilons.append(report.epsilon)
                bar.set_postfix(epsilon=f"{report.epsilon:.3g}")
            elif math.isfinite(report.loss):
                bar.set_postfix(loss=f"{report.loss:.3f}")
            bar.update(1)

        statement = mechanism.train(model, data, loss_fn, device, on_round)
        bar.close()
        ppl_valid = perplexity(model, valid, pad_id, device)
        ppl_test = perplexity(model, test, pad_id, device)
        tracker.log_metrics({"perplexity_valid": ppl_valid}, step=statement.rounds)
        tracker.log_metrics({"perplexity": ppl_test, "perplexity_test": ppl_test, "final_epsilon": statement.epsilon})
        tracker.log_params({"noise_multiplier_used": statement.noise_multiplier, "accountant_used": statement.accountant,
                            "epsilon_reported": "inf" if math.isinf(statement.epsilon) else f"{statement.epsilon:.6g}",
                            "rounds_run": statement.rounds, **{f"privacy_{k}": v for k, v in statement.extra.items()}})
        tracker.log_json({"config": config.model_dump(), "privacy": asdict(statement)}, "resolved_config.json")
        if epsilons:
            tracker.log_curve_plot(rounds, epsilons, "epsilon_per_round.png", "round", "epsilon",
                                   f"{config.mechanism}: epsilon (delta={config.delta:g}, {statement.accountant})")
    except BaseException:
        tracker.finish(failed=True)
        raise
    tracker.finish()
    return TrainResult(
        run_id=tracker.run_id, mechanism=config.mechanism, categories=list(config.categories),
        epsilon=statement.epsilon, delta=statement.delta, noise_multiplier=statement.noise_multiplier,
        perplexity_valid=ppl_valid, perplexity_test=ppl_test, rounds=statement.rounds, notes=statement.notes,
    )


@task(name="train-configuration", cache_policy=NO_CACHE)
def train_task(home: DataHome, config: TrainConfig, flow_run_id: str | None = None) -> TrainResult:
    result = train_configuration(home, config, flow_run_id)
    get_run_logger().info(
        "%s: epsilon=%s perplexity(test)=%.2f run_id=%s", config.run_name(),
        "inf" if math.isinf(result.epsilon) else f"{result.epsilon:.3g}", result.perplexity_test, result.run_id,
    )
    return result

