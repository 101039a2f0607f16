"""The attacks work: a noiseless model trained for several epochs on a tiny corpus with a repeated canary
shows high exposure, membership AUC well above 0.5 and extractable entities; a strongly private model
does not, and no audit lower bound exceeds its accounted epsilon."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from uedp.models.batching import encode
from uedp.models.gpt2 import build_gpt2
from uedp.models.metrics import causal_lm_loss, per_sequence_lm_loss
from uedp.models.tokenization import byte_level_tokenizer
from uedp.privacy.attacks.canaries import Canary, canary_format, exposure, model_log_perplexity, plant_canaries
from uedp.privacy.attacks.extraction import Occurrence, extraction_rates
from uedp.privacy.attacks.membership import membership_attack, sentence_scores
from uedp.privacy.attacks.metrics import attack_figures, clopper_pearson
from uedp.privacy.mechanisms.base import TrainData
from uedp.privacy.mechanisms.dpsgd import DpSgd, DpSgdParams
from uedp.privacy.mechanisms.noiseless import Noiseless, NoiselessParams
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness

from support import tiny_gpt2

TOKENIZER = byte_level_tokenizer()
CPU = torch.device("cpu")
WORDS = ("river", "lamp", "orbit", "velvet", "granite", "meadow", "cipher", "harbor", "ember", "quartz", "willow",
         "saddle", "tundra", "beacon", "marble", "falcon")


def _sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(5)) + f" {rng.randrange(100)} ." for _ in range(n)]


def test_clopper_pearson_matches_known_intervals() -> None:
    low, high = clopper_pearson(5, 10, 0.05)
    assert low == pytest.approx(0.187086, abs=1e-5) and high == pytest.approx(0.812914, abs=1e-5)
    assert clopper_pearson(0, 20, 0.05) == (0.0, pytest.approx(0.168433, abs=1e-5))


def test_figures_on_synthetic_scores() -> None:
    rng = np.random.default_rng(0)
    same = attack_figures(rng.normal(size=500), rng.normal(size=500))
    assert abs(same.auc - 0.5) < 0.06 and same.balanced_accuracy < 0.58
    separated = attack_figures(rng.normal(5, 1, 500), rng.normal(0, 1, 500))
    assert separated.auc > 0.99 and separated.tpr_at_1pct_fpr > 0.9


def test_exposure_exact_and_skew_normal_agree_on_a_known_score() -> None:
    fmt = canary_format("digits:4")
    rng = np.random.default_rng(1)
    values = {fmt.template.format(secret=fmt.secret_at(i)): v for i, v in enumerate(rng.normal(50, 3, fmt.size))}
    canary = Canary(fmt.name, 1234, fmt.secret_at(1234), fmt.template.format(secret=fmt.secret_at(1234)), "u", 1)
    values[canary.text] = 50 - 3 * 3.0  # three standard deviations below the rest: rank about 14 of 10,000

    def score(texts: list[str]) -> np.ndarray:
        return np.array([values[t] for t in texts])

    exact = exposure(canary, score)
    assert exact.method == "exact" and 8.5 < exact.exposure < 10.5
    estimated = exposure(canary, score, exact_limit=100, samples=4000)
    assert estimated.method == "skew-normal" and abs(estimated.exposure - exact.exposure) < 1.0


def test_calibrated_scores_use_zlib_size_and_the_reference_loss() -> None:
    texts = ["aaaaaaaaaaaaaaaaaaaaaaaa", "qzjxkvbw"]

    def target(batch: list[str]) -> np.ndarray:
        return np.array([[10.0, 5.0] for _ in batch])  # summed NLL 10 over 5 tokens for every text

    def reference(batch: list[str]) -> np.ndarray:
        return np.array([[20.0, 5.0], [5.0, 5.0]][: len(batch)])

    assert sentence_scores(texts, target).tolist() == [-2.0, -2.0]
    zlib = sentence_scores(texts, target, "zlib")
    assert zlib[0] < zlib[1]  # zlib finds the repetitive text predictable: the same loss says less about membership
    assert sentence_scores(texts, target, "reference", reference).tolist() == [2.0, -1.0]
    with pytest.raises(ValueError, match="reference model"):
        sentence_scores(texts, target, "reference")


def test_planting_is_seeded_and_leaves_the_input_alone() -> None:
    texts = {"a": ["x", "y"], "b": ["z"]}
    planted, canaries = plant_canaries(texts, 3, 2, ["digits:6", "name", "email"], seed=7)
    again, same = plant_canaries(texts, 3, 2, ["digits:6", "name", "email"], seed=7)
    assert planted == again and canaries == same and texts == {"a": ["x", "y"], "b": ["z"]}
    assert sum(len(v) for v in planted.values()) == 3 + 3 * 2
    for canary in canaries:
        assert planted[canary.user].count(canary.text) == 2
    assert [c.format for c in canaries] == ["digits:6", "name", "email"]
    _, hosted = plant_canaries(texts, 4, 1, ["phone"], seed=1, users=["b"])
    assert {c.user for c in hosted} == {"b"}
    with pytest.raises(ValueError, match="not among the training users: zz"):
        plant_canaries(texts, 1, 1, ["phone"], seed=1, users=["zz"])


@pytest.fixture(scope="module")
def trained() -> dict[str, object]:
    members, non_members = _sentences(80, seed=1), _sentences(80, seed=2)
    corpus = {f"u{i}": members[i::8] for i in range(8)}
    corpus, canaries = plant_canaries(corpus, 2, 8, ["digits:4"], seed=3)
    secret_sentences = ["Patient file of Imelda Okafor is closed ."] * 8
    corpus["u0"] += secret_sentences
    data = TrainData({u: encode(TOKENIZER, t, 64) for u, t in corpus.items()}, TOKENIZER.pad_token_id)
    models = {}
    torch.manual_seed(0)
    noiseless = build_gpt2("tiny", len(TOKENIZER), TOKENIZER.eos_token_id)
    Noiseless(NoiselessParams(steps=500, batch_size=16, lr=3e-3)).train(noiseless, data, causal_lm_loss, CPU, lambda r: None)
    models["noiseless"] = (noiseless, math.inf)
    torch.manual_seed(0)
    private = build_gpt2("tiny", len(TOKENIZER), TOKENIZER.eos_token_id)
    statement = DpSgd(DpSgdParams(steps=100, expected_batch_size=16, noise_multiplier=4.0, lr=3e-3, delta=1e-3),
                      Population.declared(len(data.sequences)), Randomness.seeded(0)).train(
        private, data, per_sequence_lm_loss, CPU, lambda r: None).statement
    models["private"] = (private, statement.epsilon)
    return {"models": models, "canaries": canaries, "members": members, "non_members": non_members}


def _nll(model: torch.nn.Module):  # type: ignore[no-untyped-def]
    from uedp.models.metrics import sequence_nll

    return lambda texts: sequence_nll(model, encode(TOKENIZER, texts, 64), TOKENIZER.pad_token_id, CPU).numpy()


@pytest.mark.slow
def test_canary_exposure_is_high_without_noise_and_low_with_strong_dp(trained) -> None:  # type: ignore[no-untyped-def]
    exposures = {}
    for name, (model, _) in trained["models"].items():
        score = model_log_perplexity(model, TOKENIZER, CPU)
        exposures[name] = [exposure(c, score).exposure for c in trained["canaries"]]
    assert min(exposures["noiseless"]) > 10  # of at most log2(10^4) = 13.3
    assert max(exposures["private"]) < 6


def test_membership_auc_is_high_without_noise_and_low_with_strong_dp(trained) -> None:  # type: ignore[no-untyped-def]
    results = {}
    for name, (model, _) in trained["models"].items():
        members = sentence_scores(trained["members"], _nll(model))
        non_members = sentence_scores(trained["non_members"], _nll(model))
        results[name] = membership_attack("sentence", "none", members, non_members, 80)
    assert results["noiseless"].figures.auc > 0.8
    assert results["private"].figures.auc < 0.65


def test_memorised_entity_is_extracted_only_without_noise(trained) -> None:  # type: ignore[no-untyped-def]
    occurrence = [Occurrence("PERSON", "Patient file of ", "Imelda Okafor")]
    rates = {name: extraction_rates(model, TOKENIZER, occurrence, 5, CPU)["PERSON"]
             for name, (model, _) in trained["models"].items()}
    assert rates["noiseless"] == (1, 1) and rates["private"] == (0, 1)


def test_extraction_prompts_longer_than_the_models_positions_keep_their_right_end() -> None:
    """A prompt of three times GPT-2's positions used to index past its position table (IndexError)."""
    model = tiny_gpt2()
    positions = model.config.n_positions
    occurrence = Occurrence("PERSON", "word " * (positions * 3 // 5) + "Patient file of ", "Imelda Okafor")
    hits, tried = extraction_rates(model, TOKENIZER, [occurrence], 2, CPU)["PERSON"]
    assert tried == 1 and hits in (0, 1)
    too_long = Occurrence("PERSON", "x", "y" * (positions + 5))  # cannot be continued into: left out
    assert extraction_rates(model, TOKENIZER, [too_long], 2, CPU) == {}


@pytest.mark.slow
def test_train_with_canaries_then_attack_logs_scores_to_the_run(home, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from uedp.cli import app
    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.demo import DEMO_CORPUS
    from uedp.services.detect import detect_entities
    from uedp.storage.ingest import IngestOptions, ingest

    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    runner, client = CliRunner(), MlflowClient(tracking_uri=home.mlflow_tracking_uri)
    runs = {}
    for mechanism, extra in (("noiseless", ["--steps", "250", "--lr", "5e-3"]),  # canary exposure 11.1 (seeded)
                             ("dpsgd", ["--steps", "60", "--noise-multiplier", "3", "--lr", "3e-3"])):
        trained = runner.invoke(app, ["train", "demo", "--home", str(home.root), "--mechanism", mechanism,
                                      "--canaries", "2", "--seeded", "--canary-repeats", "12", "--canary-formats", "digits:4",
                                      "--categories", "PER", *extra])
        assert trained.exit_code == 0, trained.output
        runs[mechanism] = trained.stdout.split("MLflow run: ")[1].split()[0]
        attacked = runner.invoke(app, ["attack", runs[mechanism], "--home", str(home.root), "--members", "60",
                                       "--member-users", "4", "--extraction-limit", "20"])
        assert attacked.exit_code == 0, attacked.output
    calibrated = runner.invoke(app, ["attack", runs["noiseless"], "--home", str(home.root), "--kind", "mia",
                                     "--members", "60", "--member-users", "4", "--reference-run", runs["dpsgd"]])
    assert calibrated.exit_code == 0, calibrated.output
    noiseless, private = (client.get_run(runs[m]).data.metrics for m in ("noiseless", "dpsgd"))
    assert "mia_sentence_reference_auc" in noiseless and "mia_sentence_reference_auc" not in private
    for metrics in (noiseless, private):
        for name in ("canary_exposure_mean", "mia_sentence_auc", "mia_user_auc", "mia_sentence_zlib_auc",
                     "mia_sentence_tpr_at_1pct_fpr", "mia_sentence_balanced_accuracy", "extraction_top5_PERSON"):
            assert name in metrics, name
        # Train file vs test file is no random membership: no epsilon bound is derived from it (issue 32, item 3).
        assert not [k for k in metrics if "epsilon_lower_bound" in k]
    assert noiseless["canary_exposure_mean"] > 9 > 5 > private["canary_exposure_mean"]
    assert "accounted epsilon: " in attacked.output and "at delta 1e-05" in attacked.output  # the dpsgd run's
    assert "membership score, sentences" in attacked.output and "random baseline" in attacked.output
    assert "its figures are attack scores" in " ".join(attacked.output.split())
    assert client.get_run(runs["dpsgd"]).data.tags["uedp.attack.kinds"] == "canary,mia,extraction"
    # One attack failing keeps what the others computed, logs it, and says which failed (exit 2).
    plain = runner.invoke(app, ["train", "demo", "--home", str(home.root), "--mechanism", "noiseless", "--steps", "5",
                                "--log-model", "--seeded", "--categories", "PER"])
    assert plain.exit_code == 0, plain.output
    plain_run = plain.stdout.split("MLflow run: ")[1].split()[0]
    import uedp.services.attack as attack_module

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise IndexError("index out of range in self")

    monkeypatch.setattr(attack_module, "extraction_rates", broken)
    partial = runner.invoke(app, ["attack", plain_run, "--home", str(home.root), "--members", "30"])
    assert partial.exit_code == 2 and "extraction failed (IndexError: index out of range in self)" in partial.output
    assert "skipped canary: the run planted no canaries" in partial.output
    logged = client.get_run(plain_run).data.metrics
    assert "mia_sentence_auc" in logged and not any(k.startswith("extraction_") for k in logged)
    assert client.get_run(plain_run).data.tags["uedp.attack.kinds"] == "mia"
    explicit = runner.invoke(app, ["attack", plain_run, "--home", str(home.root), "--kind", "canary"])
    assert explicit.exit_code == 2 and "planted no canaries" in explicit.output
    missing = runner.invoke(app, ["attack", "0" * 32, "--home", str(home.root)])
    assert missing.exit_code == 2 and f"no MLflow run '{'0' * 32}'" in missing.output
    bad = runner.invoke(app, ["train", "demo", "--home", str(home.root), "--mechanism", "noiseless",
                              "--canaries", "1", "--canary-formats", "digits:99"])
    assert bad.exit_code == 2 and "canary_formats" in bad.output and "1 to 12 digits" in bad.output
