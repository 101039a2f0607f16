"""``selective-customersim``: the Selective-DP paper's CustomerSim experiment (its Table 2, right side, and
Fig. 4): customer-service dialogs whose names, addresses, phone numbers, order and tracking numbers a
regex policy marks private; an LSTM trained without noise, with DPSGD and with S-DPSGD at about the same
epsilon, and canary exposure.

Two model families, each at one target epsilon, as ``selective-conll`` runs them: LSTM (noiseless,
dpsgd, selective in its recurrent form) and GPT-2 from scratch (noiseless, deid as the redacted model,
dpsgd, selective in its two-phase form). Every run plants the same made-up secrets ("My ID is 123456 .",
repeated) for the canary exposure. The policy is ``customersim_policy.yaml`` beside this module, in
Presidio's recognizer format, run by ``uedp detect``'s presidio detector over a blank spaCy pipeline (no
NER model: the policy is regexes, as the paper's is).

Units. One dialog is one user; each turn (``SYS: ...`` / ``USR: ...``) is one sentence, so dpsgd's unit
here is one turn, not the dialog the paper's DPSGD protected (a whole dialog does not fit a byte-level
GPT-2 tiny's 128 positions).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from uedp.errors import UedpError
from uedp.experiments.claims import Claim, judge
from uedp.experiments.common import Context, Results, RunRow
from uedp.experiments.corpora import blank_pipeline, corpus_folder
from uedp.experiments.page import (
    UNIFORM_BYTE_PERPLEXITY,
    Page,
    budget_at,
    markdown_table,
    number,
    one_budget_sentence,
    perplexity_text,
    verdict_table,
)
from uedp.experiments.runs import canary_figures, run_sweep
from uedp.experiments.selective_conll import (
    FAMILIES,
    dpsgd_hides_canaries,
    family_order,
    improves_on_redacted,
    missed_secret,
    selective_beats_dpsgd,
    utility_exposure_figure,
)
from uedp.experiments.selective_conll import Settings as SelectiveSettings

POLICY = Path(__file__).with_name("customersim_policy.yaml")
# What the policy emits (Presidio's names) and the categories they become (uedp's taxonomy).
POLICY_ENTITIES = ["PERSON", "LOCATION", "PHONE_NUMBER", "ID"]
CATEGORIES = ["PERSON", "LOC", "PHONE_NUMBER", "ID"]
SPLIT_FOLDERS = ("train", "valid", "test")
DIALOG_FILE = re.compile(r"^dial-(\d+)\.txt$")
WORD = re.compile(r"\S+")
VALUE_WORD = re.compile(r"[A-Za-z0-9']+")
# The paper's Table 2 (right side: CustomerSim, LSTM, five runs each), from its text.
PAPER_TABLE2 = [("LSTM No-DP", "3.06 ± 0.01", "0.75", "-", "-", "-", "-"),
                ("DPSGD", "11.82 ± 0.76", "0.70", "0.60", "0.01", "2.51", "8e-5"),
                ("S-DPSGD", "10.42 ± 0.91", "0.69", "0.70", "5e-3", "2.74", "8e-5")]
PAPER_SHARE = 0.183  # of CustomerSim's (BPE) tokens, section 5.3
# The slots of the independent check of the policy: a system turn asking for one (by these words), the
# customer's next turn answering it; the tracking number is in the system's own turn.
SLOTS = (("name", "name"), ("address", "address"), ("phone", "phone"), ("order number", "order number"))


@dataclass(frozen=True)
class Settings(SelectiveSettings):
    """Selective-CoNLL's settings (the same paper's Table 2), with ``first`` counting dialogs per split (the
    lowest-numbered ones; None: all), and the bytes per turn."""

    max_len: int = 128  # bytes per turn (the longest turn of the paper's copy is 119), GPT-2 tiny's positions


SCALES = {
    "ci": Settings(first={"train": 30, "valid": 4, "test": 6}, steps=20, public_steps=10, batch_size=16,
                   epsilon=2.6, seeds=(0,), canaries=1, canary_repeats=10, lstm_size="tiny", gpt2_size="tiny",
                   randomness="seeded", noise_multiplier=1.0),
    "cpu": Settings(first={"train": 10_000, "valid": 300, "test": 1000}, steps=500, public_steps=250, batch_size=32,
                    epsilon=2.6, seeds=(0,), canaries=4, canary_repeats=10, lstm_size="tiny", gpt2_size="tiny",
                    randomness="secure"),
    "gpu": Settings(first=None, steps=5000, public_steps=2000, batch_size=64, epsilon=2.6, seeds=(0, 1, 2),
                    canaries=10, canary_repeats=10, lstm_size="paper", gpt2_size="small", randomness="secure"),
}


# --- inputs -------------------------------------------------------------------------------------------


def dialog_files(ctx: Context, first: dict[str, int] | None) -> tuple[list[Path], str]:
    """The dialog files to ingest (``dial-N.txt`` of each split folder, by N; the first ``first[split]``
    of them at a smaller scale) and the dataset's name. The Selective-DP copy's ``canary-N.txt`` files
    are left out: the runs plant canaries of their own, which the attack can score."""
    folder = corpus_folder(ctx, "simdial", SPLIT_FOLDERS)
    files: list[Path] = []
    for split in SPLIT_FOLDERS:
        found = sorted(((int(m.group(1)), p) for p in (folder / split).iterdir()
                        if p.is_file() and (m := DIALOG_FILE.match(p.name))), key=lambda pair: pair[0])
        if not found:
            raise UedpError(f"{folder / split}: no dialog files (dial-N.txt); give --simdial-dir, the folder holding "
                            "train/, valid/ and test/ folders of SimDial dialogs")
        count = first[split] if first else len(found)
        files += [p for _, p in found[:count]]
    if not first:
        return files, "customersim"
    return files, "customersim-first-" + "-".join(str(first[split]) for split in SPLIT_FOLDERS)


def ingest_and_detect(ctx: Context, s: Settings) -> tuple[str, dict[str, int]]:
    """Ingest the dialogs (one user per dialog, one sentence per turn) and detect the policy's entities;
    both reused when unchanged. Returns the dataset and its number of dialogs per split."""
    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.detect import detect_flow
    from uedp.flows.ingest import IngestConfig, ingest_flow

    files, dataset = dialog_files(ctx, s.first)
    ctx.say(f"ingest {dataset}: {len(files)} dialog files from {ctx.data_dir}")
    ingest_flow(IngestConfig(home=str(ctx.home.root), dataset=dataset, format="simdial",
                             files=[str(p) for p in files]))
    config = DetectorConfig(detectors=["presidio"], spacy_model=str(blank_pipeline(ctx)), recognizers=str(POLICY),
                            default_recognizers=False, presidio_entities=POLICY_ENTITIES)
    ctx.say(f"detect the CustomerSim policy ({POLICY.name}) in {dataset}")
    detect_flow(dataset, config, home=str(ctx.home.root))
    return dataset, {split: sum(1 for p in files if p.parent.name == split) for split in SPLIT_FOLDERS}


# --- runs ---------------------------------------------------------------------------------------------


def render(ctx: Context, results: Results) -> Page:
    """The page from figures already measured (``uedp reproduce --page-only``)."""
    return page(ctx, SCALES[ctx.scale], results)


def run(ctx: Context) -> Page:
    from uedp.services.sweep_config import SweepConfig

    s = SCALES[ctx.scale]
    dataset, dialogs = ingest_and_detect(ctx, s)
    results = Results()
    for model, mechanisms in FAMILIES.items():
        size = s.lstm_size if model == "lstm" else s.gpt2_size
        config = SweepConfig.model_validate(dict(
            home=str(ctx.home.root), dataset=dataset, mechanisms=mechanisms, category_sets=[CATEGORIES],
            seeds=list(s.seeds), target_epsilons=[] if s.noise_multiplier else [s.epsilon],
            noise_multiplier=s.noise_multiplier, model=model, model_size=size, steps=s.steps,
            public_steps=s.public_steps, batch_size=s.batch_size, max_len=s.max_len, canaries=s.canaries,
            canary_repeats=s.canary_repeats, randomness=s.randomness, device=ctx.device, threads=ctx.threads, precision=ctx.precision,
            checkpoint_every=0))
        results.runs += run_sweep(ctx, config, f"{model} {size}")
    for index, row in enumerate(results.runs):
        ctx.say(f"canary exposure of {row.label} ({row.family})")
        results.runs[index] = replace(row, extra={**row.extra, **canary_figures(ctx, row.run_id)})
    results.figures.update(corpus_figures(ctx, dataset))
    results.figures.update(dataset=dataset, dialogs=dialogs)
    return page(ctx, s, results)


# --- the corpus and the policy --------------------------------------------------------------------------


def corpus_figures(ctx: Context, dataset: str) -> dict[str, Any]:
    """Of the train split: the share of bytes (the models' tokens), whitespace words and turns the policy
    marks (overall and by category). Of the test split: the policy's recall by an independent check
    (held-out dialogs: the policy's shapes were checked against training dialogs while it was written)."""
    from uedp.storage.catalog import Catalog

    with Catalog(ctx.home, dataset) as catalog:
        rows = catalog.sentences("train")
        spans = catalog.entity_spans(CATEGORIES, "train")
        test_rows = catalog.sentences("test")
        test_spans = catalog.entity_spans(CATEGORIES, "test")

    def by_dialog(rows: Any, spans: Any) -> dict[str, list[tuple[str, list[tuple[int, int]]]]]:
        dialogs: dict[str, list[tuple[str, list[tuple[int, int]]]]] = {}
        for sentence_id, user, text in rows:
            dialogs.setdefault(user, []).append((text, [(a, b) for a, b, _, _ in spans.get(sentence_id, [])]))
        return dialogs

    dialogs = by_dialog(rows, spans)
    texts = {sentence_id: text for sentence_id, _, text in rows}
    by_category: Counter[str] = Counter()  # bytes inside each category's spans (two overlapping: in both)
    for sentence_id, found in spans.items():
        for a, b, category, _ in found:
            by_category[category] += len(texts[sentence_id][a:b].encode())
    share = private_token_share(dialogs)
    total = max(sum(len(t.encode()) for _, _, t in rows), 1)
    share["by_category"] = {c: by_category[c] / total for c in CATEGORIES}
    return {"private_token_share": share, "policy_recall": policy_recall(by_dialog(test_rows, test_spans))}


def private_token_share(dialogs: dict[str, list[tuple[str, list[tuple[int, int]]]]]) -> dict[str, Any]:
    """The share of bytes, whitespace words and turns inside a policy span: what selective protects and
    the others do not."""
    total_bytes = private_bytes = words = private_words = turns = private_turns = 0
    for turns_of in dialogs.values():
        for text, found in turns_of:
            turns += 1
            private_turns += bool(found)
            total_bytes += len(text.encode())
            private_bytes += sum(len(text[i].encode()) for i in range(len(text)) if _inside(i, found))
            for match in WORD.finditer(text):
                words += 1
                private_words += any(a < match.end() and match.start() < b for a, b in found)
    return {"bytes": private_bytes / max(total_bytes, 1), "words": private_words / max(words, 1),
            "sentences": private_turns / max(turns, 1)}


def _inside(index: int, spans: list[tuple[int, int]]) -> bool:
    return any(a <= index < b for a, b in spans)


def slot_of(turn: str) -> str | None:
    """The slot a system turn asks for (``name``, ``address``, ``phone``, ``order number``), or None."""
    lowered = turn.lower()
    return next((slot for slot, words in SLOTS if words in lowered), None)


def policy_recall(dialogs: dict[str, list[tuple[str, list[tuple[int, int]]]]]) -> dict[str, list[int]]:
    """The policy's recall by a check that shares nothing with its regexes: a turn's *value words* are its
    words that hold a digit, and its capitalised words that are rare in the corpus (in fewer than 3% of the
    dialogs, and fewer than three: template words are in most), those opening a sentence left out (a
    "Yea", "Phone" or "Thank" of a template that a small corpus holds only a few times; a bare name's
    first name, whose last name is still checked); each is attributed to the slot the system asked for in the turn before
    (the tracking number: the system's own turn that gives it; ``other``: a turn after no question).
    Returns ``slot -> [value words, of which inside a policy span]``."""
    document_frequency: Counter[str] = Counter()
    for turns_of in dialogs.values():
        document_frequency.update({w.group() for text, _ in turns_of for w in VALUE_WORD.finditer(text)})
    rare = max(3.0, 0.03 * len(dialogs))
    counts: dict[str, list[int]] = {}
    for turns_of in dialogs.values():
        asked: str | None = None
        for text, found in turns_of:
            role, _, _ = text.partition(":")
            if role == "SYS":
                slot = "tracking number" if "tracking number" in text.lower() else None
                asked = slot_of(text)
            else:
                slot = asked
            body = len(role) + 1
            for word in VALUE_WORD.finditer(text, body):
                value, before = word.group(), text[body:word.start()].rstrip()
                opens = not before or before[-1] in ".!?-"  # a template sentence's capital, not a name's
                if not any(c.isdigit() for c in value) and (
                        opens or not value[0].isupper() or document_frequency[value] >= rare):
                    continue
                tally = counts.setdefault(slot or "other", [0, 0])
                tally[0] += 1
                tally[1] += all(_inside(i, found) for i in range(word.start(), word.end()))
    return counts


# --- claims -------------------------------------------------------------------------------------------


def claims(s: Settings) -> list[Claim]:
    def policy_finds_the_slots(r: Results) -> tuple[bool, str]:
        recall = r.figures.get("policy_recall")
        if not recall:
            raise UedpError("no policy recall measured")
        slots = {slot: found / total for slot, (total, found) in recall.items() if total}
        named = [slot for slot, _ in SLOTS] + ["tracking number"]
        missing = [slot for slot in named if slot not in slots]
        return (not missing and min(slots.values()) >= 0.99,
                ", ".join(f"{slot} {slots[slot]:.1%}" for slot in sorted(slots, key=_slot_order))
                + (f"; no {', '.join(missing)} in the data" if missing else ""))

    return [
        Claim("the regex policy (Presidio recognizers) marks at least 99% of every slot's values (names, addresses, "
              "phone, order and tracking numbers), by an independent check", "the policy is built by regex "
              "(section 5); its recall is not reported", "extends", policy_finds_the_slots),
        Claim(f"at {budget_at(s)}, the LSTM orders noiseless < selective < dpsgd in perplexity",
              "No-DP 3.06 < S-DPSGD 10.42 (epsilon 2.74) < DPSGD 11.82 (epsilon 2.51) (Table 2, right)", "reproduces",
              family_order("lstm"), ("cpu", "gpu")),
        Claim(f"at {budget_at(s)}, GPT-2's two-phase selective (redacted, then DP on the original) beats dpsgd",
              "S-DPSGD beats DPSGD (Table 2, LSTM); no GPT-2 on CustomerSim", "extends", selective_beats_dpsgd("gpt2")),
        Claim("GPT-2's two-phase selective improves on the redacted model it starts from (deid)", "22.56 against the "
              "redacted model's 24.30 on WikiText-2 (Table 3); not run on CustomerSim", "extends",
              improves_on_redacted(), ("cpu", "gpu")),
        Claim("dpsgd hides the planted secrets better than noiseless (lower exposure)", "DPSGD's exposure below "
              "No-DP's (Fig. 4b)", "reproduces", dpsgd_hides_canaries, ("cpu", "gpu")),
        Claim("a secret the policy does not mark (the canaries here) is exposed more by selective than by dpsgd",
              "S-DPSGD lowest exposure (Fig. 4b) for a canary its policy protected; a missed secret's exposure rises as "
              "the model fits (Fig. 6)", "reproduces", missed_secret, ("cpu", "gpu")),
    ]


def _slot_order(slot: str) -> int:
    order = [name for name, _ in SLOTS] + ["tracking number", "other"]
    return order.index(slot) if slot in order else len(order)


# --- the page -----------------------------------------------------------------------------------------


def page(ctx: Context, s: Settings, results: Results) -> Page:
    verdicts = judge(claims(s), results, ctx.scale)
    order = {"noiseless": 0, "deid": 1, "dpsgd": 2, "selective": 3}
    rows = []
    for row in sorted(results.runs, key=lambda r: (r.family, order.get(r.label, 9))):
        form = {"selective": "recurrent" if row.family.startswith("lstm") else "two-phase",
                "deid": "redacted model"}.get(row.label, "")
        rows.append([row.family, row.label + (f" ({form})" if form else ""), _unit(row), number(row.epsilon),
                     perplexity_text(row.perplexity), number(row.extra.get("canary_exposure_mean", math.nan)),
                     number(row.extra.get("canary_exposure_max", math.nan)), f"{row.seconds:.0f} s",
                     f"`{row.run_id[:8]}`"])
    share = results.figures["private_token_share"]
    by_category = ", ".join(f"{c} {v:.1%}" for c, v in share.get("by_category", {}).items())
    recall = results.figures.get("policy_recall", {})
    recall_rows = [[slot, str(total), str(found), f"{found / total:.2%}" if total else "-"]
                   for slot, (total, found) in sorted(recall.items(), key=lambda item: _slot_order(item[0]))]
    dialogs = results.figures.get("dialogs", {})
    sections = [
        INTRO,
        f"Data: `{results.figures['dataset']}`"
        + (f", {dialogs['train']:,} training, {dialogs['valid']:,} validation and {dialogs['test']:,} test dialogs"
           if dialogs else "")
        + " (any `canary-*.txt` files, the Selective-DP copy's planted secret, left out: the runs plant canaries of their "
        f"own). One dialog is one user; each turn (`SYS: ...`, `USR: ...`, its role kept) is one sentence. The "
        f"policy (`experiments/{POLICY.name}`) marks **{share['words']:.1%} of the train split's words, "
        f"{share['bytes']:.1%} of its bytes** (the models' tokens; {by_category}), in {share['sentences']:.1%} of "
        f"its turns; the paper's policy marked {PAPER_SHARE:.1%} of its BPE tokens, where a name or a number is "
        "split into several tokens and a template word is one. Models from scratch with byte tokens "
        f"({UNIFORM_BYTE_PERPLEXITY:g} is a uniform guess): LSTM `{s.lstm_size}` and GPT-2 `{s.gpt2_size}`. "
        f"{s.steps} steps of batch {s.batch_size} (selective with GPT-2: {s.public_steps} noiseless steps on the "
        f"redacted text first), turns of up to {s.max_len} bytes. {one_budget_sentence(s)} at delta 1e-5 for dpsgd (one turn, "
        f"add/remove) and selective (one private byte, replace-one). {s.canaries} "
        f"{'canary' if s.canaries == 1 else 'canaries'} (`digits:6`: \"My ID is NNNNNN .\", the paper's form), each planted {s.canary_repeats} times, in every run; seeds "
        f"{', '.join(map(str, s.seeds))}; randomness {s.randomness}.",
        "## Utility and exposure at equal epsilon\n\n![perplexity and exposure](selective.png)\n\n"
        + markdown_table(["model", "mechanism", "protects", "accounted epsilon", "test perplexity (per byte)",
                          "canary exposure (mean)", "exposure (max)", "wall time", "MLflow run"], rows,
                         "---|---|---|---:|---:|---:|---:|---:|---"),
        "Exposure is log2 of the candidates' count minus log2 of the canary's rank among them (Carlini et al.; "
        "about 1.44 for a random rank, log2(10^6) = 19.9 at most for six digits).",
        "The paper's figures (CustomerSim, one-layer LSTM 200/200 with a BPE tokenizer, five runs), from its "
        "text:\n\n" + markdown_table(["Table 2 (right)", "test perplexity (per BPE token)", "top-1 accuracy",
                                      "sigma", "C", "epsilon", "delta"], [list(r) for r in PAPER_TABLE2],
                                     "---|---:|---:|---:|---:|---:|---:")
        + "\n\nFig. 4: at a given utility, S-DPSGD's canary exposure is below No-DP's and DPSGD's (its canary, "
        "\"My ID is 341752.\" inserted 10 times); membership inference on customer names is only a little better "
        "than a random guess (60+%) for every model.",
        "## The policy, checked\n\nRecall of the policy on the test split (held-out dialogs: its shapes were checked "
        "against training dialogs while it was written) by a check that shares nothing with its "
        "regexes: a turn's value words (those with a digit, and capitalised words in fewer than 3% of the dialogs "
        "that do not open a sentence) belong to the slot the bot asked for in the turn before (the tracking number: the bot's own turn), and each must lie inside "
        "a policy span.\n\n" + markdown_table(["slot", "value words", "inside a policy span", "recall"], recall_rows),
        "## The seeds' claims, checked\n\n" + verdict_table(verdicts),
        DISCUSSION,
    ]
    return Page("Selective-DP on CustomerSim: Table 2 (right) and Fig. 4 at equal epsilon", sections,
                {"selective.png": figure(results, s)}, results, verdicts)


def _unit(row: RunRow) -> str:
    """What the run's epsilon protects, in a few words."""
    if row.label == "dpsgd":
        return "one turn"
    if row.label == "selective":
        return "one private byte" if row.family.startswith("lstm") else "the private bytes of one turn"
    return "nothing (no guarantee)"


def figure(results: Results, s: Settings) -> Any:
    return utility_exposure_figure(results, budget_at(s), "test perplexity per byte (lower is better)")

INTRO = """The Selective-DP paper (`selective-dp.txt`, sections 5 and 5.3) simulates customer-service
dialogs (CustomerSim, with SimDial) whose customer names, addresses, phone numbers, order and tracking
numbers a regex policy marks private, and reports that its S-DPSGD reaches a better perplexity than
DPSGD at about the same epsilon with an LSTM (Table 2, right: 10.42 against 11.82), a smaller gain than
on WikiText-2 because more of the tokens are private (18.3%), and that at a given utility S-DPSGD
exposes its canary least (Fig. 4). This page runs that design with uedp's `selective` mechanism
(recurrent form for the LSTM), beside `noiseless` and `dpsgd`, and also GPT-2 (as the issue asks:
`noiseless`, `deid` as the redacted model, `dpsgd`, and `selective` in its two-phase form), all private
runs calibrated to one target epsilon near the paper's, on the paper's own CustomerSim dialogs, with
the policy written as Presidio recognizers that `uedp detect` runs."""

DISCUSSION = """## What this shows, and what it cannot

- **Units, honestly.** One dialog is one user, and each turn is one sentence: dpsgd's epsilon protects
  one *turn* (add/remove), not the dialog the paper's DPSGD protected (its examples were whole
  dialogs); a dialog of 8 to 13 turns is covered as a whole only by group privacy, at a much larger
  epsilon, and `userdp` / `uedp` are uedp's mechanisms whose unit is the dialog. A whole dialog
  (~400 bytes) does not fit a byte-level GPT-2 tiny's 128 positions, a turn (up to 119 bytes) does.
  Selective's epsilon protects one private *byte's* value (replace-one) in the recurrent form, with
  the policy public; a name of L bytes as a whole only at up to L times it (group privacy). Its
  two-phase form spends nothing on the redacted text (which two datasets differing only in private
  bytes share) and runs DP-SGD on whole turns in its second phase (replace-one), so its epsilon covers
  all the private bytes of one turn together, a stronger unit than the recurrent form's. The paper computed S-DPSGD's epsilon with sensitivity C, which holds only for
  add/remove; ours is replace-one (twice the sensitivity), so the same noise gives a larger, honest
  epsilon. Our delta is 1e-5 (below one over the number of turns), the paper's 8e-5.
- **The policy, and what it was written from.** It was written from SimDial's templates and Faker's
  formats (public code) and its shapes were checked against the paper's *training* dialogs, the text
  the runs protect. A policy tuned on protected text is itself a release that no epsilon covers; here
  the dialogs are synthetic, drawn from those public templates, and the policy holds no value from
  them (no name, number or address), only shapes and template words, so it reveals nothing about one
  dialog beyond the templates every dialog shares. On private text, write a policy from public
  examples only. Its recall above is measured on the test split, which it was not checked against. A secret it misses is not covered by selective's epsilon at all:
  the canaries here ("My ID is NNNNNN .") are marked by no recognizer (uedp plants them after
  detection), so their exposure under selective measures exactly that gap (the paper's Fig. 6).
  The paper's Fig. 4, where S-DPSGD exposes its canary least, presupposes a canary its policy
  protects (its section 5.4.2 studies a missed one apart).
- **What differs from the paper**: byte tokens, not the paper's BPE (per-byte perplexities are much
  lower than per-BPE-token ones and not comparable in absolute terms; the private share is counted
  in bytes and words); model sizes (`tiny` on a CPU, the paper's 200/200 LSTM and GPT-2 `small` from
  scratch at the gpu scale); no pretrained GPT-2 (none can be downloaded here); our canaries
  (`digits:6`, several, planted by each run) instead of the paper's one fixed "My ID is 341752."; the
  cpu scale validates on the first 300 validation dialogs (the data line above gives the counts).
- **Cannot be checked here**: Fig. 4b with a canary the policy marks (uedp's canaries are planted
  after detection); Fig. 4c's membership inference on customer names (not run by this page: uedp's
  membership attack scores turns, sentences and users, not a name slot; `uedp attack RUN --kind mia`
  runs it on any of these runs); the paper's top-1 accuracy; its learning-rate schedules (we use Adam at uedp's
  default rate); five runs per configuration (one seed on the cpu, three on the gpu scale).
- Test perplexity, the private shares and the policy's recall are computed without noise on the
  public benchmark: they are outside every guarantee."""
