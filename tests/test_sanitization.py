"""Local-DP sanitization: output sets on hand-made embeddings, the exponential mechanism's sampling
distribution (chi-square against probabilities computed here from the formula), the epsilon-LDP ratio
inside an input set, the strategies, and the kept-token share falling with epsilon."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from uedp.errors import UedpError
from uedp.privacy.sanitization.embeddings import Embeddings, load_vectors
from uedp.privacy.sanitization.mapping import build_mapping, nearest
from uedp.privacy.sanitization.mechanisms import CusText, SanText, privatize, releases_per_record, sample

from support import write


def line(points: list[float]) -> Embeddings:
    """Tokens t0, t1, ... on a line at the given positions (1-D embeddings)."""
    return Embeddings([f"t{i}" for i in range(len(points))], np.asarray(points, dtype=np.float32)[:, None])


def sets_of(mapping, n: int) -> list[set[int]]:
    return [set(mapping.output_set(i).tolist()) for i in range(n)]


def test_nearest_is_closest_first_with_itself_first() -> None:
    table = nearest(line([0, 1, 3, 4.5, 6]).vectors, 3, "euclidean")
    assert table.tolist() == [[0, 1, 2], [1, 0, 2], [2, 3, 1], [3, 2, 4], [4, 3, 2]]


def test_output_sets_of_the_three_mappings_on_a_hand_made_table() -> None:
    emb = line([0, 1, 3, 4.5, 6])  # t0 t1 | t2 t3 | t4 with K = 2
    aggressive = build_mapping(emb, 2, "aggressive")
    assert sets_of(aggressive, 5) == [{0, 1}, {1, 0}, {2, 3}, {3, 2}, {4, 3}]
    assert aggressive.unprotected_share == 1.0  # every token has its own output set: 1-N

    balanced = build_mapping(emb, 2, "balanced")
    # t0 takes {t0, t1} for both; t2 takes {t2, t3} for both; t4's set {t4, t3} is its own (t3 was taken).
    assert sets_of(balanced, 5) == [{0, 1}, {0, 1}, {2, 3}, {2, 3}, {3, 4}]
    assert balanced.input_set_sizes.tolist() == [2, 2, 2, 2, 1] and balanced.unprotected_share == pytest.approx(0.2)

    conservative = build_mapping(emb, 2, "conservative")
    assert sets_of(conservative, 5) == [{0, 1}, {0, 1}, {2, 3}, {2, 3}, {4}]  # a partition
    assert max(len(s) for s in sets_of(conservative, 5)) == 2


def test_mapping_is_cached_by_content(tmp_path: Path) -> None:
    emb = line([0, 1, 3, 4.5, 6])
    first = build_mapping(emb, 2, "balanced", cache_dir=tmp_path)
    files = list(tmp_path.glob("custext-mapping-*.npz"))
    assert len(files) == 1
    again = build_mapping(emb, 2, "balanced", cache_dir=tmp_path)
    assert np.array_equal(first.output_sets, again.output_sets) and np.array_equal(first.group_of, again.group_of)
    other = build_mapping(line([0, 1, 3, 4.5, 7]), 2, "balanced", cache_dir=tmp_path)
    assert other.k == 2 and len(list(tmp_path.glob("custext-mapping-*.npz"))) == 2  # new content, new entry


def _custext_probabilities(points: list[float], token: int, members: list[int], epsilon: float) -> np.ndarray:
    """Eq. 3.3.1 and 3.3.4 by hand: u = 1 - minmax(|x - y|), Pr ~ exp(eps u / 2)."""
    d = np.array([abs(points[token] - points[m]) for m in members])
    u = 1 - (d - d.min()) / (d.max() - d.min())
    w = np.exp(epsilon * u / 2)
    return w / w.sum()


@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_custext_samples_follow_the_exponential_mechanism(epsilon: float) -> None:
    points = [0, 0.5, 2, 3, 7, 7.5, 9, 12]
    emb = line(points)
    mapping = build_mapping(emb, 4, "aggressive")
    sampler = CusText(emb, mapping, epsilon)
    token = 2
    members = mapping.output_set(token).tolist()
    expected = _custext_probabilities(points, token, members, epsilon)
    n = 40_000
    drawn = sample(sampler, np.full(n, token), torch.Generator().manual_seed(7))
    observed = np.array([(drawn == m).sum() for m in members])
    assert observed.sum() == n  # nothing outside the output set
    assert chisquare(observed, expected * n).pvalue > 1e-3
    # and it would notice the wrong formula (e.g. no 1/2, i.e. Delta_u misread as 1/2)
    wrong = np.exp(epsilon * (1 - (np.abs(np.array(points)[members] - points[token]) / 5)))
    assert chisquare(observed, wrong / wrong.sum() * n).pvalue < 1e-6


def test_santext_samples_follow_the_exponential_mechanism_over_the_vocabulary() -> None:
    points = [0, 0.5, 2, 3, 4]
    emb = line(points)
    sampler = SanText(emb, epsilon=2.0)
    n = 40_000
    drawn = sample(sampler, np.full(n, 1), torch.Generator().manual_seed(3))
    weights = np.exp(-2.0 * np.abs(np.array(points) - points[1]) / 2)
    observed = np.bincount(drawn, minlength=len(points))
    assert chisquare(observed, weights / weights.sum() * n).pvalue > 1e-3
    assert sampler.diameter == pytest.approx(4.0) and sampler.per_token_epsilon == pytest.approx(8.0)


def test_inputs_sharing_an_output_set_are_epsilon_indistinguishable() -> None:
    rng = np.random.default_rng(0)
    emb = Embeddings([f"w{i}" for i in range(120)], rng.normal(size=(120, 6)).astype(np.float32))
    epsilon = 1.5
    for mode in ("balanced", "conservative"):
        mapping = build_mapping(emb, 10, mode)  # type: ignore[arg-type]
        sampler = CusText(emb, mapping, epsilon)
        for group in range(len(mapping.output_sets)):
            inputs = np.flatnonzero(mapping.group_of == group)
            if len(inputs) < 2:
                continue
            _, probs = sampler.distribution(inputs)
            ratio = probs.max(axis=0) / probs.min(axis=0)
            assert ratio.max() <= math.exp(epsilon) * (1 + 1e-9)


def test_every_occurrence_gets_its_own_draw_and_shared_draw_strategies_are_withdrawn() -> None:
    rng = np.random.default_rng(1)
    emb = Embeddings([f"w{i}" for i in range(60)], rng.normal(size=(60, 4)).astype(np.float32))
    sampler = CusText(emb, build_mapping(emb, 30, "aggressive"), epsilon=0.1)  # nearly uniform over 30
    records = [np.array([5, 5, 5, 5, 5, 5, -1, 7]), np.array([5, 5, 9, 5, 5, 5])]
    token = privatize(records, sampler, torch.Generator().manual_seed(0))
    assert len(set(token[0][:6].tolist())) > 1  # independent draws
    assert token[0][6] == -1  # kept positions untouched
    assert releases_per_record(records).tolist() == [7, 6]
    for withdrawn in ("record", "dataset"):  # "x y x" vs "x' y x": no per-token epsilon holds
        with pytest.raises(ValueError, match=f"strategy '{withdrawn}' was withdrawn"):
            SanitizeConfig(dataset="d", epsilon=1.0, embeddings="v.txt", strategy=withdrawn)


def test_kept_share_falls_as_epsilon_falls() -> None:
    rng = np.random.default_rng(2)
    emb = Embeddings([f"w{i}" for i in range(300)], rng.normal(size=(300, 8)).astype(np.float32))
    mapping = build_mapping(emb, 20, "balanced")
    records = [rng.integers(0, 300, size=40) for _ in range(200)]
    shares = []
    for epsilon in (0.5, 2.0, 8.0, 32.0):
        out = privatize(records, CusText(emb, mapping, epsilon), torch.Generator().manual_seed(0))
        shares.append(float(np.mean(np.concatenate(out) == np.concatenate(records))))
    assert shares == sorted(shares) and shares[0] < 0.12 < 0.9 < shares[-1], shares
    santext = [float(np.mean(np.concatenate(privatize(records, SanText(emb, e), torch.Generator().manual_seed(0)))
                             == np.concatenate(records))) for e in (0.5, 8.0)]
    assert santext[0] < santext[1]


def test_vector_files_read_glove_and_word2vec_and_name_bad_lines(tmp_path: Path) -> None:
    glove = write(tmp_path / "g.txt", "the 0.1 0.2\ncat 0.3 0.4\n")
    w2v = write(tmp_path / "w.txt", "2 2\nthe 0.1 0.2\ncat 0.3 0.4\n")
    assert load_vectors(glove).tokens == load_vectors(w2v).tokens == ["the", "cat"]
    assert load_vectors(glove, limit=1).tokens == ["the"]
    assert load_vectors(glove).lookup("Cat") == 1  # lower-case fallback
    with pytest.raises(UedpError, match=r"b\.txt:2: 1 numbers where earlier lines have 2"):
        load_vectors(write(tmp_path / "b.txt", "the 0.1 0.2\ncat 0.3\n"))
    with pytest.raises(UedpError, match=r"c\.txt:1: expected a token followed by numbers"):
        load_vectors(write(tmp_path / "c.txt", "the x y\n"))


# --- the sanitize task on a real dataset -----------------------------------------------------------
import re  # noqa: E402

from typer.testing import CliRunner  # noqa: E402

from uedp.detection.pipeline import DetectorConfig  # noqa: E402
from uedp.flows.demo import DEMO_CORPUS  # noqa: E402
from uedp.services.detect import detect_entities  # noqa: E402
from uedp.services.sanitize import SanitizeConfig, sanitize_dataset  # noqa: E402
from uedp.storage.ingest import IngestOptions, ingest  # noqa: E402
from uedp.storage.tables import read_manifest, read_table  # noqa: E402


@pytest.fixture
def vectors(tmp_path: Path) -> Path:
    """Made-up public vectors for the demo corpus' words (and some more): seeded, written by the test."""
    words = sorted({w for w in re.findall(r"\w+(?:['’-]\w+)*|[^\w\s]", DEMO_CORPUS.read_text()) if w.strip()})
    words = [w for w in words if w not in ("-DOCSTART-", "DOCSTART")] + [f"extra{i}" for i in range(50)]
    rng = np.random.default_rng(0)
    lines = [f"{w} " + " ".join(f"{x:.4f}" for x in rng.normal(size=8)) for w in words]
    return write(tmp_path / "vectors.txt", "\n".join(lines) + "\n")


@pytest.fixture
def demo(home) -> str:
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    return "demo"


def _texts(home, dataset: str) -> dict[str, list[str]]:
    rows = read_table(home.table_dir(dataset, "sentences")).to_pylist()
    return {split: [r["text"] for r in rows if r["split"] == split] for split in ("train", "valid", "test")}


def test_sanitize_rewrites_train_only_with_a_statement_and_reuses(home, demo: str, vectors: Path) -> None:
    config = SanitizeConfig(dataset=demo, mechanism="custext", epsilon=1.0, k=5, embeddings=str(vectors))
    result = sanitize_dataset(home, config)
    assert result.dataset == "demo-custext-e1-k5-token" and not result.reused
    before, after = _texts(home, demo), _texts(home, result.dataset)
    assert after["valid"] == before["valid"] and after["test"] == before["test"]
    changed = sum(a != b for a, b in zip(after["train"], before["train"]))
    assert changed > 0.9 * len(before["train"])
    assert result.sanitized_share == 1.0 and result.unknown_share < 0.05
    assert result.record_epsilon_max >= result.record_epsilon_median >= 1.0 and result.user_epsilon_max > result.record_epsilon_max
    manifest = read_manifest(home.table_dir(result.dataset, "sentences"))
    assert manifest["sanitization"]["per_token_epsilon"] == 1.0 and "input set" in manifest["sanitization"]["statement"]
    assert read_table(home.table_dir(result.dataset, "users")).equals(read_table(home.table_dir(demo, "users")))
    assert sanitize_dataset(home, config).reused  # never a second draw of the same release


def test_a_word_released_as_unk_is_not_an_original_token_kept() -> None:
    from uedp.privacy.sanitization.mechanisms import KEEP, UNKNOWN
    from uedp.privacy.sanitization.release import release_figures

    sampler = SanText(line([0, 1, 2, 3, 4, 5, 6, 7]), 1.0)
    # kept as is, sanitized into itself, no embedding (released as <unk>), sanitized into another token
    figures = release_figures(sampler, ["u"], [np.array([KEEP, 3, UNKNOWN, 5])], [np.array([KEEP, 3, UNKNOWN, 7])])
    assert figures.unchanged_share == pytest.approx(2 / 4)  # was 3/4: <unk> in, <unk> out counted as kept
    assert figures.sanitized_unchanged_share == pytest.approx(1 / 3) and figures.unknown_share == pytest.approx(1 / 3)


def test_sanitize_non_entities_touches_only_entity_tokens(home, demo: str, vectors: Path) -> None:
    config = SanitizeConfig(dataset=demo, epsilon=0.5, k=10, embeddings=str(vectors), keep="non-entities",
                            categories=["PERSON"], strategy="token")
    result = sanitize_dataset(home, config)
    assert result.dataset == "demo-custext-e0.5-k10-token-entities-PERSON" and 0 < result.sanitized_share < 0.2
    source = {r["sentence_id"]: r for r in read_table(home.table_dir(demo, "sentences")).to_pylist()}
    entities = read_table(home.table_dir(demo, "entities")).to_pylist()
    people = {r["sentence_id"] for r in entities if r["category"] == "PERSON"}
    for row in read_table(home.table_dir(result.dataset, "sentences")).to_pylist():
        if row["split"] == "train" and row["sentence_id"] not in people:
            assert row["text"] == source[row["sentence_id"]]["text"]
    assert result.unchanged_share > 0.8


def test_sanitized_share_kept_falls_with_epsilon_on_the_corpus(home, demo: str, vectors: Path) -> None:
    shares = [sanitize_dataset(home, SanitizeConfig(dataset=demo, mechanism=m, epsilon=e, k=10, embeddings=str(vectors),
                                                    strategy="token")).sanitized_unchanged_share
              for m in ("custext", "santext") for e in (0.5, 16.0)]
    assert shares[0] < shares[1] and shares[2] < shares[3]


def test_cli_sanitizes_and_the_result_trains(home, demo: str, vectors: Path) -> None:
    from uedp.cli import app

    runner = CliRunner()
    out = runner.invoke(app, ["sanitize", demo, "--home", str(home.root), "--epsilon", "2", "--k", "5",
                              "--embeddings", str(vectors), "--keep", "stopwords", "--output", "demo-private"])
    assert out.exit_code == 0, out.output
    assert "per token epsilon 2" in out.output and "stopwords released unchanged" in out.output
    trained = runner.invoke(app, ["train", "demo-private", "--home", str(home.root), "--mechanism", "noiseless",
                                  "--steps", "3", "--checkpoint-every", "0"])
    assert trained.exit_code == 0, trained.output
    bad = runner.invoke(app, ["sanitize", demo, "--home", str(home.root), "--epsilon", "2",
                              "--embeddings", str(home.root / "missing.txt")])
    assert bad.exit_code != 0 and "missing.txt not found" in bad.output


@pytest.mark.slow
def test_mask_token_inference_attack_recovers_less_from_sanitized_text(home, demo: str, vectors: Path,
                                                                       tmp_path: Path) -> None:
    train = [r["text"] for r in read_table(home.table_dir(demo, "sentences")).to_pylist() if r["split"] == "train"]
    from uedp.privacy.attacks.mask_inference import train_masked_lm

    attacker = train_masked_lm(train, tmp_path / "mlm")
    result = sanitize_dataset(home, SanitizeConfig(dataset=demo, epsilon=0.5, k=10, embeddings=str(vectors),
                                                   attack_model=str(attacker), attack_sentences=120))
    assert result.mask_inference_success_original > 0.3  # the attacker's model knows this text well
    assert result.mask_inference_success < 0.5 * result.mask_inference_success_original
    assert result.mask_inference_success_sanitized <= result.mask_inference_success + 1e-9  # all sanitized here
    stored = read_manifest(home.table_dir(result.dataset, "sentences"))["sanitization"]
    assert stored["mask_inference_success"] == pytest.approx(result.mask_inference_success)


def test_custext_trains_through_the_same_task_and_logs_its_local_guarantee(home, demo: str, vectors: Path) -> None:
    from mlflow.tracking import MlflowClient

    from uedp.errors import UedpError
    from uedp.services.config import TrainConfig
    from uedp.services.launch import run_training
    from uedp.services.privacy_budget import ledger_of
    from uedp.services.training import train_configuration

    config = TrainConfig(dataset=demo, mechanism="custext", target_epsilon=2.0, steps=5, checkpoint_every=0,
                         embeddings=str(vectors), k=10)
    # Set-up opens a release and never draws one: a training asked for a release nobody drew says so,
    # and draws, writes and charges nothing.
    with pytest.raises(UedpError, match="'demo-custext-e2-k10-token' this training reads is not drawn"):
        train_configuration(home, config, progress=False)
    assert not home.dataset_dir("demo-custext-e2-k10-token").exists() and not ledger_of(home, demo).read().entries
    result = run_training(home, config)  # the launch draws it (and files it in the ledger), then trains
    assert [entry.key.split(":")[0] for entry in ledger_of(home, demo).read().entries] == ["release"]
    assert result.epsilon == 2.0 and result.delta == 0.0 and 1 < result.utility_test < 300
    run = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(result.run_id)
    assert run.info.experiment_id == MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_experiment_by_name(demo).experiment_id
    assert run.data.params["privacy_unit"].startswith("one sanitized token, replaced by another token of its input set")
    assert "held-out users' text" in run.data.params["privacy_caveats"]  # local DP too: evaluation is not covered
    assert "compare the release with the raw text" in run.data.params["privacy_caveats"]
    assert 0 < run.data.metrics["kept_token_share"] < 0.5 and run.data.metrics["epsilon_record_max"] >= 2.0
    assert read_manifest(home.table_dir("demo-custext-e2-k10-token", "sentences")) is not None
    from uedp.services.report import markdown, summarise

    report = markdown(summarise([(result, 2.0)]), "t")
    kept = run.data.metrics["kept_token_share"]
    # every token is sanitized (keep=stopwords): the categories change nothing, and the report says so
    assert "Local-DP releases" in report and f"| custext | any (ignores categories) | 2 | {kept:.1%} | - |" in report
    with pytest.raises(ValueError, match="custext needs embeddings and its per-token epsilon"):
        TrainConfig(dataset=demo, mechanism="custext", target_epsilon=2.0)


def test_sweep_runs_local_dp_once_per_epsilon_unless_it_sanitizes_entities(vectors: Path) -> None:
    from uedp.flows.sweep import SweepConfig

    grid = dict(home="h", dataset="d", mechanisms=["custext", "santext"], category_sets=[["PERSON"], ["LOC"]],
                target_epsilons=[1.0, 4.0])
    sweep = SweepConfig(**grid, embeddings=str(vectors))
    assert len(sweep.items()) == 4  # 2 mechanisms x 2 epsilons; categories do not matter
    assert {item.config.params.epsilon for item in sweep.items()} == {1.0, 4.0}  # each target is the per-token epsilon
    entities = SweepConfig(**grid, embeddings=str(vectors), keep="non-entities")
    assert len(entities.items()) == 8
    with pytest.raises(ValueError, match="custext needs embeddings"):
        SweepConfig(home="h", dataset="d", mechanisms=["custext"], target_epsilons=[1.0])


def test_embeddings_can_come_from_the_model_being_trained(home, demo: str, tmp_path: Path) -> None:
    """model:<folder>: the model's input embedding matrix and its own tokenizer's tokens (a real tiny
    GPT-2 with the project's byte-level tokenizer, saved with save_pretrained)."""
    from uedp.models.factory import build_model
    from uedp.models.tokenization import load_tokenizer

    tokenizer = load_tokenizer("byte")
    model = build_model("gpt2", "tiny", tokenizer, None)
    model.save_pretrained(tmp_path / "gpt2")
    tokenizer.save_pretrained(tmp_path / "gpt2")
    result = sanitize_dataset(home, SanitizeConfig(dataset=demo, epsilon=1.0, k=8, embeddings=f"model:{tmp_path / 'gpt2'}",
                                                   strategy="token"))
    assert result.unknown_share == 0.0 and result.sanitized_share == 1.0  # every byte has an embedding
    assert 0.0 < result.sanitized_unchanged_share < 0.5
    before, after = _texts(home, demo)["train"], _texts(home, result.dataset)["train"]
    assert sum(a != b for a, b in zip(after, before)) > 0.9 * len(before)


def test_a_search_of_a_custext_configuration_draws_its_release_before_each_trial(home, demo: str, vectors: Path) -> None:
    """``uedp tune`` trains its trials directly (no launch): it draws the release itself, once, before the
    first trial opens it (set-up only opens releases); later trials reuse it."""
    from uedp.services.config import TrainConfig
    from uedp.services.privacy_budget import ledger_of
    from uedp.services.tune import tune

    config = TrainConfig(dataset=demo, mechanism="custext", target_epsilon=2.0, steps=2, checkpoint_every=0,
                         embeddings=str(vectors), k=10, threads=1)
    record = tune(home, config, {"lr": [1e-3, 3e-3]}, say=lambda line: None, progress=False)
    assert len(record.trials) == 2 and read_manifest(home.table_dir("demo-custext-e2-k10-token", "sentences"))
    assert [entry.key.split(":")[0] for entry in ledger_of(home, demo).read().entries] == ["release"]
