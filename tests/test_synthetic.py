"""Issue 52: private synthetic text. A corpus sampled from a logged model is a dataset that states the run's
guarantee (manifest, `uedp datasets`, `uedp budget`, a run trained on it), the ledger lists it in no total,
prompts from the run's text are refused, an interrupted generation leaves nothing, and its utility and
leakage are measured (the leakage never logged).

Real parts throughout: the demo corpus ingested and detected, tiny GPT-2s trained by the real CLI into a
real MLflow store, real Parquet tables, the flow in a real Prefect server.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from uedp.commands import app
from uedp.errors import UedpError
from uedp.models.sampling import SamplingSettings, continue_prompts, next_tokens, sample_texts
from uedp.models.tokenization import byte_level_tokenizer
from uedp.services import privacy_budget
from uedp.services.synthetic import GenerateConfig, PromptsOverlap, generate_dataset, writers_and_splits
from uedp.services.synthetic_measures import (
    copies,
    measure_leakage,
    measure_utility,
    measures_file,
    ngrams,
    overlap,
    surfaces_found,
    verbatim_canaries,
    words,
)
from uedp.services.synthetic_source import synthetic_source
from uedp.storage.catalog import ingested_datasets
from uedp.storage.home import DataHome
from uedp.storage.ingest import IngestOptions, ingest
from uedp.storage.tables import read_manifest, read_table

from support import demo_halves, tiny_causal_models, tiny_checkpoint, tiny_gpt2, write

runner = CliRunner()
SMALL = ["--threads", "1", "--checkpoint-every", "0", "--log-model"]


def cli(home: DataHome, *args: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, [*args, "--home", str(home.root)])
    return result


def run_id(result) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code == 0, result.output
    found = re.search(r"MLflow run: ([0-9a-f]{32})", result.output)
    assert found, result.output
    return found.group(1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[DataHome, str, str, Path, Path]:
    """A data home with the private half of the demo corpus (detected), a secure userdp run and a noiseless run
    on it, both with their models logged; and the public and private halves' files."""
    folder = tmp_path_factory.mktemp("synthetic")
    home = DataHome.from_env(folder / "home")
    private, public = demo_halves(folder)
    ingest(home, "private", [private], IngestOptions(format="conll2003", split="users"))
    assert cli(home, "detect", "private", "--detector", "gold").exit_code == 0
    userdp = run_id(cli(home, "train", "private", "--mechanism", "userdp", "--rounds", "2", "--q-user", "0.5", *SMALL))
    noiseless = run_id(cli(home, "train", "private", "--mechanism", "noiseless", "--steps", "3", *SMALL))
    return home, userdp, noiseless, public, private


def test_sampling_draws_from_the_nucleus_and_stops_at_end_of_text() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, -2.0]])
    generator = torch.Generator().manual_seed(0)
    # top_p below the most likely token's probability (0.84): that token only
    assert {int(next_tokens(logits, SamplingSettings(top_p=0.5), generator)) for _ in range(50)} == {1}
    # at temperature 5 the probabilities flatten to 0.39, 0.26, 0.21, 0.14: the nucleus of 0.5 holds two tokens
    assert {int(next_tokens(logits, SamplingSettings(top_p=0.5, temperature=5.0), generator)) for _ in range(200)} == {1, 2}
    assert int(next_tokens(logits, SamplingSettings(temperature=0), generator)) == 1
    drawn = {int(next_tokens(logits, SamplingSettings(top_p=1.0, temperature=3.0), generator)) for _ in range(200)}
    assert drawn == {0, 1, 2, 3}  # no nucleus: every token can come

    class EndsAtOnce(torch.nn.Module):
        """A language model that always predicts token 7 (its end-of-text)."""
        def __init__(self) -> None:
            super().__init__()
            self.bias = torch.nn.Parameter(torch.zeros(10))

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):  # type: ignore[no-untyped-def]
            logits = torch.full((*input_ids.shape, 10), -50.0)
            logits[..., 7] = 50.0
            return type("Out", (), {"logits": logits + self.bias})()

    rows = continue_prompts(EndsAtOnce(), torch.tensor([[1, 2], [3, 4]]), eos_id=7,
                            settings=SamplingSettings(max_new_tokens=20), generator=generator)
    assert rows == [[], []]  # the EOS drawn first ends the text, and is not part of it


def test_the_same_seed_samples_the_same_texts_and_prompts_start_them() -> None:
    tokenizer = byte_level_tokenizer()
    model = tiny_gpt2()
    settings = SamplingSettings(max_new_tokens=6)
    prompts = ["Peter", "", "The bank", "Peter"]
    first = sample_texts(model, tokenizer, prompts, settings, torch.Generator().manual_seed(3), batch_size=2)
    again = sample_texts(model, tokenizer, prompts, settings, torch.Generator().manual_seed(3), batch_size=2)
    other = sample_texts(model, tokenizer, prompts, settings, torch.Generator().manual_seed(4), batch_size=2)
    assert first == again and first != other
    assert first[0].startswith("Peter") and first[2].startswith("The bank")


def test_a_logged_statement_reads_back_and_a_missing_one_is_none() -> None:
    from dataclasses import asdict

    from uedp.privacy.statement import PrivacyStatement
    from uedp.services.logged_run import statement_of

    stated = PrivacyStatement("userdp", "one user", 2.5, 1e-5, "PLD", public=("a",), caveats=("b", "c"))
    assert statement_of(json.loads(json.dumps({"privacy": asdict(stated)}))) == stated  # JSON's lists: tuples again
    assert statement_of({"config": {}}) is None  # an older uedp's run: generation refuses it


def test_writers_and_splits_put_whole_writers_in_one_split() -> None:
    users, splits = writers_and_splits(95, per_writer=10, held_out=0.2, seed=0)
    assert len(set(users)) == 10 and users[0] == users[9] != users[10]
    by_writer = {u: {s for uu, s in zip(users, splits) if uu == u} for u in set(users)}
    assert all(len(s) == 1 for s in by_writer.values())
    assert sorted(next(iter(s)) for s in by_writer.values()).count("train") == 8
    assert {"valid", "test"} <= set(splits)
    assert "test" in writers_and_splits(12, per_writer=10, held_out=0.2, seed=0)[1]  # two writers: one is test
    assert set(writers_and_splits(12, per_writer=10, held_out=0.0, seed=0)[1]) == {"train"}


def test_a_corpus_states_its_runs_guarantee_and_the_ledger_counts_it_in_no_total(trained) -> None:  # type: ignore[no-untyped-def]
    home, userdp, _, _, _ = trained
    before = privacy_budget.unit_totals(privacy_budget.view(home, "private").entries)
    result = cli(home, "generate", userdp, "--count", "23", "--max-new-tokens", "8", "--per-writer", "4",
                 "--output", "synth-userdp")
    assert result.exit_code == 0, result.output
    logged = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(userdp).data
    epsilon = logged.metrics["final_epsilon"]
    assert math.isfinite(epsilon) and f"epsilon {epsilon:.4g}" in result.output
    assert "one user (all of their sentences) of 'private'" in result.output

    # The manifest holds the run and its statement; the tables are like an ingested corpus', with made-up writers
    source = synthetic_source(home, "synth-userdp")
    assert source is not None and source.run_id == userdp and source.dataset == "private"
    assert source.statement.epsilon == pytest.approx(epsilon) and source.statement.unit == logged.params["privacy_unit"]
    assert source.has_guarantee and source.lineage  # the run's texts travel with the corpus
    sentences = read_table(home.table_dir("synth-userdp", "sentences"))
    assert sentences.num_rows == 23 and set(sentences["split"].to_pylist()) <= {"train", "valid", "test"}
    assert all(u.startswith("synthetic-") for u in sentences["user_id"].to_pylist())
    assert read_table(home.table_dir("synth-userdp", "users")).num_rows == 6
    assert read_manifest(home.table_dir("synth-userdp", "entities"))["rows"] == 0
    assert "synth-userdp" in ingested_datasets(home)
    listed = cli(home, "datasets")
    assert "synth-userdp: sentences=23" in listed.output and f"synthetic: epsilon {epsilon:.4g}" in listed.output

    # The source's ledger lists it as post-processing of the run, and no total moved
    entries = privacy_budget.view(home, "private").entries
    made = [e for e in entries if e.key.startswith("generated:synth-userdp")]
    assert len(made) == 1 and made[0].covered_by == f"run:{userdp}" and made[0].epsilon == pytest.approx(epsilon)
    assert privacy_budget.unit_totals(entries) == before
    budget = cli(home, "budget", "private")
    assert "post-processing of" in budget.output and "synthetic corpus(es) sampled from a run's model" in budget.output
    own = cli(home, "budget", "synth-userdp")
    assert "synthetic text" in own.output and "costs nothing more" in own.output
    assert cli(home, "budget", "synth-userdp", "--limit", "3").exit_code == 2

    # The same command again reuses the corpus and files nothing new; other settings under the name are refused
    again = cli(home, "generate", userdp, "--count", "23", "--max-new-tokens", "8", "--per-writer", "4",
                "--output", "synth-userdp")
    assert again.exit_code == 0 and "reused" in again.output
    assert len([e for e in privacy_budget.view(home, "private").entries if e.covered_by]) == len(
        [e for e in entries if e.covered_by])
    other = cli(home, "generate", userdp, "--count", "24", "--output", "synth-userdp")
    assert other.exit_code == 2 and "already holds a corpus generated from run" in other.stderr


def test_a_model_without_a_guarantee_gives_a_corpus_labelled_so(trained) -> None:  # type: ignore[no-untyped-def]
    home, _, noiseless, _, _ = trained
    result = cli(home, "generate", noiseless, "--count", "4", "--max-new-tokens", "4", "--output", "synth-noiseless")
    assert result.exit_code == 0, result.output
    assert "guarantee: no guarantee" in result.output
    assert "synthetic: no guarantee" in cli(home, "datasets").output
    assert "no guarantee" in cli(home, "budget", "synth-noiseless").output
    assert not synthetic_source(home, "synth-noiseless").has_guarantee  # type: ignore[union-attr]


def test_prompts_from_the_runs_text_are_refused(trained, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    home, userdp, _, public, private_file = trained
    refused = "prompts must be public text"

    def generate(prompts: str) -> object:
        return generate_dataset(home, GenerateConfig(run_id=userdp, count=6, max_new_tokens=4, prompts=prompts,
                                                     output=f"synth-{prompts}"))

    with pytest.raises(UedpError, match=refused):
        generate("private")  # the run's own dataset
    ingest(home, "copy", [private_file], IngestOptions(format="conll2003", split="users", split_seed=5))
    with pytest.raises(UedpError, match=refused):
        generate("copy")  # the same text under another name and split
    # A public corpus with one private sentence in it: refused, naming the file and line of that sentence
    blocks = [b.strip("\n") for b in private_file.read_text().split("\n\n") if b.strip()]
    # one sentence of at least four words (shorter lines are in any two corpora): a token per line
    sentence = next(b for b in blocks if not b.startswith("-DOCSTART-") and len(b.splitlines()) >= 6)
    mixed = write(tmp_path / "mixed.conll", "-DOCSTART- -X- -X- O\n\n" + sentence + "\n\n")
    ingest(home, "mixed", [mixed], IngestOptions(format="conll2003", split="users"))
    with pytest.raises(PromptsOverlap, match=refused) as overlap:
        generate("mixed")
    # the file and line are the curator's (a report in the data home), never in the message a flow logs
    assert "mixed.conll:3: this sentence is also in 'private'" in overlap.value.curator_lines()[0]
    assert "mixed.conll" not in str(overlap.value) and overlap.value.report in str(overlap.value)
    assert not home.dataset_dir("synth-mixed").exists() and not home.dataset_dir("synth-copy").exists()

    # The demo corpus' other half repeats some of its templated sentences: refused as a whole, whatever is drawn
    ingest(home, "other-half", [public], IngestOptions(format="conll2003", split="users", split_seed=1))
    with pytest.raises(PromptsOverlap) as overlap:
        generate("other-half")
    assert re.match(r"public\.conll:\d+: this sentence \(and \d+ more\) is also in 'private'",
                    overlap.value.curator_lines()[0])
    # Public text is accepted: every text starts with the first words of one of its sentences, and the
    # statement names the prompts as public
    rows = ["Markets", "opened", "higher", "on", "Tuesday", ".", "", "Rain", "is", "expected", "in", "the", "north", ".",
            ""]
    news = write(tmp_path / "news.conll", "-DOCSTART- -X- -X- O\n\n" + "\n".join(
        f"{w} XX O O" if w else "" for w in rows) + "\n")
    ingest(home, "public", [news], IngestOptions(format="conll2003"))
    made = generate_dataset(home, GenerateConfig(run_id=userdp, count=6, max_new_tokens=4, prompts="public",
                                                 prompt_words=1, output="synth-prompted"))
    starts = {t.split()[0] for t in read_table(home.table_dir("public", "sentences"))["text"].to_pylist() if t.split()}
    texts = read_table(home.table_dir(made.dataset, "sentences"))["text"].to_pylist()
    assert texts and all(any(t.startswith(start) for start in starts) for t in texts)
    source = synthetic_source(home, made.dataset)
    assert source is not None and source.prompts == "public"
    assert any("dataset 'public'" in p for p in source.statement.public)


def test_an_interrupted_generation_keeps_whole_batches_and_the_same_command_finishes_the_same_corpus(
        trained, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C after the second batch: no dataset and no ledger entry, two whole batches kept; the same command
    samples only the other three and writes the corpus an uninterrupted run writes."""
    home, userdp, _, _, _ = trained
    import uedp.services.generation_batches as batches

    real = batches.sample_batches
    sampled: list[int] = []

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        for batch in real(*args, **kwargs):
            sampled.append(len(batch[0]))
            yield batch
            if len(sampled) == 2 and interrupt:
                raise KeyboardInterrupt

    monkeypatch.setattr(batches, "sample_batches", counted)
    entries = len(privacy_budget.view(home, "private").entries)
    config = GenerateConfig(run_id=userdp, count=10, max_new_tokens=4, batch_size=2, output="synth-interrupted")
    interrupt = True
    with pytest.raises(KeyboardInterrupt):
        generate_dataset(home, config)
    assert "synth-interrupted" not in ingested_datasets(home)
    folder = home.dataset_dir("synth-interrupted")
    assert not folder.exists() or not any(p.name in ("sentences", "users", "entities") for p in folder.iterdir())
    assert len(privacy_budget.view(home, "private").entries) == entries
    (kept,) = (home.root / "checkpoints").glob("generate-*")
    assert len(list(kept.glob("batch-*.json"))) == 2
    interrupt = False
    sampled.clear()
    assert generate_dataset(home, config).texts == 10 and sampled == [2, 2, 2]  # only the missing batches
    assert not kept.exists()
    whole = generate_dataset(home, config.model_copy(update={"output": "synth-uninterrupted"}))
    assert whole.texts == 10 and sampled == [2, 2, 2, 2, 2, 2, 2, 2]
    texts = [read_table(home.table_dir(n, "sentences"))["text"].to_pylist()
             for n in ("synth-interrupted", "synth-uninterrupted")]
    assert texts[0] == texts[1]


def test_training_on_a_corpus_states_the_runs_guarantee_and_carries_its_lineage(trained) -> None:  # type: ignore[no-untyped-def]
    home, userdp, _, _, _ = trained
    generate_dataset(home, GenerateConfig(run_id=userdp, count=30, max_new_tokens=6, output="synth-train"))
    refused = cli(home, "train", "synth-train", "--mechanism", "dpsgd", "--steps", "1")
    assert refused.exit_code == 2 and "--mechanism noiseless" in refused.stderr
    result = cli(home, "train", "synth-train", "--mechanism", "noiseless", "--steps", "2", *SMALL)
    on_synthetic = run_id(result)
    stated = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(on_synthetic).data
    source = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(userdp).data
    assert stated.metrics["final_epsilon"] == pytest.approx(source.metrics["final_epsilon"])
    assert stated.params["privacy_unit"] == source.params["privacy_unit"]
    assert f"post-processing of run {userdp}" in stated.params["accountant_used"]
    assert not privacy_budget.ledger_of(home, "synth-train").read().entries  # charged to nobody
    # Text sampled from that model states the same guarantee, for the same people, in the same ledger
    twice = generate_dataset(home, GenerateConfig(run_id=on_synthetic, count=4, max_new_tokens=4, output="synth-twice"))
    assert twice.source_dataset == "private" and twice.statement.epsilon == pytest.approx(source.metrics["final_epsilon"])
    listed = [e for e in privacy_budget.view(home, "private").entries if e.key.startswith("generated:synth-twice")]
    assert len(listed) == 1 and listed[0].covered_by == f"run:{userdp}"
    # A private run on the source text may not start from it: its weights carry that text
    started = cli(home, "train", "private", "--mechanism", "dpsgd", "--steps", "1", "--init-from", on_synthetic)
    assert started.exit_code == 2 and "trained on the text this run protects" in started.stderr.replace("\n", " ")


@pytest.mark.parametrize("model", ["lora-llama", "lstm"])
def test_every_model_kind_generates(trained, model: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A LoRA run of a checkpoint folder of a real architecture (its own BPE tokenizer; the logged adapter
    loads on its base), and the LSTM: both are sampled like GPT-2."""
    home, _, _, _, _ = trained
    flags = (["--model", str(tiny_checkpoint(tmp_path / "tiny-llama")), "--lora-rank", "2"] if model == "lora-llama"
             else ["--model", "lstm"])
    source = run_id(cli(home, "train", "private", "--mechanism", "dpsgd", "--steps", "1", "--noise-multiplier", "1",
                        *flags, *SMALL))
    made = generate_dataset(home, GenerateConfig(run_id=source, count=5, max_new_tokens=5, output=f"synth-{model}"))
    assert made.texts == 5 and synthetic_source(home, made.dataset).statement.unit == "one training sequence"  # type: ignore[union-attr]


def test_leakage_figures_catch_copied_text() -> None:
    train = ["Peter Blackburn visited the bank in Leeds yesterday .", "Shares of Acme rose 3 percent on Monday ."]
    private = ngrams(train, 5)
    assert overlap(train, private, 5) == 1.0  # a corpus that copies the training text
    assert overlap(["Completely different words appear in this sentence here ."], private, 5) == 0.0
    surfaces = {tuple(words("Peter Blackburn")), tuple(words("Leeds")), tuple(words("Acme"))}
    assert surfaces_found(["Peter Blackburn met someone in Leeds ."], surfaces) == 2
    assert surfaces_found(["Peter met Blackburn ."], surfaces) == 0  # whole surfaces only
    assert copies([*train, "Thank you ."], {*train, "Thank you ."}) == 2  # a short line proves nothing
    from uedp.privacy.attacks.canaries import Canary

    planted = [Canary("digits:6", 123456, "123456", "My ID is 123456 .", "u1", 1),
               Canary("digits:6", 654321, "654321", "My ID is 654321 .", "u2", 1)]
    assert verbatim_canaries(planted, ["Then he said: my  ID is 1", "My  ID is 123456, he wrote"]) == 1
    assert verbatim_canaries(planted, ["Sales rose to 654321 dlrs ."]) == 0  # the bare secret is no canary


def test_utility_is_logged_to_the_generating_run_and_leakage_is_not(trained) -> None:  # type: ignore[no-untyped-def]
    home, userdp, _, _, _ = trained
    generate_dataset(home, GenerateConfig(run_id=userdp, count=30, max_new_tokens=6, output="synth-measured"))
    utility = measure_utility(home, "synth-measured", steps=2, batch_size=4, threads=1)
    leakage = measure_leakage(home, "synth-measured", utility_run=utility.run_id)
    client = MlflowClient(tracking_uri=home.mlflow_tracking_uri)
    generating = client.get_run(userdp).data
    assert generating.metrics["synthetic.synth-measured.perplexity_real_test"] == pytest.approx(
        utility.perplexity_real_test)
    assert generating.tags["uedp.synthetic.synth-measured.utility_run"] == utility.run_id
    assert utility.model_perplexity_test == pytest.approx(generating.metrics["perplexity_test"])
    assert math.isfinite(utility.perplexity_real_test) and utility.perplexity_real_test > 1
    # beside the unigram baseline the generating run logged, saying which side of it the corpus' model is
    assert utility.unigram_test == pytest.approx(generating.metrics["perplexity_test_unigram_baseline"])
    side = "worse than" if utility.perplexity_real_test > utility.unigram_test else "better than"
    assert f"a unigram model {utility.unigram_test:.4g} (the corpus' model is {side} token frequencies" in utility.line()
    assert 0 <= leakage.ngram_overlap <= 1 and leakage.ngram_overlap_reference > 0  # held-out text of the corpus
    kept = measures_file(home, "private", "synth-measured")
    assert kept.is_file() and "leakage" in kept.read_text()
    for run in (userdp, utility.run_id):  # no leakage figure in MLflow
        data = client.get_run(run).data
        assert not [k for k in (*data.metrics, *data.params, *data.tags) if "ngram" in k or "surface" in k
                    or "copied" in k or "leak" in k]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT encoder folder with a BPE vocabulary of public made-up text, saved as users save one."""
    from transformers import BertConfig, BertModel

    from uedp.models.tokenization import load_tokenizer, save_bpe_tokenizer, train_bpe_tokenizer

    folder = tmp_path_factory.mktemp("encoder")
    texts = [f"The {w} market rose {i} points in {p} ." for i, w in enumerate(["cocoa", "sugar", "oil"] * 30)
             for p in ("London", "Tokyo")]
    save_bpe_tokenizer(train_bpe_tokenizer(texts, 300), folder, {"dataset": "made-up public text", "public": True})
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(load_tokenizer(folder)), hidden_size=32, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=64, max_position_embeddings=160)).save_pretrained(folder)
    return folder


def test_sentence_embeddings_are_unit_length_and_the_same_alone_or_padded(encoder: Path) -> None:
    from uedp.models.embeddings import embed_texts

    texts = ["The oil market rose", "Sugar fell in London on Monday after a long week of trading", "Tokyo"]
    together = embed_texts(encoder, texts, batch_size=3)
    alone = np.stack([embed_texts(encoder, [t])[0] for t in texts])
    assert together.shape == (3, 32) and np.allclose(np.linalg.norm(together, axis=1), 1, atol=1e-5)
    assert np.allclose(together, alone, atol=1e-5)  # padding never enters a text's mean
    assert not np.allclose(together[0], together[1])


def test_the_frechet_distance_is_small_within_a_distribution_and_grows_with_a_shift() -> None:
    from uedp.models.embeddings import frechet_distance

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(800, 6)), rng.normal(size=(800, 6))
    shifted, wider = rng.normal(loc=0.5, size=(800, 6)), rng.normal(scale=2.0, size=(800, 6))
    same = frechet_distance(a, b)
    assert 0 <= same < 0.1 and frechet_distance(a, a) == pytest.approx(0, abs=1e-6)
    assert frechet_distance(a, shifted) == pytest.approx(6 * 0.25, rel=0.2)  # |mu_a - mu_b|^2
    assert frechet_distance(a, wider) == pytest.approx(6 * (1 - 2) ** 2, rel=0.2)  # tr(C + 4C - 2 * 2C) = 6
    with pytest.raises(ValueError, match="at least 2 embeddings"):
        frechet_distance(a[:1], b)


@pytest.mark.usefixtures("prefect_server")
def test_the_generate_flow_runs_in_prefect(trained, encoder: Path) -> None:  # type: ignore[no-untyped-def]
    from uedp.flows.generate import NO_ENCODER, generate_flow
    from uedp.models.embeddings import installed_encoder

    home, userdp, _, _, _ = trained
    config = GenerateConfig(run_id=userdp, count=30, max_new_tokens=4, output="synth-flow")
    outcome = generate_flow(config, home=str(home.root), measure=True, utility_steps=1, encoder=str(encoder))
    # fidelity: the corpus against the real test split, beside two real splits; logged like utility
    fidelity = outcome.fidelity
    assert fidelity is not None and fidelity.texts >= 2 and fidelity.frechet_real_test > 0
    assert math.isfinite(fidelity.frechet_real_valid) and "the floor at this size" in fidelity.line()
    logged = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(userdp).data.metrics
    assert logged["synthetic.synth-flow.frechet_real_test"] == pytest.approx(fidelity.frechet_real_test)
    if installed_encoder() is None:  # without the package or --encoder the figure is not measured, and it says so
        again = generate_flow(config, home=str(home.root), measure=True, utility_steps=1)
        assert again.fidelity is None and again.fidelity_skipped == NO_ENCODER
    assert outcome.corpus.dataset == "synth-flow" and outcome.corpus.texts == 30
    assert synthetic_source(home, "synth-flow") is not None
    # utility is a result (logged to the generating run); leakage is only a file in the data home
    assert outcome.utility is not None and math.isfinite(outcome.utility.perplexity_real_test)
    assert Path(outcome.leakage_file) == measures_file(home, "private", "synth-flow")
    assert "ngram" not in repr(outcome) and "leakage" in Path(outcome.leakage_file).read_text()


@pytest.mark.usefixtures("prefect_server")
def test_a_refused_prompts_dataset_puts_nothing_private_in_prefect_and_tells_the_curator_where(trained) -> None:  # type: ignore[no-untyped-def]
    """Issue 62: `uedp generate --prompts` with a dataset sharing sentences with the run's text is refused by
    the real flow in a real Prefect server. Prefect's flow and task logs and states say only that the prompts
    overlap the private text (no sentence, no count, no file:line); the curator's terminal and a report in
    `<home>/reports` name the file and line."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        LogFilter,
        LogFilterFlowRunId,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
    )
    from prefect.logging.handlers import APILogWorker

    home, userdp, _, public, _ = trained
    ingest(home, "overlapping", [public], IngestOptions(format="conll2003", split="users", split_seed=1))
    table = read_table(home.table_dir("overlapping", "sentences"))
    private = {t.strip() for t in read_table(home.table_dir("private", "sentences"))["text"].to_pylist()
               if t and len(t.split()) >= 4}
    shared = [(f, n, t) for f, n, t in zip(table["source_file"].to_pylist(), table["source_line"].to_pylist(),
                                           table["text"].to_pylist()) if t and t.strip() in private]
    assert len(shared) >= 2  # the demo's halves repeat templated sentences

    result = cli(home, "generate", userdp, "--prompts", "overlapping", "--count", "4", "--max-new-tokens", "2",
                 "--output", "synth-overlapping")
    assert result.exit_code == 2, result.output  # still refused
    assert "prompts must be public text" in result.stderr
    assert not home.dataset_dir("synth-overlapping").exists()
    # The curator's terminal: the first shared sentence's file and line, how many more, and where all are listed
    first_file, first_line, _ = shared[0]
    assert (f"{first_file}:{first_line}: this sentence (and {len(shared) - 1} more) is also in 'private'"
            in result.stderr), result.stderr
    reports = [p for p in (home.root / "reports").rglob("*") if p.is_file() and "overlapping" in p.name]
    assert len(reports) == 1, reports
    assert str(reports[0]) in result.stderr
    listed = reports[0].read_text(encoding="utf-8")
    assert all(f"{f}:{n}" in listed for f, n, _ in shared)

    # What Prefect holds: the flow run's and its task runs' logs and final states
    APILogWorker.drain_all(timeout=10)  # the logs the flow run sent reach the server
    with get_client(sync_client=True) as client:
        runs = [r for r in client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["uedp-generate"])))
                if r.state is not None and r.state.is_failed()]
        assert runs, "the refused generate flow run is not in Prefect"
        run = max(runs, key=lambda r: r.created)  # type: ignore[arg-type,return-value]
        tasks = client.read_task_runs(task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[run.id])))
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
    assert any("prompts must be public text" in log.message for log in logs), logs  # the refusal is logged, public
    said = "\n".join([log.message for log in logs] + [r.state.message or "" for r in (run, *tasks) if r.state])
    assert ".conll" not in said and not re.search(r":\d+:", said), said  # no file, no line
    assert not re.search(r"and \d+ more|\d+ (shared )?sentences", said), said  # no count
    assert not [t for _, _, t in shared if t.strip() in said], said  # no text


def _uncached(model: torch.nn.Module, prompt: list[int], eos: int, steps: int) -> list[int]:
    """Greedy tokens by reading the whole prefix at every step, one prompt alone: the reference."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(steps):
            token = int(model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1].argmax())
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
            if token == eos:
                break
    new = ids[0, len(prompt):].tolist()
    return new[: new.index(eos)] if eos in new else new


@pytest.mark.parametrize("kind", ["gpt2", "llama", "llama+lora", "lstm"])
def test_cached_batched_generation_continues_each_prompt_as_the_whole_prefix_does_alone(kind: str) -> None:
    """The key/value cache and left padding change no token: greedy continuations of prompts of different
    lengths in one batch equal each prompt's continuation read whole, alone, at every step."""
    from uedp.models.sampling import keeps_a_cache

    model = tiny_causal_models()[kind].eval()
    tokenizer = byte_level_tokenizer()
    eos = int(tokenizer.eos_token_id)
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("Peter Okafor of", "The", "A bank in Leeds said")]
    settings = SamplingSettings(max_new_tokens=12, temperature=0)
    expected = [_uncached(model, p, eos, 12) for p in prompts]
    assert keeps_a_cache(model) == (kind != "lstm")
    if kind == "lstm":  # no cache: one length per batch
        with pytest.raises(ValueError, match="one length per batch"):
            continue_prompts(model, prompts, eos, settings, torch.Generator())
        got = [continue_prompts(model, [p], eos, settings, torch.Generator())[0] for p in prompts]
    else:
        got = continue_prompts(model, prompts, eos, settings, torch.Generator())
    assert got == expected and any(len(row) > 3 for row in got)
    texts = sample_texts(model, tokenizer, ["Peter Okafor of", "The", "A bank in Leeds said"], settings,
                         torch.Generator(), batch_size=3)
    assert texts == [tokenizer.decode(p + e, skip_special_tokens=True).strip() for p, e in zip(prompts, expected)]


def test_a_resumed_generation_skips_the_batches_it_kept_and_draws_the_same_rest() -> None:
    from uedp.models.sampling import sample_batches

    model, tokenizer = tiny_gpt2(), byte_level_tokenizer()
    prompts = ["Peter", "", "The bank", "Peter", "A", "In Leeds"]
    settings = SamplingSettings(max_new_tokens=5)
    generator = torch.Generator().manual_seed(3)
    whole = list(sample_batches(model, tokenizer, prompts, settings, generator, batch_size=2))
    generator = torch.Generator().manual_seed(3)
    first = next(iter(sample_batches(model, tokenizer, prompts, settings, generator, batch_size=2)))
    state = generator.get_state()  # what a crash after the first batch leaves beside the kept batch
    resumed = torch.Generator()
    resumed.set_state(state)
    rest = list(sample_batches(model, tokenizer, prompts, settings, resumed, batch_size=2, skip=1))
    assert [first, *rest] == whole and len(whole) == 3


def test_an_encoder_that_is_not_a_model_folder_is_one_error_before_anything_runs(trained, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    home, userdp, _, _, _ = trained
    result = cli(home, "generate", userdp, "--measure", "--encoder", str(tmp_path / "nothing"), "--output", "synth-no")
    assert result.exit_code != 0 and "--encoder" in result.stderr and "no config.json" in result.stderr
    assert "synth-no" not in ingested_datasets(home)


def test_uedp_evaluate_scores_a_runs_model_as_the_run_scored_its_test_split_and_charges_nothing(  # type: ignore[no-untyped-def]
        trained, tmp_path: Path) -> None:
    """Issue 68, 3: a model's figure on a dataset's held-out split without training it: a run's logged model
    scores what the run logged as perplexity_test; a checkpoint folder scores too; the train split and a
    base this home never installed are one error each; the ledger is untouched."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from uedp.models.tokenization import byte_level_tokenizer

    home, _, noiseless, _, _ = trained
    entries = len(privacy_budget.view(home, "private").entries)
    logged = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(noiseless).data
    max_len = logged.params["max_len"]
    scored = cli(home, "evaluate", noiseless, "private", "--max-len", max_len, "--threads", "1")
    assert scored.exit_code == 0, scored.output
    figure = float(re.search(r"perplexity ([0-9.e+]+) per token", scored.stdout).group(1))  # type: ignore[union-attr]
    assert figure == pytest.approx(logged.metrics["perplexity_test"], rel=1e-3)  # printed to 4 digits
    assert "bits per byte" in scored.stdout and "charged to no budget" in scored.stdout
    folder = tmp_path / "llama"
    tokenizer = byte_level_tokenizer()
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    from_folder = cli(home, "evaluate", str(folder), "private", "--split", "valid", "--limit", "5")
    assert from_folder.exit_code == 0 and f"folder {folder} on 'private' valid (5 texts)" in from_folder.stdout, \
        from_folder.output
    train = cli(home, "evaluate", noiseless, "private", "--split", "train")
    assert train.exit_code == 2 and "error: --split train: only held-out text is scored" in train.stderr
    missing = cli(home, "evaluate", "smollm2", "private")
    assert missing.exit_code == 2 and "run `uedp base smollm2` first" in missing.stderr
    assert len(privacy_budget.view(home, "private").entries) == entries


def test_a_default_corpus_name_is_not_doubled_in_its_measures_file(tmp_path: Path) -> None:
    """Issue 68, 10: the default corpus `synthetic-<run>` had its figures in `synthetic-synthetic-<run>.json`."""
    home = DataHome.from_env(tmp_path / "home")
    assert measures_file(home, "private", "synthetic-41ead257aea1").name == "synthetic-41ead257aea1.json"
    assert measures_file(home, "private", "synth-flow").name == "synthetic-synth-flow.json"


def test_mlflow_lists_a_runs_model_and_tables_in_its_own_views(trained, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """MLflow's run page lists "Logged models" and "Datasets" from logged-model outputs and dataset inputs (not
    from artifacts): this module's runs, trained through the CLI, show their model there, with the privacy
    statement as its tags, registrable in the model registry, and their Parquet tables, with nothing that
    counts private text (design rule 4) and the keyed id the run's tags already carry as the digest."""
    from types import SimpleNamespace
    from urllib.parse import urlparse

    from uedp.services.config import TrainConfig
    from uedp.services.lineage import DATASET_ID_TAG, ENTITIES_ID_TAG
    from uedp.services.mlflow_views import WEIGHTS_TAG, model_name
    from uedp.services.tracking import tracking_uri
    from uedp.services.training_record import run_tables
    from uedp.storage.tables import table_columns

    home, userdp, noiseless, _, _ = trained
    client = MlflowClient(tracking_uri=tracking_uri(home))
    run = client.get_run(userdp)
    [used] = run.inputs.dataset_inputs
    assert used.dataset.name == "private/sentences" and [(t.key, t.value) for t in used.tags] == [
        ("mlflow.data.context", "training")]
    assert used.dataset.digest == run.data.tags[DATASET_ID_TAG] and used.dataset.source_type == "local"
    assert Path(urlparse(json.loads(used.dataset.source)["uri"]).path) == home.table_dir("private", "sentences")
    columns = [c["name"] for c in json.loads(used.dataset.schema)["mlflow_colspec"]]
    assert columns == [name for name, _ in table_columns(home.table_dir("private", "sentences"))] and "text" in columns
    assert not re.search(r"\d", used.dataset.profile.replace("rule 4", "")), used.dataset.profile  # no count
    # the model: an output of the run, its statement in its tags, its weights the run's `model` folder
    [output] = run.outputs.model_outputs
    model = client.get_logged_model(output.model_id)
    params = run.data.params
    assert model.source_run_id == userdp and model.name == model_name(run.info.run_name) and output.step == int(params["rounds_run"])
    assert run.info.run_name.startswith("userdp-rounds2-")  # not the default 30 rounds: the name says so
    assert model.tags[WEIGHTS_TAG] == f"runs:/{userdp}/model" and "config.json" in {
        Path(a.path).name for a in client.list_artifacts(userdp, "model")}
    assert model.tags["uedp.epsilon"] == params["epsilon_reported"] and math.isfinite(float(model.tags["uedp.epsilon"]))
    assert model.tags["uedp.privacy_unit"] == params["privacy_unit"] and model.tags["uedp.randomness"] == "secure"
    assert model.tags["uedp.privacy_caveats"] == params["privacy_caveats"]
    # the registry looks a models:/ source up in the default store (as an MLflow server's is): this home's
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri(home))
    client.create_registered_model("private-userdp")
    version = client.create_model_version("private-userdp", f"models:/{model.model_id}", run_id=userdp,
                                          model_id=model.model_id)
    assert client.get_model_version("private-userdp", version.version).run_id == userdp
    assert model_name("dpsgd-eps0.5-s0") == "dpsgd-eps0_5-s0"  # MLflow refuses '.' (and / : % ' ") in model names
    [plain] = client.get_run(noiseless).outputs.model_outputs
    assert client.get_logged_model(plain.model_id).tags["uedp.epsilon"] == "inf"
    # a tracking server that cannot hold these views (an MLflow 2 server: no logged models) costs the views only
    from mlflow.exceptions import MlflowException

    from uedp.privacy.statement import PrivacyStatement
    from uedp.services.mlflow_views import log_model_entry, log_table_inputs
    from uedp.services.tracking import RunTracker

    def unsupported(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise MlflowException("the server has no logged-models API")

    monkeypatch.setattr(MlflowClient, "create_logged_model", unsupported)
    monkeypatch.setattr(MlflowClient, "log_inputs", unsupported)
    tracker = RunTracker.attach(home, noiseless)
    assert log_model_entry(tracker, "plain", PrivacyStatement("noiseless", "none"), {}, 3) is None
    log_table_inputs(tracker, run_tables(home, TrainConfig(dataset="private", mechanism="noiseless"),
                                         SimpleNamespace(release=None)))  # type: ignore[arg-type]
    warned = capsys.readouterr().err
    assert "did not record the run's logged model (MlflowException: the server has no logged-models API)" in warned
    assert "did not record the run's dataset inputs" in warned
    # a mechanism that protects entities reads the entities table too, under its own keyed id
    uedp = run_tables(home, TrainConfig(dataset="private", mechanism="uedp"), SimpleNamespace(release=None))  # type: ignore[arg-type]
    assert [(t.dataset, t.table, t.context) for t in uedp] == [("private", "sentences", "training"),
                                                               ("private", "entities", "training")]
    assert uedp[1].keyed_id == run.data.tags[ENTITIES_ID_TAG]
