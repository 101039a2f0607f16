"""Fine-tuning the models people download: a tiny Llama-family checkpoint folder the test saves (config,
weights, its own tokenizer), passed as ``--model FOLDER`` and trained through the real CLI under dpsgd, userdp
and uedp-bounded, fully and with LoRA; crashed and resumed; its logged adapter loaded back on its base;
``--init-from`` a public run, and the refusals (the same text, a changed base, a folder of another kind)."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from uedp.cli import app
from uedp.errors import UedpError
from uedp.models.checkpoints import content_hash
from uedp.models.saving import load_saved
from uedp.services.config import TrainConfig
from uedp.services.tracking import RunTracker

from support import REPO, reuters_corpus, tiny_checkpoint

DEMO = REPO / "uedp" / "data" / "demo.conll"
runner = CliRunner()


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("checkpoints") / "tiny-llama")


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory: pytest.TempPathFactory, prefect_server: None) -> Path:
    """The bundled demo corpus with gold entities, and a public corpus of other text (``pub``: generated
    Reuters-21578 articles; an edited copy of demo's own lines would share its sentences, and be refused)."""
    home = tmp_path_factory.mktemp("home")
    public = reuters_corpus(home / "public")
    for args in (["ingest", "conll2003", str(DEMO), "--name", "demo"], ["detect", "demo", "--detector", "gold"],
                 ["ingest", "reuters21578", *map(str, public), "--name", "pub"]):
        result = runner.invoke(app, [*args, "--home", str(home)])
        assert result.exit_code == 0, result.output
    return home


def _train(home: Path, *args: str) -> str:
    result = runner.invoke(app, ["train", "demo", "--home", str(home), "--seeded", *args])
    assert result.exit_code == 0, result.output
    return result.stdout.split("MLflow run: ")[1].split()[0]


MECHANISMS = {"dpsgd": ["--steps", "4", "--batch-size", "16"],
              "userdp": ["--rounds", "4", "--q-user", "0.3", "--local-steps", "1"],
              "uedp-bounded": ["--rounds", "4", "--q-user", "0.3", "--local-steps", "1", "--holders-per-entity", "2"]}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("mechanism", list(MECHANISMS))
def test_a_llama_checkpoint_folder_trains_crashes_and_resumes_under_each_mechanism(
        demo_home: Path, llama: Path, mechanism: str, lora: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--model", str(llama), "--mechanism", mechanism, *MECHANISMS[mechanism], "--checkpoint-every", "2",
            *(["--lora-rank", "2"] if lora else [])]
    original = RunTracker.log_metrics
    saved: dict[str, torch.Tensor] = {}

    def crash_at_round_3(self, metrics, step=0):  # type: ignore[no-untyped-def]
        if step == 3 and "epsilon" in metrics:
            (checkpoint,) = (demo_home / "checkpoints").glob("demo-*/checkpoint.pt")
            saved.update(torch.load(checkpoint, weights_only=False)["objects"]["model"])
            raise KeyboardInterrupt  # the process dies after round 3, after the checkpoint of round 2
        return original(self, metrics, step)

    monkeypatch.setattr(RunTracker, "log_metrics", crash_at_round_3)
    crashed = runner.invoke(app, ["train", "demo", "--home", str(demo_home), "--seeded", *args])
    assert crashed.exit_code != 0
    monkeypatch.setattr(RunTracker, "log_metrics", original)
    run_id = _train(demo_home, *args)

    run = MlflowClient(tracking_uri=f"sqlite:///{demo_home / 'mlflow.db'}").get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["resumed_from_round"] == "2"
    assert 0 < run.data.metrics["final_epsilon"] < float("inf") and run.data.metrics["perplexity_test"] > 1
    assert str(llama.resolve()) in run.data.params["privacy_public"] and content_hash(llama) in \
        run.data.params["privacy_public"]
    total, trainable = int(run.data.params["model_parameters"]), int(run.data.params["trainable_parameters"])
    if lora:  # only the adapters train, and only they are in the resumable checkpoint
        assert trainable < total / 10 and saved and all("lora_" in name for name in saved)
    else:
        assert trainable == total and any("embed_tokens" in name for name in saved)


def test_a_lora_run_logs_its_adapter_and_base_and_evaluation_loads_them_back(demo_home: Path, llama: Path,
                                                                             tmp_path: Path) -> None:
    run_id = _train(demo_home, "--model", str(llama), "--mechanism", "dpsgd", "--steps", "2", "--lora-rank", "4",
                    "--log-model")
    tracker = RunTracker.attach(_home(demo_home), run_id)
    folder = tracker.download("model", tmp_path)
    assert folder is not None and (folder / "adapter_config.json").is_file() and not (folder / "model.safetensors").exists()
    base = json.loads((folder / "base.json").read_text())
    assert base == {"kind": "causal-lm", "source": str(llama.resolve()), "content_hash": content_hash(llama)}

    from uedp.models.batching import encode
    from uedp.models.metrics import perplexity
    from uedp.models.tokenization import load_tokenizer
    from uedp.storage.catalog import Catalog

    model, tokenizer = load_saved(folder, "causal-lm"), load_tokenizer(folder)
    with Catalog(_home(demo_home), "demo") as catalog:
        texts = [text for _, _, text in catalog.sentences("test")]
    logged = tracker.client.get_run(run_id).data.metrics["perplexity_test"]
    assert perplexity(model, encode(tokenizer, texts, 96), tokenizer.pad_token_id, torch.device("cpu")) == \
        pytest.approx(logged, rel=1e-5)

    changed = tmp_path / "changed"  # the same path, other weights: the adapter is not put on it silently
    shutil.copytree(llama, changed)
    tiny_checkpoint(changed, seed=1)
    (folder / "base.json").write_text(json.dumps({**base, "source": str(changed)}))
    with pytest.raises(UedpError, match="now holds sha256:"):
        load_saved(folder, "causal-lm")


def test_init_from_a_public_run_is_named_in_the_statement_and_a_run_on_the_same_text_is_refused(
        demo_home: Path, llama: Path) -> None:
    public_run = runner.invoke(app, ["train", "pub", "--home", str(demo_home), "--model", str(llama), "--mechanism",
                                     "noiseless", "--steps", "3", "--log-model"])
    assert public_run.exit_code == 0, public_run.output
    public_id = public_run.stdout.split("MLflow run: ")[1].split()[0]
    run_id = _train(demo_home, "--model", str(llama), "--init-from", public_id, "--mechanism", "dpsgd", "--steps", "2",
                    "--lora-rank", "2")
    public = MlflowClient(tracking_uri=f"sqlite:///{demo_home / 'mlflow.db'}").get_run(run_id).data.params["privacy_public"]
    assert f"the initial model: run {public_id} (noiseless on dataset 'pub'" in public
    # the run's model folder, passed as a folder, is checked as that run (and keeps the run's tokenizer)
    by_folder = _train(demo_home, "--model", str(llama), "--init-from", str(demo_home / "init" / public_id),
                       "--mechanism", "dpsgd", "--steps", "1")
    public = MlflowClient(tracking_uri=f"sqlite:///{demo_home / 'mlflow.db'}").get_run(by_folder).data.params[
        "privacy_public"]
    assert f"the initial model: run {public_id} (noiseless on dataset 'pub'" in public

    copy = runner.invoke(app, ["ingest", "conll2003", str(DEMO), "--name", "demo-copy", "--home", str(demo_home)])
    assert copy.exit_code == 0, copy.output
    refusal = "that model's weights were trained on the text this run protects"
    for dataset in ("demo", "demo-copy"):  # the same text under another name is the same text
        private_id = _run_id(runner.invoke(app, ["train", dataset, "--home", str(demo_home), "--model", str(llama),
                                                 "--mechanism", "noiseless", "--steps", "1", "--log-model"]))
        refused = runner.invoke(app, ["train", "demo", "--home", str(demo_home), "--model", str(llama), "--init-from",
                                      private_id, "--mechanism", "dpsgd", "--steps", "1"])
        assert refused.exit_code == 2 and refusal in refused.output
        # at one remove: a run on public text that started from it carries it too
        laundered = _run_id(runner.invoke(app, ["train", "pub", "--home", str(demo_home), "--model", str(llama),
                                                "--init-from", private_id, "--mechanism", "noiseless", "--steps", "1",
                                                "--log-model"]))
        refused = runner.invoke(app, ["train", "demo", "--home", str(demo_home), "--model", str(llama), "--init-from",
                                      laundered, "--mechanism", "dpsgd", "--steps", "1"])
        assert refused.exit_code == 2 and refusal in refused.output

    mismatched = runner.invoke(app, ["train", "demo", "--home", str(demo_home), "--model", "gpt2", "--init-from",
                                     public_id, "--mechanism", "dpsgd", "--steps", "1"])
    assert mismatched.exit_code == 2 and "that run trained a causal-lm model; pass --model causal-lm" in mismatched.output
    not_a_run = runner.invoke(app, ["train", "demo", "--home", str(demo_home), "--init-from", "my-model",
                                    "--mechanism", "dpsgd", "--steps", "1"])
    assert not_a_run.exit_code == 2 and "neither a checkpoint folder" in not_a_run.output


def test_starting_from_a_lora_run_fine_tunes_every_merged_weight(demo_home: Path, llama: Path) -> None:
    lora_run = _run_id(runner.invoke(app, ["train", "pub", "--home", str(demo_home), "--model", str(llama), "--lora-rank",
                                           "2", "--mechanism", "noiseless", "--steps", "2", "--log-model"]))
    run_id = _train(demo_home, "--model", str(llama), "--init-from", lora_run, "--mechanism", "dpsgd", "--steps", "1")
    params = MlflowClient(tracking_uri=f"sqlite:///{demo_home / 'mlflow.db'}").get_run(run_id).data.params
    assert params["trainable_parameters"] == params["model_parameters"]  # peft loads adapters frozen; not here


def _run_id(result) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code == 0, result.output
    return str(result.stdout.split("MLflow run: ")[1].split()[0])


def test_a_folder_resolves_to_its_kind_and_own_tokenizer_and_a_wrong_one_is_refused(llama: Path, tmp_path: Path) -> None:
    config = TrainConfig(dataset="demo", mechanism="dpsgd", model=str(llama))
    assert (config.model, config.model_size, config.tokenizer, config.task) == ("causal-lm", str(llama), str(llama), "lm")
    with pytest.raises(UedpError, match=r"not a model kind .* nor a checkpoint folder"):
        TrainConfig(dataset="demo", mechanism="dpsgd", model=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=r"LoRA .* not lstm"):
        TrainConfig(dataset="demo", mechanism="dpsgd", model="lstm", lora_rank=4)

    from transformers import BertConfig, BertForMaskedLM

    from uedp.models.causal_lm import load_causal_lm
    from uedp.models.gpt2 import load_gpt2

    encoder = tmp_path / "encoder"
    BertForMaskedLM(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                               is_decoder=False)).save_pretrained(encoder)
    with pytest.raises(UedpError, match="holds a BertForMaskedLM checkpoint, not a causal language model"):
        load_causal_lm(encoder)
    with pytest.raises(UedpError, match="holds a llama checkpoint"):
        load_gpt2(llama)


def test_a_classifier_folder_trains_as_a_classifier_with_lora_on_the_exact_path(tmp_path: Path,
                                                                               prefect_server: None) -> None:
    """A ``...ForSequenceClassification`` folder: its own tokenizer, an error rate, and (Qwen2's classifier
    is not a verified family) each example's own backward pass, said in one warning naming the class."""
    rows = [{"text": ["the match ended with a late goal", "shares fell as the market closed"][i % 2] + f" ({i})",
             "label": str(i % 2 + 1), "user": f"u{i % 10}", "split": "test" if i >= 50 else "train"} for i in range(60)]
    corpus = tmp_path / "news.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    home = tmp_path / "home"
    ingested = runner.invoke(app, ["ingest", "jsonl", str(corpus), "--name", "news", "--text-col", "text", "--user-col",
                                   "user", "--label-col", "label", "--split-col", "split", "--home", str(home)])
    assert ingested.exit_code == 0, ingested.output
    folder = tiny_checkpoint(tmp_path / "tiny-qwen2-classifier", family="qwen2", num_labels=2)
    unverified = "ghost clipping is not verified for PeftModelForSequenceClassification around Qwen2ForSequenceClassification"
    with pytest.warns(UserWarning, match=unverified):
        result = runner.invoke(app, ["train", "news", "--home", str(home), "--model", str(folder), "--mechanism",
                                     "dpsgd", "--steps", "2", "--lora-rank", "2", "--seeded"])
    assert result.exit_code == 0, result.output
    assert "dpsgd-tiny-qwen2-classifier-lora2-steps2-s0: epsilon" in result.stdout and "test error" in result.stdout


def _home(root: Path):  # type: ignore[no-untyped-def]
    from uedp.storage.home import DataHome

    return DataHome.from_env(root)


def test_a_lora_model_on_a_preset_is_saved_with_its_base_and_loads_back_to_the_same_outputs(tmp_path: Path) -> None:
    """A preset's base is no folder anywhere: its own weights (not peft's wrapped names) travel with the adapter."""
    from uedp.models.causal_lm import build_llama
    from uedp.models.lora import LoraSettings, with_lora
    from uedp.models.saving import BaseIdentity, save_model

    from support import TOKENIZER

    torch.manual_seed(0)
    model = with_lora(build_llama("tiny", len(TOKENIZER), TOKENIZER.eos_token_id), LoraSettings(rank=2, alpha=4.0))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)  # a trained adapter, not peft's zero start
    save_model(model, TOKENIZER, tmp_path / "saved", BaseIdentity("causal-lm", "preset tiny"))
    assert (tmp_path / "saved" / "base" / "model.safetensors").is_file()
    reloaded = load_saved(tmp_path / "saved", "llama")
    ids = torch.tensor([[5, 17, 99, 200, 3]])
    model.eval()
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, reloaded(input_ids=ids).logits, atol=1e-6)


def test_a_checkpoints_released_hash_covers_its_model_files_and_nothing_kept_beside_them(llama: Path,
                                                                                      tmp_path: Path) -> None:
    """The hash is released (statement, base.json): a user's own files in the folder must not enter it, and any
    change to the weights must."""
    folder = tmp_path / "copy"
    shutil.copytree(llama, folder)
    before = content_hash(folder)
    (folder / "train.txt").write_text("Imelda Okafor, ward 4\n", encoding="utf-8")
    (folder / "notes").mkdir()
    (folder / "notes" / "patients.json").write_text("{}", encoding="utf-8")
    assert content_hash(folder) == before
    weights = folder / "model.safetensors"
    flipped = bytearray(weights.read_bytes())
    flipped[-1] ^= 1  # one bit of the last weight
    weights.write_bytes(bytes(flipped))
    assert content_hash(folder) != before


def test_a_run_from_a_model_says_what_that_model_scored_before_fine_tuning(demo_home: Path, llama: Path) -> None:
    """Issue 68, 3: the start's figure on the same test split, beside the run's own, printed and logged."""
    from uedp.services.evaluation import evaluate
    from uedp.storage.home import DataHome

    result = runner.invoke(app, ["train", "demo", "--home", str(demo_home), "--seeded", "--model", str(llama),
                                 "--mechanism", "noiseless", "--steps", "2"])
    assert result.exit_code == 0, result.output
    said = re.search(r"the model it started from, before fine-tuning: test perplexity ([0-9.e+]+) \(this run ", result.stdout)
    assert said is not None, result.stdout
    run = MlflowClient(tracking_uri=f"sqlite:///{demo_home / 'mlflow.db'}").get_run(_run_id(result)).data
    start = run.metrics["perplexity_test_start"]
    assert float(said.group(1)) == pytest.approx(start, rel=1e-3) and start != run.metrics["perplexity_test"]
    # the figure `uedp evaluate` gives the same folder on the same split
    scored = evaluate(DataHome.from_env(demo_home), str(llama), "demo", "test", int(run.params["max_len"]))
    assert scored.perplexity == pytest.approx(start, rel=1e-6)
    # and in bits per byte, the run's own figure and the start's (uedp evaluate also scores each text's first
    # token, after an EOS: close, not equal)
    per_byte = run.metrics["bits_per_byte_test_start"]
    assert per_byte == pytest.approx(scored.bits_per_byte, rel=0.02)
    # both over the same tokens and bytes: their ratio is the ratio of the log perplexities
    assert run.metrics["bits_per_byte_test"] / per_byte == pytest.approx(
        math.log(run.metrics["perplexity_test"]) / math.log(start), rel=1e-6)
    assert run.metrics["bytes_scored_test"] > 0
    # random weights have no start to score: tests/test_learning_signals.py checks starts_from_a_model is False


def test_a_checkpoint_trains_privately_in_bf16_on_the_cpu_when_asked(demo_home: Path, llama: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``--precision bf16``: the CPU's bf16 autocast in training (tests/test_mixed_precision.py checks clipping
    under it); the run logs its precision, and evaluation stays float32."""
    from uedp.models import metrics
    from uedp.privacy.mechanisms import dpsgd

    training: list[bool] = []
    evaluating: list[bool] = []
    real_autocast, real_nll = dpsgd.autocast, metrics.causal_lm_nll

    def autocast(device: torch.device) -> object:
        context = real_autocast(device)
        training.append(isinstance(context, torch.autocast))
        return context

    def causal_lm_nll(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        evaluating.append(torch.is_autocast_enabled("cpu"))
        return real_nll(model, batch)

    monkeypatch.setattr(dpsgd, "autocast", autocast)
    monkeypatch.setattr(metrics, "causal_lm_nll", causal_lm_nll)
    result = runner.invoke(app, ["train", "demo", "--home", str(demo_home), "--seeded", "--model", str(llama),
                                 "--lora-rank", "2", "--mechanism", "dpsgd", "--noise-multiplier", "1.0",
                                 "--steps", "2", "--precision", "bf16"])
    assert result.exit_code == 0, result.output
    assert training and all(training)  # every forward pass of training under bf16 autocast
    assert evaluating and not any(evaluating)  # every figure scored in float32
    run = MlflowClient(tracking_uri=f"sqlite:///{demo_home / 'mlflow.db'}").get_run(_run_id(result)).data
    assert run.params["precision"] == "bf16" and math.isfinite(run.metrics["perplexity_test"])


def test_a_starts_figures_are_scored_once_and_read_back_by_the_next_run_from_it(demo_home: Path, llama: Path) -> None:
    """A start's valid and test figures are remembered in the data home (services/start_scores.py): the next run
    from the same start reads them back instead of scoring the model again (tens of minutes at 135M on a CPU)."""
    # A length no other test of this module uses: the split's token ids, and so the figures' keys, are this test's.
    args = ["train", "demo", "--home", str(demo_home), "--seeded", "--model", str(llama), "--mechanism", "noiseless",
            "--steps", "1", "--max-len", "61"]
    folder = demo_home / "cache" / "start-scores"
    before = set(folder.glob("*.json"))
    first = runner.invoke(app, [*args, "--seed", "3"])
    assert first.exit_code == 0, first.output
    assert "scoring the start on" in first.output
    remembered = sorted(set(folder.glob("*.json")) - before)
    figures = {json.loads(path.read_text(encoding="utf-8"))["split"]: path for path in remembered}
    assert len(remembered) == 2 and set(figures) == {"valid", "test"}
    client = MlflowClient(tracking_uri=f"sqlite:///{demo_home / 'mlflow.db'}")
    logged = client.get_run(_run_id(first)).data.metrics["perplexity_test_start"]
    assert json.loads(figures["test"].read_text(encoding="utf-8"))["value"] == pytest.approx(logged, rel=1e-9)
    # Marked entries show which figure the next run reads: the remembered one, not a new score.
    originals = {split: figures[split].read_text(encoding="utf-8") for split in ("valid", "test")}
    try:
        for split, value in (("valid", 1234.5), ("test", 6789.5)):
            figures[split].write_text(json.dumps({"value": value, "split": split}), encoding="utf-8")
        again = runner.invoke(app, [*args, "--seed", "4"])
        assert again.exit_code == 0, again.output
        assert "scoring the start" not in again.output
        run = client.get_run(_run_id(again))
        assert run.data.metrics["perplexity_test_start"] == 6789.5
        assert [m.value for m in client.get_metric_history(run.info.run_id, "perplexity_valid") if m.step == 0] == [1234.5]
    finally:
        for split, text in originals.items():
            figures[split].write_text(text, encoding="utf-8")
