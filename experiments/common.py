"""What every reproduction shares: the CoNLL-2003 inputs (whole, or the first documents of each file for
the ``ci`` scale), runs of the real flows, per-run figures read back from MLflow, the claims a page
checks, and the page itself (written whole, or not at all); for the ``python experiments/<page>.py`` scripts,
their common command line, the finished runs of a data home and ``command.txt``.

A reproduction runs what a user runs (``ingest_flow``, ``detect_flow``, ``sweep_flow``) in a data
home, so every run it reports is an MLflow run a reader can open; the page adds the seeds' own
figures beside ours and says, claim by claim, what holds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from uedp.errors import UedpError
from uedp.storage.home import DataHome

Scale = Literal["ci", "cpu", "gpu"]
SCALES: tuple[Scale, ...] = ("ci", "cpu", "gpu")
CONLL_FILES = {"eng.train": "train", "eng.testa": "valid", "eng.testb": "test"}
GOLD_CATEGORIES = ["PERSON", "LOC", "ORG", "MISC"]
UNIFORM_BYTE_PERPLEXITY = 257.0  # byte tokens: a uniform guess over 256 bytes and the end mark


@dataclass(frozen=True)
class Corpus:
    """A public corpus an experiment reads from a folder the user names: never downloaded at run time,
    never redistributed with uedp."""

    key: str  # conll, wikitext, simdial, sst2, ag
    option: str  # the CLI option naming its folder
    env: str  # the environment variable that may name it instead
    files: str  # what the folder holds, as an error says it
    where: str  # where to get it


CORPORA = {
    "conll": Corpus("conll", "--conll-dir", "UEDP_CONLL_DIR", "eng.train, eng.testa and eng.testb",
                    "CoNLL-2003 (https://www.clips.uantwerpen.be/conll2003/ner/; the Reuters text needs its licence)"),
    "wikitext": Corpus("wikitext", "--wikitext-dir", "UEDP_WIKITEXT_DIR",
                       "valid.txt and test.txt (and train.txt where you have it), or wiki.valid.tokens and "
                       "wiki.test.tokens (and wiki.train.tokens)", "WikiText-2 (https://github.com/pytorch/examples/tree/main/"
                       "word_language_model/data/wikitext-2, or the wikitext-2-v1 archive of Merity et al. 2017)"),
    "simdial": Corpus("simdial", "--simdial-dir", "UEDP_SIMDIAL_DIR",
                      "train/, valid/ and test/ folders of dialogs, one dial-N.txt per dialog",
                      "CustomerSim (https://github.com/wyshi/lm_privacy, data/simdial: the Selective-DP paper's "
                      "10,000 training dialogs with its 10 canaries; or generate it with SimDial's "
                      "multiple_domains.py --domain track_package)"),
    "sst2": Corpus("sst2", "--sst2-dir", "UEDP_SST2_DIR", "train.tsv and dev.tsv (GLUE's SST-2: a header, then "
                   "sentence and label columns in either order)",
                   "SST-2 (GLUE, https://gluebenchmark.com/tasks, or the Hugging Face dataset stanfordnlp/sst2 "
                   "saved as TSV)"),
    "ag": Corpus("ag", "--ag-dir", "UEDP_AG_DIR", "train.csv and test.csv (class,title,description), or "
                 "train.jsonl and test.jsonl ({text, label})",
                 "AG News (Zhang et al. 2015, ag_news_csv.tar.gz, or the Hugging Face dataset fancyzhx/ag_news)"),
}


def corpus_folder(ctx: Context, key: str, required: Iterable[str]) -> Path:
    """The experiment's corpus folder, checked to hold ``required`` (each a file or folder name; a name
    with ``|`` is any one of its alternatives): a missing one is one error naming the option and where
    to get the corpus."""
    corpus = CORPORA[key]
    missing = [name for name in required
               if not any((ctx.data_dir / alternative).exists() for alternative in name.split("|"))]
    if missing:
        raise UedpError(f"{ctx.data_dir}: no {', '.join(m.replace('|', ' or ') for m in missing)}; give "
                        f"{corpus.option} (or {corpus.env}), the folder holding {corpus.files}. Get it from "
                        f"{corpus.where}; uedp never downloads it.")
    return ctx.data_dir


@dataclass
class Context:
    """One reproduction's inputs and where its work goes. ``data_dir`` is the folder of the experiment's
    corpus (``Experiment.corpus``): CoNLL-2003's, WikiText-2's, CustomerSim's ... ``conll_dir`` is
    CoNLL-2003's folder where an experiment reads it: its own corpus, or public text it learns from
    besides (uedp-agnews trains its NER on CoNLL's gold tags); None where it was not given."""

    name: str
    scale: Scale
    home: DataHome
    data_dir: Path
    device: str = "auto"
    threads: int = 1
    say: Callable[[str], None] = print
    conll_dir: Path | None = None
    start: str = "scratch"  # starts.py: scratch, base or a checkpoint folder (pages that take a start)
    public_dir: Path | None = None  # the public base's corpus (Reuters-21578); None: $UEDP_REUTERS_DIR or ../shared


@dataclass(frozen=True)
class RunRow:
    """One trained model's figures as a page shows them."""

    label: str  # the mechanism as reports show it (uedp-bounded-k1)
    family: str  # the model (gpt2 tiny, lstm tiny)
    target: float | None  # the target epsilon it was calibrated to; None: no budget
    epsilon: float  # accounted (inf: no guarantee)
    perplexity: float  # test
    seconds: float  # wall time of the run (MLflow's start and end)
    run_id: str
    extra: dict[str, float] = field(default_factory=dict)  # exposure, kept-token share, data used ...
    # What the pages' shared ``rows`` carry besides (:func:`shared_rows`); empty on pages made before them
    mechanism: str = ""
    variant: str = ""  # what tells the run apart beyond its mechanism: uedp-bounded's k, grid values, lora8
    seed: int | None = None
    start: str = "scratch"  # starts.py: scratch, base, a packaged base (smollm2) or a checkpoint folder's name


@dataclass
class Results:
    """Everything a page reports: the runs, and any other figures (curves, shares) by name."""

    runs: list[RunRow] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def select(self, label: str, target: float | None = None, family: str | None = None) -> list[RunRow]:
        return [r for r in self.runs if r.label == label and (target is None or r.target == target)
                and (family is None or r.family == family)]

    def perplexity(self, label: str, target: float | None = None, family: str | None = None) -> float:
        """Mean test perplexity over seeds (a missing configuration is an error naming it)."""
        rows = self.select(label, target, family)
        if not rows:
            raise UedpError(f"no finished run of {label}" + (f" at epsilon {target:g}" if target else "")
                            + (f" ({family})" if family else ""))
        return statistics.fmean(r.perplexity for r in rows)

    def extra(self, label: str, key: str, target: float | None = None, family: str | None = None) -> float:
        rows = [r for r in self.select(label, target, family) if key in r.extra]
        if not rows:
            raise UedpError(f"no {key} for {label}" + (f" at epsilon {target:g}" if target else ""))
        return statistics.fmean(r.extra[key] for r in rows)

    def targets(self) -> list[float]:
        return sorted({r.target for r in self.runs if r.target is not None})


@dataclass(frozen=True)
class Claim:
    """One point a page makes, checked on its own figures.

    ``statement`` is what we claim; ``seeds`` what the seed paper says on the point; a claim that holds
    ``reproduces`` or ``contradicts`` the seed. ``scales`` are those where the figures are meant to
    show it (the ``ci`` scale is too small for some): the ``ci`` test asserts every claim of its scale.
    """

    statement: str
    seeds: str
    when_holds: Literal["reproduces", "contradicts", "extends"]
    check: Callable[[Results], tuple[bool, str]]  # holds, and our figures in words
    scales: tuple[Scale, ...] = SCALES


@dataclass(frozen=True)
class Verdict:
    statement: str
    seeds: str
    ours: str
    holds: bool
    verdict: str


def judge(claims: Iterable[Claim], results: Results, scale: Scale) -> list[Verdict]:
    out = []
    for claim in claims:
        if scale not in claim.scales:
            continue
        try:
            holds, ours = claim.check(results)
        except UedpError as exc:  # a configuration that did not finish: the claim cannot be judged
            holds, ours = False, f"not measured ({exc})"
        out.append(Verdict(claim.statement, claim.seeds, ours, holds,
                           claim.when_holds if holds else "does not hold at this scale"))
    return out


# --- canary exposure ----------------------------------------------------------------------------------

# A canary ranked at random has exposure 1/ln 2 = 1.44 bits on average, and above x bits with probability
# 2^-x: a few canaries' mean below 4 bits is what an attack that found nothing gives. Claims that compare
# exposures are judged only when the noiseless model's canaries stand above that, and by a margin.
MEASURABLE_EXPOSURE = 4.0
EXPOSURE_MARGIN = 1.0


def exposure_unmeasurable(noiseless: float) -> str | None:
    """Why exposures cannot be compared at this scale (the noiseless model's canaries are not found by the
    attack), or None when they can."""
    if noiseless >= MEASURABLE_EXPOSURE:
        return None
    return (f"not measurable at this scale: the noiseless model's canaries have exposure {noiseless:.2f}, below "
            f"{MEASURABLE_EXPOSURE:g} bits (a random rank gives 1.44 on average): the attack finds nothing to compare")


def clearly_above(higher: float, lower: float) -> bool:
    """``higher`` exceeds ``lower`` by more than the margin one canary's rank moves by chance."""
    return higher > lower + EXPOSURE_MARGIN


# --- inputs -------------------------------------------------------------------------------------------


def conll_documents(path: Path) -> list[list[str]]:
    """A CoNLL-2003 file's documents, each its lines from ``-DOCSTART-`` up to the next one."""
    documents: list[list[str]] = []
    with open(path, encoding="utf-8-sig") as handle:
        for line in handle:
            if line.startswith("-DOCSTART-") or not documents:
                documents.append([])
            documents[-1].append(line)
    return [d for d in documents if any(line.strip() and not line.startswith("-DOCSTART-") for line in d)]


def write_if_changed(target: Path, text: str) -> Path:
    """Write a page's copy of its inputs (the first documents of a file, a normalised copy) unless it
    already holds ``text``: an unchanged copy keeps its tables' cache key and its ingest is reused; a
    changed one is swapped in whole (a temporary file, then a rename)."""
    if not target.is_file() or target.read_text(encoding="utf-8") != text:
        partial = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        partial.write_text(text, encoding="utf-8")
        partial.replace(target)
    return target


def blank_pipeline(ctx: Context) -> Path:
    """A blank English spaCy pipeline saved once under the data home, for pages whose policy is Presidio
    recognizers: Presidio needs a pipeline to tokenize, the regexes need no NER model, and nothing is
    downloaded. Saved whole (its files are part of the detection's cache key)."""
    folder = ctx.home.reproduce_dir / "inputs" / "spacy-blank-en"
    if not (folder / "meta.json").is_file():
        import spacy

        partial = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        spacy.blank("en").to_disk(partial)
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    return folder


def conll_inputs(ctx: Context, first: dict[str, int] | None) -> tuple[list[Path], str]:
    """The CoNLL-2003 files to ingest and the dataset name: the files themselves, or (``first``: documents
    per split) a copy of each file's first documents under the data home, which this command writes."""
    if ctx.conll_dir is None:
        raise UedpError(f"{ctx.name} reads CoNLL-2003: give --conll-dir, the folder holding eng.train, eng.testa and "
                        f"eng.testb (get them from {CORPORA['conll'].where})")
    paths = {name: ctx.conll_dir / name for name in CONLL_FILES}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise UedpError(f"CoNLL-2003 file(s) not found: {', '.join(missing)}; give --conll-dir, the folder holding "
                        f"eng.train, eng.testa and eng.testb (they are not redistributed with uedp; get them from "
                        f"{CORPORA['conll'].where})")
    if not first:
        return list(paths.values()), "conll2003"
    tag = "-".join(str(first[split]) for split in CONLL_FILES.values())
    folder = ctx.home.reproduce_dir / "inputs" / f"conll2003-first-{tag}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, path in paths.items():
        documents = conll_documents(path)[: first[CONLL_FILES[name]]]
        text = "".join(line for document in documents for line in document)
        write_if_changed(folder / name, text)
    return [folder / name for name in CONLL_FILES], f"conll2003-first-{tag}"


def train_documents(paths: list[Path]) -> int:
    """Documents (users) in the train file: the input's own count, as the papers give |U|."""
    return len(conll_documents(next(p for p in paths if p.name == "eng.train")))


def ingest_conll_gold(ctx: Context, first: dict[str, int] | None) -> tuple[str, int]:
    """Ingest CoNLL-2003 (one user per document) and take its gold entities; reused when unchanged."""
    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.detect import detect_flow
    from uedp.flows.ingest import IngestConfig, ingest_flow

    paths, dataset = conll_inputs(ctx, first)
    ctx.say(f"ingest {dataset} from {paths[0].parent}")
    ingest_flow(IngestConfig(home=str(ctx.home.root), dataset=dataset, format="conll2003",
                             files=[str(p) for p in paths]))
    detect_flow(dataset, DetectorConfig(detectors=["gold"]), home=str(ctx.home.root))
    return dataset, train_documents(paths)


# --- runs ---------------------------------------------------------------------------------------------


def run_sweep(ctx: Context, config: Any, family: str, start: str = "scratch") -> list[RunRow]:
    """One ``sweep_flow``; every configuration must finish (a reproduction with a hole is not a result).
    A configuration this data home already trained to the end is reused, not trained again
    (``reuse_finished``): a page stopped halfway continues where it stopped. ``start``: what the runs
    start from, as the shared rows name it."""
    from uedp.flows.sweep import sweep_flow
    from uedp.services.sweep import SweepFailed

    config = config.model_copy(update={"reuse_finished": True})
    try:
        outcome = sweep_flow(config, progress=True)
    except SweepFailed as exc:
        raise UedpError(f"{ctx.name}: {exc}") from None
    names = run_names_and_seconds(ctx.home, [r.run_id for r in outcome.runs])
    items = config.plan()
    planned = {item.config.run_name(): item for item in items}
    # A reused run may carry the shorter name an older uedp gave it: taken only where one configuration has it.
    short = Counter(item.config.run_name(with_length=False) for item in items)
    planned |= {name: item for item in items if short[name := item.config.run_name(with_length=False)] == 1
                and name not in planned}
    rows = []
    for result in outcome.runs:
        name, seconds = names.get(result.run_id, ("", math.nan))
        extra = {k: float(v) for k, v in result.privacy_extra.items() if isinstance(v, (int, float))}
        item = planned.get(name)
        rows.append(RunRow(result.shown_as, family, item.target if item else None, result.epsilon, result.utility_test,
                           seconds, result.run_id, extra, result.mechanism,
                           _variant(item.config) if item else "", item.config.seed if item else None, start))
    return rows


def _variant(config: Any) -> str:
    """What tells a run apart beyond its mechanism, as the shared rows say it: the rest of its label
    (uedp-bounded's ``k4``, a grid's values) and LoRA's rank."""
    rest = config.label[len(config.mechanism):].strip("-")
    return "-".join(part for part in (rest, f"lora{config.lora_rank}" if config.lora_rank else "") if part)


SHARED_ROW_KEYS = ("corpus", "mechanism", "variant", "start", "target_epsilon", "seed", "perplexity_test")


def shared_rows(runs: Iterable[RunRow], corpus: str) -> list[dict[str, Any]]:
    """Every page's runs in the keys the user-level page's ``rows`` carry (``SHARED_ROW_KEYS``, then the
    accounted epsilon, the run and its minutes), so one reader compares pages; rows of a page made before
    the keys existed have no mechanism and are left out."""
    return [{"corpus": corpus, "mechanism": r.mechanism, "variant": r.variant, "start": r.start,
             "target_epsilon": r.target, "seed": r.seed, "perplexity_test": r.perplexity, "epsilon": r.epsilon,
             "family": r.family, "run_id": r.run_id, "minutes": r.seconds / 60} for r in runs if r.mechanism]


def run_names_and_seconds(home: DataHome, run_ids: list[str]) -> dict[str, tuple[str, float]]:
    """Each run's name and wall time (MLflow's start and end times)."""
    from mlflow.tracking import MlflowClient

    from uedp.services.tracking import tracking_uri

    client = MlflowClient(tracking_uri=tracking_uri(home))
    out = {}
    for run_id in run_ids:
        info = client.get_run(run_id).info
        seconds = (info.end_time - info.start_time) / 1000 if info.end_time and info.start_time else math.nan
        out[run_id] = (info.run_name or "", seconds)
    return out


def mlflow_client(home: Path) -> Any:
    """An MLflow client on the tracking store of a page's data home, where the runs of its commands went
    (services.tracking decides where that is: the home's own store, or ``MLFLOW_TRACKING_URI``)."""
    from mlflow.tracking import MlflowClient

    from uedp.services.tracking import tracking_uri

    return MlflowClient(tracking_uri=tracking_uri(DataHome.from_env(home)))


def finished_runs(home: Path, dataset: str) -> list[Any]:
    """The finished MLflow runs of ``dataset`` in a page's data home, latest first (none before its first run)."""
    client = mlflow_client(home)
    experiment = client.get_experiment_by_name(dataset)
    if experiment is None:
        return []
    return [run for run in client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"])
            if run.info.status == "FINISHED"]


# --- the page -----------------------------------------------------------------------------------------


class OneBudget(Protocol):
    """A page's settings with one target epsilon, or (ci) one noise multiplier instead."""

    @property
    def epsilon(self) -> float: ...
    @property
    def noise_multiplier(self) -> float | None: ...


class TargetBudgets(Protocol):
    """A page's settings with target epsilons, or (ci: none) one noise multiplier instead."""

    @property
    def epsilons(self) -> tuple[float, ...]: ...
    @property
    def noise_multiplier(self) -> float | None: ...


def budget_at(s: OneBudget) -> str:
    """The budget of a one-epsilon page's private runs, as a claim or figure says "at ...": its epsilon, or
    the noise multiplier that stands in for it."""
    return f"noise multiplier {s.noise_multiplier:g}" if s.noise_multiplier else f"epsilon {s.epsilon:g}"


def one_budget_sentence(s: OneBudget) -> str:
    """The budget of a one-epsilon page's private runs, as its settings paragraph opens."""
    if s.noise_multiplier:
        return f"Noise multiplier {s.noise_multiplier:g} (no calibration at this scale), epsilon accounted"
    return f"Target epsilon {s.epsilon:g}"


def budgets_sentence(s: TargetBudgets) -> str:
    """The budget of a page's private runs over several target epsilons, as its settings paragraph says it
    (ci: one noise multiplier, since calibrating each target outlasts the whole ci training)."""
    if s.epsilons:
        return f"Target epsilons {', '.join(f'{e:g}' for e in s.epsilons)}"
    return f"Noise multiplier {s.noise_multiplier:g} for every private mechanism (no calibration), epsilon accounted"


def machine() -> str:
    import torch

    cpus = os.cpu_count() or 0
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.machine()}, {cpus} CPUs, {gpu}, {platform.system()} {platform.release()}, " \
           f"Python {platform.python_version()}, torch {torch.__version__}"


def number(value: float, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if math.isinf(value):
        return "inf"
    if abs(value) >= 1e4:
        return f"{value:.2e}"
    return f"{value:.{digits}g}"


def perplexity_text(value: float, uniform: float = UNIFORM_BYTE_PERPLEXITY) -> str:
    """Perplexity as a page shows it, saying when a model is worse than a uniform guess over its tokens
    (bytes unless ``uniform`` says otherwise: a BPE vocabulary's size)."""
    if value >= max(1e4, 10 * uniform):
        return f"{value:.1e} (diverged)"
    return number(value, 4) + (" (worse than uniform)" if value > uniform else "")


def markdown_table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "|".join("---" if i == 0 else "---:" for i in range(len(header)))
    lines = ["| " + " | ".join(header) + " |", "|" + align + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def verdict_table(verdicts: list[Verdict]) -> str:
    rows = [[v.statement, v.seeds, v.ours, f"**{v.verdict}**"] for v in verdicts]
    return markdown_table(["claim", "the seed paper", "ours", "verdict"], rows, "---|---|---|---")


@dataclass
class Page:
    """A results page: Markdown sections and figures, written into a folder as one unit."""

    title: str
    sections: list[str]
    figures: dict[str, Any]  # file name -> matplotlib figure
    results: Results
    verdicts: list[Verdict]
    corpus: str = ""  # the experiment's corpus (common.CORPORA), named in the shared rows

    def write(self, folder: Path) -> list[Path]:
        """Write README.md, results.json and the PNGs into a fresh temporary folder, then swap it in: a
        failure leaves the old page whole."""
        import matplotlib.pyplot as plt

        folder = folder.resolve()
        folder.parent.mkdir(parents=True, exist_ok=True)
        partial = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        try:
            for name, figure in self.figures.items():
                figure.savefig(partial / name)
                plt.close(figure)
            (partial / "README.md").write_text(f"# {self.title}\n\n" + "\n\n".join(self.sections).rstrip() + "\n",
                                               encoding="utf-8")
            data = {"runs": [asdict(r) for r in self.results.runs], "figures": self.results.figures,
                    "claims": [asdict(v) for v in self.verdicts],
                    "rows": shared_rows(self.results.runs, self.corpus)}
            (partial / "results.json").write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
            old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
            if folder.exists():
                folder.rename(old)
            partial.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return sorted(folder.iterdir())


def conll_page_parser(doc: str | None, out: str, home_help: str) -> argparse.ArgumentParser:
    """The command line a CoNLL-2003 page script starts from: ``--conll-dir`` (required), ``--out`` (default:
    ``out``, the page's folder) and ``--home``; the page adds its own options after these."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conll-dir", type=Path, required=True, help="folder with eng.train, eng.testa, eng.testb")
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--home", type=Path, help=home_help)
    return parser


def write_command_file(out: Path, minutes: float, threads: str, *extra: str, name: str = "command.txt") -> None:
    """``out/command.txt`` (or ``name``): this script's command line, ``extra`` lines (e.g. the sweep it ran),
    the machine (``threads``: how many torch threads the runs used, in words) and the total wall time."""
    lines = ["python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), *extra,
             f"machine: {platform.machine()}, {os.cpu_count()} CPUs ({threads}), {platform.system()} "
             f"{platform.release()}, Python {platform.python_version()}",
             f"total wall time: {minutes:.1f} min"]
    (out / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out} in {minutes:.1f} min")


# --- epsilon against rounds (the UeDP paper's Fig. 4), shared by its CoNLL and AG News pages ----------

Curves = dict[str, list[list[float]]]  # {mechanism: [[T, epsilon], ...]}


def epsilon_curves(mechanisms: Sequence[str], users: int, rounds: Sequence[int],
                   settings_of: Callable[[str], dict[str, Any]]) -> Curves:
    """Each mechanism's sound epsilon (delta 1e-5) after T rounds, with ``users`` declared public (the
    paper's |U|), planned as ``uedp epsilon`` plans it; ``settings_of(mechanism)``: its rates and z."""
    from uedp.privacy.mechanisms import registry
    from uedp.privacy.population import Population
    from uedp.services.config import TrainConfig

    curves: Curves = {}
    for mechanism in mechanisms:
        points = []
        for t in rounds:
            params = TrainConfig.model_validate(dict(dataset="plan", mechanism=mechanism, rounds=t,
                                                     **settings_of(mechanism))).params
            plan = registry.get(mechanism).plan(params, Population.declared(users))  # type: ignore[misc]
            points.append([float(t), float(plan.epsilon)])
        curves[mechanism] = points
    return curves


def epsilon_at(curves: Curves, mechanism: str, t: float) -> float:
    return next(e for r, e in curves[mechanism] if r == t)


def epsilon_curves_figure(curves: Curves, paper_at_50: Mapping[str, float], title: str,
                          label: Callable[[str], str] = str, markersize: int = 3) -> Any:
    """Epsilon against rounds on log axes, one line per mechanism (uedp-naive dashed where it equals uedp),
    and the paper's figure at T = 50 as a cross beside each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for index, mechanism in enumerate(curves):
        points = curves[mechanism]
        same = mechanism == "uedp-naive" and all(math.isclose(a[1], b[1], rel_tol=1e-6)
                                                 for a, b in zip(points, curves["uedp"]))
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=markersize,
                color=f"C{index + 2}", linestyle="--" if same else "-", linewidth=2.5 if mechanism == "uedp" else 1.5,
                label=f"{label(mechanism)} (sound{'; equal to uedp' if same else ''})")
        if mechanism in paper_at_50:
            ax.plot(50, paper_at_50[mechanism], marker="x", markersize=10, mew=2, color=f"C{index + 2}",
                    linestyle="none", label=f"paper's {mechanism} at T = 50: {paper_at_50[mechanism]}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.get_xaxis(), ax.get_yaxis()):
        axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set(xlabel="rounds T", ylabel="epsilon at delta 1e-5 (log scale)", title=title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def uedp_above_userdp_at_50(r: Results) -> tuple[bool, str]:
    """The claim both UeDP pages judge: with sound accounting, uedp costs more epsilon than userdp at T = 50."""
    curves = r.figures["epsilon_curves"]
    u, n, d = (epsilon_at(curves, m, 50) for m in ("uedp", "uedp-naive", "userdp"))
    return u > d, f"uedp {number(u)}, uedp-naive {number(n)}, userdp {number(d)}"


def plus_no_worse_than_naive(r: Results) -> tuple[bool, str]:
    """The other: uedp (f_E+) never costs more than uedp-naive (f_E), at every round count of the curves."""
    curves = r.figures["epsilon_curves"]
    pairs = [(t, e, epsilon_at(curves, "uedp-naive", t)) for t, e in curves["uedp"]]
    equal = sum(1 for _, a, b in pairs if math.isclose(a, b, rel_tol=1e-3))
    return all(a <= b * (1 + 1e-9) for _, a, b in pairs), \
        f"uedp <= uedp-naive at all {len(pairs)} round counts ({equal} equal: the entity case dominates both)"
