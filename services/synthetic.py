"""``uedp generate``: a synthetic corpus sampled from a logged model, written as a new dataset of the data
home (sentences, users and an empty entities table, like an ingested corpus) with made-up writers, whose
manifest records the run it came from and that run's privacy statement (:mod:`services.synthetic_source`).

Generation reads the run's released model and nothing else of the private data: its prompts, when there
are any, come from a dataset of public text, refused when it shares a text (by content, or one sentence
verbatim) with the run's dataset. So the corpus is post-processing of the model and states the model's
guarantee; the source dataset's privacy ledger lists it at that guarantee, in no total.

The corpus is written at once, after every text was sampled (the three tables swapped in together): an
interrupted generation (Ctrl-C, a crash) leaves nothing, and the same command with the same settings
later reuses the corpus it wrote rather than sampling again.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from uedp.detection.identity import IDENTITY_VERSION
from uedp.errors import UedpError
from uedp.privacy.statement import PrivacyStatement
from uedp.progress import progress as progress_bar
from uedp.services import privacy_budget
from uedp.services.control_codes import control_code, without_code
from uedp.services.lineage import DATASET_ID_TAG, START_LINEAGE_TAG, TEXT_LINEAGE_TAG, protected_ids, text_lineage
from uedp.services.run_ids import is_run_id, not_a_run_id
from uedp.services.synthetic_source import SyntheticSource, synthetic_source
from uedp.storage.catalog import require_ingested
from uedp.storage.home import DataHome, validate_dataset_name
from uedp.storage.manifests import SentencesManifest, sentences_manifest, sentences_manifest_in
from uedp.storage.privacy_ledger import LedgerEntry
from uedp.storage.schemas import ENTITIES, GENERATED_FROM, SENTENCES, USERS
from uedp.storage.tables import TableWriter, hash_config, read_table
from uedp.storage.text_identity import TEXT_KEY, text_key_of

if TYPE_CHECKING:
    from uedp.models.sampling import SamplingSettings

WRITER_PREFIX = "synthetic-"
# Raised when the same settings would sample other texts (how prompts are chosen, how a text is sampled), so
# that a corpus an older uedp wrote is not reused as this one, and its ledger entry is apart. 2: prompts only
# from sentences longer than the prompt. 3: a Hugging Face model's prompts batched in order, left-padded (not
# grouped by length), so a seed draws other texts.
GENERATION_VERSION = 3
MIN_SHARED_WORDS = 4  # a prompts sentence of this many words or more found in the run's text refuses the prompts
EMPTY_ENTITIES_NOTE = "synthetic dataset: not detected"


class GenerateConfig(BaseModel):
    """One synthetic corpus: the run whose model samples it and how each text is sampled."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = Field(pattern=r"^[0-9a-f]{32}$", description="the MLflow run whose logged model generates (its id, "
                        "as `uedp train` prints it; train it with --log-model)")
    output: str | None = Field(None, description="name of the synthetic dataset (default: synthetic-<run id's first "
                               "12 characters>)")
    count: int = Field(1000, ge=1, description="texts to generate")
    max_new_tokens: int = Field(48, ge=1, le=4096, description="new tokens per text at most (a text also ends where "
                                "the model draws end-of-text)")
    temperature: float = Field(1.0, ge=0, description="softmax temperature (0: the most likely token every time)")
    top_p: float = Field(0.95, gt=0, le=1, description="nucleus sampling: draw among the most likely tokens whose "
                         "probability reaches top_p")
    prompts: str | None = Field(None, description="a dataset of public text in the data home: each text starts with "
                                "the first prompt_words words of one of its sentences (refused if it shares text with "
                                "the run's dataset); default: no prompt, each text starts after end-of-text")
    prompt_words: int = Field(2, ge=1, description="words of each public sentence that start a text")
    per_writer: int = Field(10, ge=1, description="texts per made-up writer (the synthetic dataset's users)")
    held_out: float = Field(0.2, ge=0, lt=1, description="share of the made-up writers whose texts form the valid "
                            "and test splits (half each)")
    seed: int = Field(0, description="seed of every draw (tokens, prompts, splits): generation is post-processing, "
                      "so a known seed costs no privacy")
    labels: list[str] = Field(default_factory=list, description="a labelled corpus: the classes to generate, each text "
                              "sampled after its class' control code from a run trained with control_codes; the "
                              "classes and their shares are yours (public by your word: read from no data)")
    label_shares: list[float] = Field(default_factory=list, description="with labels: each class' share of the texts, "
                                      "in the order of labels (default: equal shares)")
    batch_size: int = Field(32, ge=1, description="texts sampled at once")
    device: str = Field("auto", description="auto (a GPU when there is one), cpu, cuda or cuda:N")

    @field_validator("run_id", mode="before")
    @classmethod
    def _a_run_id(cls, value: Any) -> Any:
        if isinstance(value, str) and not is_run_id(value):
            raise ValueError(not_a_run_id(value))
        return value

    @model_validator(mode="after")
    def _valid_name(self) -> GenerateConfig:
        validate_dataset_name(self.output_name)
        return self

    @model_validator(mode="after")
    def _shares_of_the_labels(self) -> GenerateConfig:
        if self.label_shares and len(self.label_shares) != len(self.labels):
            raise ValueError(f"label_shares: {len(self.label_shares)} shares for {len(self.labels)} labels (one share "
                             "per label, in the same order)")
        if any(share <= 0 for share in self.label_shares):
            raise ValueError("label_shares: every share must be positive (leave a class out of labels instead)")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError("labels: a class is named twice")
        return self

    def shares(self) -> list[float]:
        """Each class' share of the texts, summing to 1 (equal when none are given)."""
        given = self.label_shares or [1.0] * len(self.labels)
        return [share / sum(given) for share in given]

    def text_labels(self) -> list[str | None]:
        """The class of each text, in order (None for every text of an unlabelled corpus): each class' share of
        ``count`` by the largest remainder, then the classes interleaved by a draw of the seed, so a batch
        holds several classes and the order is no signal. Reads the settings only."""
        if not self.labels:
            return [None] * self.count
        exact = [self.count * share for share in self.shares()]
        counts = [int(math.floor(value)) for value in exact]
        for index in sorted(range(len(exact)), key=lambda i: counts[i] - exact[i])[: self.count - sum(counts)]:
            counts[index] += 1
        labels = [label for label, n in zip(self.labels, counts) for _ in range(n)]
        order = np.random.default_rng([self.seed, 2]).permutation(len(labels))
        return [labels[int(i)] for i in order]

    @property
    def output_name(self) -> str:
        return self.output or f"synthetic-{self.run_id[:12]}"

    def sampling(self) -> SamplingSettings:
        from uedp.models.sampling import SamplingSettings  # torch: when text is drawn, not when settings are read

        return SamplingSettings(self.max_new_tokens, self.temperature, self.top_p)

    def identity(self) -> dict[str, Any]:
        """Everything that decides the texts (the device only changes rounding, the name nothing). The label
        settings came later: an unlabelled corpus keeps the key it had before they existed (reused, not sampled
        again)."""
        data = self.model_dump(exclude={"output", "device"})
        return {k: v for k, v in data.items() if v or k not in ("labels", "label_shares")}


@dataclass(frozen=True)
class GenerateResult:
    """What ``uedp generate`` wrote (or found written)."""

    dataset: str
    run_id: str
    source_dataset: str  # whose people the guarantee protects
    mechanism: str
    texts: int
    writers: int
    statement: PrivacyStatement  # the run's, word for word
    has_guarantee: bool
    guarantee: str  # in words, as `uedp datasets` says it
    reused: bool = False
    empty_texts: int = 0  # texts whose first draw was end-of-text (kept: the count is a setting)
    seconds: float = 0.0


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def generate_dataset(home: DataHome, config: GenerateConfig, progress: bool = False,
                     say: Callable[[str], Any] | None = None) -> GenerateResult:
    """Sample the corpus and write it as ``config.output_name`` (the dataset at once: none on an
    interruption, whose finished batches are kept so that the same command samples only the rest); a corpus
    already written with the same settings is reused. The source dataset's ledger lists it."""

    from uedp.models.device import resolve_device
    from uedp.services.logged_run import load_logged_run
    from uedp.services.tracking import RunTracker

    name = config.output_name
    device = resolve_device(config.device)
    run = load_logged_run(RunTracker.attach(home, config.run_id), device, "uedp generate")
    source = run.config.dataset
    require_ingested(home, source)
    if name == source:
        raise UedpError(f"--output {name}: that is the run's own dataset; give the synthetic corpus another name")
    tags = run.tags
    lineage = tuple(dict.fromkeys(i for i in (tags.get(DATASET_ID_TAG, ""), *tags.get(TEXT_LINEAGE_TAG, "").split(","))
                                  if i))
    statement = run.statement
    if statement is None:
        raise UedpError(f"run {config.run_id} logged no privacy statement (an older uedp trained it): a corpus sampled "
                        "from it could not say what protects it. Train the model again and generate from that run")
    if config.prompts:  # the prompts are text of the corpus the run never protected: public by the user's word
        statement = replace(statement, public=(*statement.public, f"the prompts: the first {config.prompt_words} "
                                               f"word(s) of sentences of dataset {config.prompts!r}"))
    text_labels = config.text_labels()
    if config.labels:
        if not run.config.control_codes:
            raise UedpError(f"--labels: run {config.run_id} was not trained with control codes (train it with "
                            "--control-codes on a labelled corpus), so its model does not know the classes' codes")
        statement = replace(statement, public=(*statement.public, "the classes generated and their shares: "
                                               + ", ".join(f"{label} {share:.3g}" for label, share in
                                                           zip(config.labels, config.shares()))
                                               + " (given by the user, read from no data)"))
    # A model trained on a synthetic corpus states that corpus' guarantee, for the people of the dataset the
    # corpus came from: so does what it generates, and that dataset's ledger lists it.
    upstream = synthetic_source(home, source)
    protected, covered = (upstream.dataset, upstream.run_id) if upstream is not None else (source, config.run_id)
    origin = SyntheticSource(config.run_id, protected, run.config.label, statement, lineage,
                             tuple(i for i in tags.get(START_LINEAGE_TAG, "").split(",") if i), config.prompts or "")
    prompt_texts, prompts_key = (public_prompts(home, config, protected, lineage) if config.prompts
                                 else ([""] * config.count, ""))
    if config.labels:  # each text starts with its class' code, then its public prompt words if any
        prompt_texts = [" ".join(p for p in (control_code(str(label)), prompt) if p)
                        for label, prompt in zip(text_labels, prompt_texts)]
    key = hash_config({"run_id": config.run_id, "settings": config.identity(), "prompts": prompts_key,
                       "version": GENERATION_VERSION})
    existing = sentences_manifest(home, name)
    if existing is not None:
        if existing.key != key:
            raise UedpError(_another_corpus(home, name, existing))
        result = _result(config, origin, existing, reused=True)
    else:
        from uedp.services.generation_batches import forget, sample_resumably  # torch: only to draw new text

        started = time.monotonic()
        bar = progress_bar(config.count, f"generate {name} from run {config.run_id[:8]}", "texts", enabled=progress,
                           say=say)
        kept = home.generation_dir(key)  # whole batches survive a crash: the same command samples only the rest
        try:
            texts = sample_resumably(kept, run.model, run.tokenizer, prompt_texts, config.sampling(), config.seed,
                                     config.batch_size, on_batch=bar.update)
        finally:
            bar.close()
        texts = [without_code(label, text) if label is not None else text for label, text in zip(text_labels, texts)]
        manifest = _write(home, config, origin, key, texts, text_labels)
        forget(kept)
        result = _result(config, origin, manifest, reused=False, seconds=time.monotonic() - started)
    _enter_in_ledger(home, config, origin, key, covered)
    if not result.has_guarantee:
        (say or _to_stderr)(f"warning: {name}: {result.guarantee}")
    return result


def public_prompts(home: DataHome, config: GenerateConfig, source: str,
                   lineage: tuple[str, ...]) -> tuple[list[str], str]:
    """The prompts, one per text: the first words of sentences of ``config.prompts`` longer than the prompt,
    drawn with the seed,
    and that dataset's content key. Prompts of private text would put it in the corpus outside any
    guarantee, so a prompts dataset is refused when it is the run's dataset, holds its text (or a text the run
    trained on, under any name), or shares one sentence with it verbatim (:class:`PromptsOverlap`: the
    refusal says only that; the file and line of each shared sentence go to a report in the data home)."""
    assert config.prompts is not None
    prompts = config.prompts
    require_ingested(home, prompts)
    theirs = set(text_lineage(home, prompts))
    if prompts == source or theirs & (protected_ids(home, source) | set(lineage)):
        raise UedpError(f"--prompts {prompts}: its text is the text run {config.run_id} trained on ({source!r}, or a "
                        "copy or release of it): prompts must be public text, or the corpus would carry the private "
                        "text outside any guarantee")
    table = read_table(home.table_dir(prompts, "sentences"))
    texts = table["text"].to_pylist()
    # A prompt is a beginning: sentences no longer than the prompt (a "REUTER" sign-off) would be whole texts.
    usable = [i for i, t in enumerate(texts) if t and len(t.split()) > config.prompt_words]
    if not usable:
        raise UedpError(f"--prompts {prompts}: none of its sentences has more than {config.prompt_words} words "
                        "(--prompt-words)")
    # Every sentence is checked, not only those drawn: whether a corpus is accepted must not depend on the draw,
    # and skipping the shared ones would make the prompts (so the corpus) depend on the private text. Lines
    # shorter than MIN_SHARED_WORDS words ("REUTER", "Thank you .") are in any two corpora of a kind: they
    # tell nothing about whether this one is the private text.
    private = {t.strip() for t in read_table(home.table_dir(source, "sentences"))["text"].to_pylist()
               if t and len(t.split()) >= MIN_SHARED_WORDS}
    shared = [row for row in usable if texts[row].strip() in private]
    if shared:
        files, lines = table["source_file"].to_pylist(), table["source_line"].to_pylist()
        report = _report_overlap(home, source, prompts, config.run_id, [f"{files[i]}:{lines[i]}" for i in shared])
        # The message goes to Prefect's task and flow logs when a flow generates: no file, line, count or text
        # (which sentences are shared, and how many, is private data); those are in the report, the curator's.
        raise PromptsOverlap(f"--prompts {prompts}: some of its sentences are also in {source!r}, the dataset run "
                             f"{config.run_id} trained on; prompts must be public text (remove the shared sentences "
                             "from the prompts corpus, or prompt from another one; their files and lines are in "
                             f"{report}, in the data home)", str(report))
    rng = np.random.default_rng([config.seed, 1])
    chosen = rng.choice(usable, size=config.count, replace=config.count > len(usable))
    ingested = sentences_manifest(home, prompts)
    key = ingested.key if ingested is not None else ""
    return [" ".join(texts[int(i)].split()[: config.prompt_words]) for i in chosen], key


class PromptsOverlap(UedpError):
    """A prompts dataset shares sentences with the run's text. The message says only that (it is what
    Prefect logs when a flow generates); ``report`` is the file in the data home's reports that names the
    file and line of every shared sentence, for the curator (:meth:`curator_lines`)."""

    def __init__(self, message: str, report: str) -> None:
        super().__init__(message)  # the message only: Prefect logs the exception's repr too
        self.report = report

    def __reduce__(self) -> tuple[Any, ...]:  # the same error again, wherever Prefect carries it
        return (type(self), (str(self), self.report))

    def curator_lines(self) -> list[str]:
        """For the curator's terminal only (the command prints them): the first shared sentence's file and
        line, how many more there are, and the report that lists them all."""
        path = Path(self.report)
        try:
            first = path.read_text(encoding="utf-8").splitlines()[0]
        except (OSError, IndexError):
            return []
        return [first, f"  (the file and line of every shared sentence: {path})"]


def _report_overlap(home: DataHome, source: str, prompts: str, run_id: str, places: list[str]) -> Path:
    """Write where a prompts dataset shares sentences with ``source`` to the data home's reports (the
    curator's, never released; written at once). The first line is what the curator's terminal shows."""
    more = f" (and {len(places) - 1} more)" if len(places) > 1 else ""
    body = [f"{places[0]}: this sentence{more} is also in {source!r}, the dataset run {run_id} trained on",
            f"--prompts {prompts}: {len(places)} sentence(s) of {MIN_SHARED_WORDS} words or more are also, word for "
            f"word, in {source!r} (private text): remove them from the prompts corpus, or prompt from another one.",
            "Their files and lines in the prompts dataset:", *places]
    folder = home.reports_dir(source)
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / f"prompts-{prompts}-refused.txt"
    temporary = file.with_suffix(f".partial-{os.getpid()}")
    temporary.write_text("\n".join(body) + "\n", encoding="utf-8")
    temporary.replace(file)
    return file


def writers_and_splits(count: int, per_writer: int, held_out: float, seed: int) -> tuple[list[str], list[str]]:
    """Each text's made-up writer and split: ``per_writer`` consecutive texts per writer, and whole writers
    drawn with the seed into valid and test (``held_out`` of them, half each, and at least one test writer
    when there are two writers or more), the rest train."""
    writers = math.ceil(count / per_writer)
    names = [f"{WRITER_PREFIX}{i + 1:0{max(5, len(str(writers)))}d}" for i in range(writers)]
    held = max(1, round(writers * held_out)) if held_out > 0 and writers >= 2 else 0  # a test writer, when it can
    order = np.random.default_rng([seed, 2]).permutation(writers)
    split_of = {int(w): "valid" if rank < held // 2 else "test" if rank < held else "train" for rank, w in enumerate(order)}
    return ([names[i // per_writer] for i in range(count)], [split_of[i // per_writer] for i in range(count)])


def _write(home: DataHome, config: GenerateConfig, origin: SyntheticSource, key: str, texts: list[str],
           labels: list[str | None]) -> SentencesManifest:
    """The three tables, swapped in together (a failure in any leaves none); a labelled corpus keeps each text's
    class in the sentences' label column, as an ingested classification corpus does."""
    users, splits = writers_and_splits(len(texts), config.per_writer, config.held_out, config.seed)
    positions: dict[str, int] = {}
    rows = []
    for i, (text, user, split, label) in enumerate(zip(texts, users, splits, labels, strict=True)):
        positions[user] = positions.get(user, -1) + 1
        rows.append({"sentence_id": i, "user_id": user, "doc_id": user, "split": split, "position": positions[user],
                     "text": text, "label": label, "source_file": f"generated:{config.run_id}", "source_line": i + 1,
                     "gold_spans": []})
    per_user: dict[str, dict[str, int]] = {}
    for user, split in zip(users, splits):
        counts = per_user.setdefault(user, {"train": 0, "valid": 0, "test": 0})
        counts[split] += 1
    details = {GENERATED_FROM: origin.as_json(), "generation": config.identity(), TEXT_KEY: text_key_of(texts),
               "per_split": {s: splits.count(s) for s in ("train", "valid", "test")}}
    out = {table: home.table_dir(config.output_name, table) for table in ("sentences", "users", "entities")}
    with TableWriter(out["sentences"], SENTENCES, key, details) as sentences:
        sentences.write_batch(pa.Table.from_pylist(rows, schema=SENTENCES))
        with TableWriter(out["users"], USERS, key, details) as writers:
            writers.write_rows([{"user_id": u, "n_sentences": sum(c.values()), "n_train": c["train"],
                                 "n_valid": c["valid"], "n_test": c["test"]} for u, c in per_user.items()])
            with TableWriter(out["entities"], ENTITIES, key, {"note": EMPTY_ENTITIES_NOTE, "sentences_key": key,
                                                              "entity_identity": IDENTITY_VERSION}):
                pass
    manifest = sentences_manifest_in(out["sentences"])
    assert manifest is not None
    return manifest


def _result(config: GenerateConfig, origin: SyntheticSource, manifest: SentencesManifest, reused: bool,
            seconds: float = 0.0) -> GenerateResult:
    texts = manifest.rows
    return GenerateResult(dataset=config.output_name, run_id=config.run_id, source_dataset=origin.dataset,
                          mechanism=origin.mechanism, texts=texts, writers=math.ceil(texts / config.per_writer),
                          statement=origin.statement, has_guarantee=origin.has_guarantee,
                          guarantee=origin.guarantee_words(), reused=reused, seconds=seconds)


def _enter_in_ledger(home: DataHome, config: GenerateConfig, origin: SyntheticSource, key: str, covered: str) -> None:
    """The source dataset's ledger lists the corpus as post-processing of its run: at the run's figures, in
    no total (a corpus generated again with the same settings is the same entry)."""
    s = origin.statement
    privacy_budget.file_post_processing(home, origin.dataset, LedgerEntry(
        key=f"generated:{config.output_name}:{key[:12]}", mechanism=origin.mechanism, unit=s.unit, epsilon=s.epsilon,
        delta=s.delta, name=config.output_name, randomness=s.randomness, scope="synthetic text sampled from its model",
        text=privacy_budget.text_of(home, origin.dataset), covered_by=f"run:{covered}"))


def _another_corpus(home: DataHome, name: str, manifest: SentencesManifest) -> str:
    made = manifest.generated_from
    what = (f"a corpus generated from run {made.get('run_id')} with other settings" if made is not None
            else "a dataset that is not a synthetic corpus")
    return (f"dataset {name!r} already holds {what}; remove {home.dataset_dir(name)} to replace it, or give this one "
            f"another name (--output)")


def generated_corpus(home: DataHome, dataset: str) -> SyntheticSource:
    """The source of a synthetic dataset, or a clear error for any other dataset."""
    require_ingested(home, dataset)
    source = synthetic_source(home, dataset)
    if source is None:
        raise UedpError(f"dataset {dataset!r} is not a synthetic corpus (`uedp generate RUN` makes one)")
    return source


