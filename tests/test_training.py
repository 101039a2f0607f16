"""Training as users run it: `uedp train` and `uedp sweep` through the real CLI, Prefect server and
MLflow store; crash and resume in the same MLflow run; the LSTM LM and the BERT classifier under the
mechanisms (Opacus per-example gradients included) and through from_pretrained-style reloading."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from uedp.cli import app
from uedp.detection.pipeline import DetectorConfig
from uedp.flows.demo import DEMO_CORPUS
from uedp.models.batching import collate, encode
from uedp.models.classifier import build_bert_classifier, load_classifier
from uedp.models.factory import build_model
from uedp.models.lstm import build_lstm, load_lstm
from uedp.models.metrics import classification_loss, per_sequence_lm_loss
from uedp.models.tokenization import byte_level_tokenizer
from uedp.privacy.mechanisms.base import TrainData
from uedp.privacy.mechanisms.dpsgd import DpSgd, DpSgdParams
from uedp.privacy.population import Population
from uedp.services.config import TrainConfig
from uedp.services.detect import detect_entities
from uedp.services.tracking import RunTracker
from uedp.services.training import train_configuration
from uedp.storage.ingest import IngestOptions, ingest

from support import write

runner = CliRunner()
TOKENIZER = byte_level_tokenizer()


@pytest.fixture
def demo(home) -> str:
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    return "demo"


def _client(home) -> MlflowClient:
    return MlflowClient(tracking_uri=home.mlflow_tracking_uri)


@pytest.mark.slow
def test_tiny_sweep_nests_runs_under_a_parent_with_a_report(home, demo: str, prefect_server: None) -> None:
    result = runner.invoke(app, ["sweep", demo, "--home", str(home.root), "--mechanisms", "noiseless,userdp",
                                 "--categories", "PER,LOC", "--epsilons", "8", "--steps", "40", "--rounds", "2",
                                 "--set", "audit_canaries=8"])
    assert result.exit_code == 0, result.output
    client = _client(home)
    experiment = client.get_experiment_by_name(demo)
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("uedp.kind") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    children = {r.data.params["mechanism"]: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert set(children) == {"noiseless", "userdp"}
    userdp = children["userdp"]
    for name in ("mechanism", "model", "categories", "q_user", "noise_multiplier_used", "beta", "local_steps",
                 "local_lr", "seed", "delta", "target_epsilon", "rounds"):
        assert name in userdp.data.params
    assert userdp.data.params["categories"] == "LOC,PERSON" and userdp.data.params["target_epsilon"] == "8.0"
    assert userdp.data.params["rounds"] == "2" and "lr" not in userdp.data.params  # its own parameters only
    assert userdp.data.metrics["final_epsilon"] <= 8.0 and userdp.data.metrics["final_epsilon"] > 7.5
    assert [m.step for m in client.get_metric_history(userdp.info.run_id, "epsilon")] == [1, 2]
    assert {"epsilon_per_round.png", "resolved_config.json"} <= {a.path for a in client.list_artifacts(userdp.info.run_id)}
    # keyed ids, not the tables' content hashes (anyone who guesses the corpus could recompute those)
    sentences_key = json.loads((home.table_dir(demo, "sentences") / "manifest.json").read_text())["key"]
    assert userdp.data.tags["uedp.dataset_id"] == home.keyed_id(sentences_key) != sentences_key
    assert userdp.data.tags["uedp.entities_id"] and sentences_key not in json.dumps(userdp.data.tags)

    # noiseless training learns: validation perplexity falls from its initial value
    history = client.get_metric_history(children["noiseless"].info.run_id, "perplexity_valid")
    assert history[0].step == 0 and history[-1].value < 0.5 * history[0].value

    report = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.md", "report/privacy_utility-any.png"} <= report  # both ignore categories
    markdown = (home.reports_dir(demo) / parent.info.run_id / "report.md").read_text()
    assert "| userdp | any (ignores categories) | 8 |" in markdown
    assert "| noiseless | any (ignores categories) | - | inf |" in markdown
    # the one-run audit of each configuration sits beside its accounted epsilon, in a column and a plot
    assert "| epsilon | audit bound |" in markdown and "report/audit_vs_epsilon.png" in report
    assert all("audit_one_run_epsilon_lower_bound" in r.data.metrics for r in children.values())
    assert f"report: {home.reports_dir(demo) / parent.info.run_id / 'report.md'}" in result.stdout
    logged = json.dumps([r.data.params | r.data.tags for r in runs])
    assert "Okafor" not in logged and "+44" not in logged  # no entity text in MLflow
    _a_finished_configuration_is_reused_only_while_nothing_it_read_changed(home, demo, children)


def _a_finished_configuration_is_reused_only_while_nothing_it_read_changed(home, demo: str, children: dict) -> None:
    """``--reuse-finished`` (what makes a results page resumable): the same sweep again trains nothing and
    reports the runs it finished; another seed, other settings or other data is not taken for them."""
    from uedp.services.config import TrainConfig
    from uedp.services.finished_runs import finished_result

    again = runner.invoke(app, ["sweep", demo, "--home", str(home.root), "--mechanisms", "noiseless,userdp",
                                "--categories", "PER,LOC", "--epsilons", "8", "--steps", "40", "--rounds", "2",
                                "--set", "audit_canaries=8", "--reuse-finished"])
    assert again.exit_code == 0, again.output
    assert again.output.count("finished before (MLflow run") == 2 and ": training" not in again.output
    client = _client(home)
    experiment = client.get_experiment_by_name(demo)
    trained = [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("uedp.kind") != "sweep"]
    assert sorted(r.info.run_id for r in trained) == sorted(r.info.run_id for r in children.values())
    noiseless = TrainConfig.from_logged(json.loads(Path(client.download_artifacts(
        children["noiseless"].info.run_id, "resolved_config.json")).read_text())["config"])
    found = finished_result(home, noiseless)
    assert found is not None and found.run_id == children["noiseless"].info.run_id
    assert found.utility_test == children["noiseless"].data.metrics["perplexity_test"]
    assert finished_result(home, noiseless.model_copy(update={"seed": 1})) is None
    assert finished_result(home, noiseless.model_copy(update={"max_len": noiseless.max_len - 1})) is None
    # a run finished under the shorter name an older uedp gave it (no length) is still this configuration
    assert "-steps40-" in noiseless.run_name()
    client.update_run(found.run_id, name=noiseless.run_name(with_length=False))
    again_found = finished_result(home, noiseless)
    assert again_found is not None and again_found.run_id == found.run_id
    # the same configuration on other text: the dataset ingested again, one sentence fewer
    lines = DEMO_CORPUS.read_text(encoding="utf-8").rstrip("\n").split("\n\n")
    shorter = write(home.root / "shorter.txt", "\n\n".join(lines[:-1]) + "\n")
    ingest(home, demo, [shorter], IngestOptions(format="conll2003"))
    detect_entities(home, demo, DetectorConfig(detectors=["gold"]))
    assert finished_result(home, noiseless) is None


def test_train_prints_the_run_id_and_resumes_a_crashed_run(home, demo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Seeded: only a seeded run replays exactly (a secure one resumes with a fresh secret root).
    config = TrainConfig(dataset=demo, mechanism="userdp", steps=6, checkpoint_every=2, q_user=0.3, local_steps=2,
                         randomness="seeded")
    original = RunTracker.log_metrics

    def crash_at_round_5(self, metrics, step=0):  # type: ignore[no-untyped-def]
        if step == 5 and "epsilon" in metrics:
            raise KeyboardInterrupt  # the process dies after round 5, before its checkpoint
        return original(self, metrics, step)

    monkeypatch.setattr(RunTracker, "log_metrics", crash_at_round_5)
    with pytest.raises(KeyboardInterrupt):
        train_configuration(home, config, progress=False)
    monkeypatch.setattr(RunTracker, "log_metrics", original)
    client = _client(home)
    (crashed,) = client.search_runs([client.get_experiment_by_name(demo).experiment_id])
    assert crashed.info.status == "FAILED"

    resumed = train_configuration(home, config, progress=False)
    assert resumed.run_id == crashed.info.run_id and resumed.resumed_from == 4
    run = client.get_run(resumed.run_id)
    assert run.info.status == "FINISHED" and run.data.params["resumed_from_round"] == "4"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "epsilon")] == [1, 2, 3, 4, 5, 6]

    # the checkpoint is gone once the run finished; a fresh run of the same configuration matches
    cli = runner.invoke(app, ["train", demo, "--home", str(home.root), "--mechanism", "userdp", "--steps", "6",
                              "--q-user", "0.3", "--local-steps", "2", "--checkpoint-every", "2", "--log-model",
                              "--seeded"])
    assert cli.exit_code == 0, cli.output
    fresh_id = cli.stdout.split("MLflow run: ")[1].split()[0]
    fresh = client.get_run(fresh_id)
    saved = {a.path for a in client.list_artifacts(fresh_id, "model")}
    assert {"model/config.json", "model/model.safetensors", "model/tokenizer.json"} <= saved
    assert fresh_id != resumed.run_id and fresh.data.params["resumed_from_round"] == "0"
    assert fresh.data.metrics["final_epsilon"] == pytest.approx(resumed.epsilon, rel=1e-12)
    assert fresh.data.metrics["perplexity_test"] == pytest.approx(resumed.utility_test, rel=1e-6)


def test_lstm_is_the_papers_model_trains_under_opacus_and_reloads(tmp_path: Path) -> None:
    paper = build_lstm("paper", len(TOKENIZER))
    assert (paper.embedding.embedding_dim, paper.lstm.hidden_size) == (200, 200)
    model = build_model("lstm", "tiny", TOKENIZER)
    sequences = encode(TOKENIZER, ["Anna Berg lives in Leeds.", "The clinic opens at nine."] * 4, 32)
    data = TrainData({"u": sequences}, TOKENIZER.pad_token_id)
    before = per_sequence_lm_loss(model, collate(sequences, TOKENIZER.pad_token_id)).item()
    DpSgd(DpSgdParams(steps=30, expected_batch_size=8, noise_multiplier=0.5, lr=1e-2, delta=1e-3),
          Population.declared(8)).train(
        model, data, per_sequence_lm_loss, torch.device("cpu"), lambda r: None)
    after = per_sequence_lm_loss(model, collate(sequences, TOKENIZER.pad_token_id)).item()
    assert after < before  # DP-SGD with per-example gradients of the recurrent layer made progress
    model.save_pretrained(tmp_path / "lstm")
    reloaded = load_lstm(tmp_path / "lstm")
    batch = collate(sequences, TOKENIZER.pad_token_id)
    with torch.no_grad():
        assert torch.equal(model(batch["input_ids"]).logits,
                           reloaded(batch["input_ids"]).logits)


def test_lstm_prediction_ignores_right_padding() -> None:
    model = build_lstm("tiny", len(TOKENIZER))
    short = encode(TOKENIZER, ["Leeds"], 16)[0]
    padded = collate([short, encode(TOKENIZER, ["a much longer sentence"], 32)[0]], TOKENIZER.pad_token_id)
    with torch.no_grad():
        alone = model(short.unsqueeze(0)).logits[0]
        in_batch = model(padded["input_ids"]).logits[0, : len(short)]
    assert torch.allclose(alone, in_batch, atol=1e-6)


def _labelled_corpus(tmp_path: Path) -> Path:
    rows = []
    for i in range(120):
        label = i % 2
        topic = ["the match ended with a late goal", "shares fell as the market closed"][label]
        split = "test" if i >= 100 else "train"
        rows.append({"text": f"{topic} ({i})", "label": str(label + 1), "user": f"u{i % 10}", "split": split})
    return write(tmp_path / "news.jsonl", "\n".join(json.dumps(r) for r in rows))


def test_bert_classifier_learns_a_labelled_corpus_and_reports_test_error(home, tmp_path: Path) -> None:
    ingest(home, "news", [_labelled_corpus(tmp_path)],
           IngestOptions(format="jsonl", text_col="text", user_col="user", label_col="label", split_col="split"))
    # No detection: a jsonl corpus has no gold tags, and noiseless training needs no entities table.
    result = train_configuration(home, TrainConfig(dataset="news", mechanism="noiseless", model="bert", steps=40,
                                                   lr=3e-3, checkpoint_every=0), progress=False)
    assert result.utility_metric == "error" and result.utility_test < 0.2  # two easy classes, 20 test items
    run = _client(home).get_run(result.run_id)
    assert run.data.params["classes"] == "1,2" and "error_test" in run.data.metrics
    assert run.data.metrics["error_test"] == result.utility_test
    # An error rate is read beside what a model that learnt nothing gets (10 of each class in test).
    assert result.baselines == {"majority": 0.5, "uniform": 0.5}
    assert run.data.metrics["error_test_majority_baseline"] == 0.5
    from uedp.services.report import markdown, summarise

    assert "majority class gives error 0.5; a uniform guess gives 0.5" in markdown(summarise([(result, None)]), "t")


def test_baseline_errors_are_the_majority_class_and_a_uniform_guess() -> None:
    from uedp.models.metrics import baseline_errors

    assert baseline_errors([0, 0, 0, 1, 2, 2], 4) == pytest.approx({"majority": 0.5, "uniform": 0.75})
    with pytest.raises(ValueError):
        baseline_errors([], 2)


def test_bert_classifier_per_example_gradients_and_from_pretrained(tmp_path: Path) -> None:
    model = build_bert_classifier("tiny", len(TOKENIZER), 3, TOKENIZER.pad_token_id)
    examples = [(ids, i % 3) for i, ids in enumerate(encode(TOKENIZER, ["one", "two words", "three words here"], 16))]
    statement = DpSgd(DpSgdParams(steps=2, expected_batch_size=3, delta=1e-3), Population.declared(3)).train(
        model, TrainData({"u": examples}, TOKENIZER.pad_token_id), classification_loss, torch.device("cpu"),
        lambda r: None).statement
    assert 0 < statement.epsilon < math.inf
    model.save_pretrained(tmp_path / "encoder")
    reloaded = load_classifier(tmp_path / "encoder", num_labels=3)
    batch = collate(examples, TOKENIZER.pad_token_id)
    model.eval()
    with torch.no_grad():
        assert torch.allclose(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                              reloaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits)
