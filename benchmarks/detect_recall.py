"""Recall of phone numbers and e-mail addresses, and false alarms on near misses, on synthetic customer-
service dialogs: Presidio over a blank spaCy pipeline (what runs where no pipeline can be downloaded),
with and without uedp's recall-first recognizers (detection/recognizers.yaml).

The dialogs are made up here (names, numbers, addresses): phone numbers in eight layouts, half with
area codes the phonenumbers library rejects (leading 0 or 1, N11, unassigned), e-mail addresses in
reserved domains (.example, .test, .invalid, localhost) and real-looking ones; near misses are dates,
prices, ZIP and ZIP+4 codes, version numbers, times, percentages and large counts.

A positive is found when a detected span of its category covers it; a near miss is a false alarm when
any detected span of a contact or identifier category (phone, e-mail, card, IBAN, SSN, IP, URL) touches
it (a date found as DATE_TIME is right, not an alarm).

    python benchmarks/detect_recall.py [--dialogs 400] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

FIRST = ("Dana", "Ravi", "Marta", "Kofi", "Lena", "Tomas", "Aiko", "Noor", "Pavel", "Ines", "Omar", "Greta")
LAST = ("Whitfield", "Okonjo", "Salvesen", "Brandt", "Ferreira", "Lindqvist", "Moreau", "Haddad", "Novak", "Quist")
DOMAINS = ("example.com", "mail.example", "corp.test", "helpdesk.invalid", "localhost", "example.org",
           "gmail.com", "uni.ac.uk", "shop.example.net", "inbox.test")
# Area codes: valid, leading 0 or 1 (invalid), N11 (service codes), unassigned.
AREAS = {"valid": ("212", "415", "617", "312", "503"), "leading 0/1": ("012", "068", "155", "199"),
         "N11": ("211", "411", "911", "611"), "unassigned": ("968", "379", "987", "533")}
CONTACT = frozenset({"PHONE_NUMBER", "EMAIL_ADDRESS", "CREDIT_CARD", "IBAN_CODE", "US_SSN", "IP_ADDRESS", "URL"})


@dataclass(frozen=True)
class Mark:
    """A span of one dialog line the measure looks at: a positive of ``category``, or a near miss."""

    line: int
    start: int
    end: int
    category: str | None  # None: a near miss
    kind: str


def _phone(rng: random.Random) -> tuple[str, str]:
    group = rng.choice(list(AREAS))
    a, e, n = rng.choice(AREAS[group]), f"{rng.randrange(1000):03d}", f"{rng.randrange(10000):04d}"
    layouts = [f"{a}-{e}-{n}", f"({a}) {e}-{n}", f"{a}.{e}.{n}", f"{a} {e} {n}", f"+1 {a} {e} {n}", f"1-{a}-{e}-{n}",
               f"+44 20 {rng.randrange(7000, 8000)} {rng.randrange(10000):04d}",
               f"0{rng.randrange(1000, 8000)} {rng.randrange(100000, 1000000)}"]
    return rng.choice(layouts), group


def _email(rng: random.Random) -> tuple[str, str]:
    first, last = rng.choice(FIRST).lower(), rng.choice(LAST).lower()
    local = rng.choice([f"{first}.{last}", f"{first[0]}{last}{rng.randrange(100)}", f"{first}+support", last])
    domain = rng.choice(DOMAINS)
    return f"{local}@{domain}", "reserved" if domain.split(".")[-1] in ("example", "test", "invalid", "localhost") \
        or domain.startswith("example") or domain.endswith("example.net") else "public"


def _near_miss(rng: random.Random) -> tuple[str, str]:
    year, month, day = rng.randrange(1990, 2031), rng.randrange(1, 13), rng.randrange(1, 29)
    options = [
        (f"{year}-{month:02d}-{day:02d}", "date"), (f"{day:02d}/{month:02d}/{year}", "date"),
        (f"{day:02d}.{month:02d}.{year}", "date"), (f"${rng.randrange(1, 9999):,}.{rng.randrange(100):02d}", "price"),
        (f"{rng.randrange(1, 999)}.{rng.randrange(100):02d} EUR", "price"), (f"{rng.randrange(10000, 99999)}", "zip"),
        (f"{rng.randrange(10000, 99999)}-{rng.randrange(10000):04d}", "zip+4"),
        (f"v{rng.randrange(1, 20)}.{rng.randrange(30)}.{rng.randrange(30)}", "version"),
        (f"{rng.randrange(1, 20)}.{rng.randrange(30)}.{rng.randrange(100)}", "version"),
        (f"{rng.randrange(24):02d}:{rng.randrange(60):02d}", "time"), (f"{rng.randrange(1, 100)}.{rng.randrange(10)}%", "percent"),
        (f"{rng.randrange(1, 999)},{rng.randrange(1000):03d},{rng.randrange(1000):03d}", "count"),
    ]
    return rng.choice(options)


TEMPLATES = (
    ("customer", "Hi, this is {name}; you can reach me on {phone} after {miss}."),
    ("agent", "Thanks {name}, I have {phone} on file, and your e-mail {email}?"),
    ("customer", "Yes, {email} is right. The invoice from {miss} is wrong."),
    ("agent", "Noted. Call us back on {phone} if the charge of {miss} stays."),
    ("customer", "Or write to {email}, or text {phone}. My ZIP code changed on {miss}."),
)


def dialog_corpus(dialogs: int, seed: int) -> tuple[list[dict[str, str]], list[Mark]]:
    """``dialogs`` five-line dialogs (one user per dialog) and the marks to measure on them."""
    rng = random.Random(seed)
    lines: list[dict[str, str]] = []
    marks: list[Mark] = []
    for d in range(dialogs):
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        for speaker, template in TEMPLATES:
            text, parts = "", template.split("{")
            text = parts[0]
            for part in parts[1:]:
                field, rest = part.split("}", 1)
                if field == "name":
                    value, category, kind = name, None, ""
                elif field == "phone":
                    (value, kind), category = _phone(rng), "PHONE_NUMBER"
                elif field == "email":
                    (value, kind), category = _email(rng), "EMAIL_ADDRESS"
                else:
                    (value, kind), category = _near_miss(rng), None
                if field != "name":
                    marks.append(Mark(len(lines), len(text), len(text) + len(value), category, kind))
                text += value + rest
            lines.append({"text": f"{speaker.upper()}: {text}", "user": f"dialog-{d:04d}"})
    # Offsets above are into the text after the speaker prefix.
    for i, mark in enumerate(marks):
        shift = len(lines[mark.line]["text"]) - len(lines[mark.line]["text"].split(": ", 1)[1])
        marks[i] = Mark(mark.line, mark.start + shift, mark.end + shift, mark.category, mark.kind)
    return lines, marks


@dataclass(frozen=True)
class Figures:
    recall: dict[str, tuple[int, int]]  # category -> (found, total)
    recall_by_kind: dict[str, tuple[int, int]]
    false_alarms: tuple[int, int]  # (near misses alarmed, near misses)
    alarms_by_kind: dict[str, tuple[int, int]]
    seconds: float


def measure(lines: list[dict[str, str]], marks: list[Mark], default_recognizers: bool, home_dir: Path) -> Figures:
    """Ingest the dialogs, detect with Presidio over a blank spaCy pipeline, and score the marks."""
    import spacy

    from uedp.detection.pipeline import DetectorConfig
    from uedp.services.detect import detect_entities
    from uedp.storage.catalog import Catalog
    from uedp.storage.home import DataHome
    from uedp.storage.ingest import IngestOptions, ingest

    home = DataHome.from_env(home_dir)
    corpus = home_dir / "dialogs.jsonl"
    corpus.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    blank = home_dir / "blank-en"
    if not blank.exists():
        spacy.blank("en").to_disk(blank)
    ingest(home, "dialogs", [corpus], IngestOptions(format="jsonl", text_col="text", user_col="user", split="users"))
    started = time.perf_counter()
    detect_entities(home, "dialogs", DetectorConfig(detectors=["presidio"], spacy_model=str(blank),
                                                   default_recognizers=default_recognizers))
    seconds = time.perf_counter() - started
    with Catalog(home, "dialogs") as catalog:
        texts = {text: sid for split in ("train", "valid", "test") for sid, _, text in catalog.sentences(split)}
        rows = catalog.con.execute('SELECT sentence_id, start, "end", category FROM entities').fetchall()
    spans: dict[int, list[tuple[int, int, str]]] = {}
    for sid, start, end, category in rows:
        spans.setdefault(sid, []).append((start, end, category))
    recall: dict[str, list[int]] = {}
    by_kind: dict[str, list[int]] = {}
    alarms = [0, 0]
    alarm_kinds: dict[str, list[int]] = {}
    for mark in marks:
        found = spans.get(texts[lines[mark.line]["text"]], [])
        if mark.category is not None:
            hit = any(s <= mark.start and e >= mark.end and c == mark.category for s, e, c in found)
            for tally in (recall.setdefault(mark.category, [0, 0]), by_kind.setdefault(f"{mark.category} {mark.kind}", [0, 0])):
                tally[0] += hit
                tally[1] += 1
        else:
            alarm = any(s < mark.end and e > mark.start and c in CONTACT for s, e, c in found)
            for tally in (alarms, alarm_kinds.setdefault(mark.kind, [0, 0])):
                tally[0] += alarm
                tally[1] += 1
    return Figures({k: (v[0], v[1]) for k, v in recall.items()}, {k: (v[0], v[1]) for k, v in sorted(by_kind.items())},
                   (alarms[0], alarms[1]), {k: (v[0], v[1]) for k, v in sorted(alarm_kinds.items())}, seconds)


def _share(pair: tuple[int, int]) -> str:
    return f"{pair[0] / pair[1]:7.1%} ({pair[0]}/{pair[1]})" if pair[1] else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dialogs", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    lines, marks = dialog_corpus(args.dialogs, args.seed)
    print(f"{args.dialogs} dialogs, {len(lines)} lines, {sum(m.category is not None for m in marks)} positives, "
          f"{sum(m.category is None for m in marks)} near misses")
    for defaults in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            figures = measure(lines, marks, defaults, Path(tmp))
        print(f"\nPresidio over a blank spaCy pipeline, {'with' if defaults else 'without'} uedp's recall-first "
              f"recognizers ({figures.seconds:.1f} s):")
        for category, pair in sorted(figures.recall.items()):
            print(f"  recall {category:14s} {_share(pair)}")
        for kind, pair in figures.recall_by_kind.items():
            print(f"    {kind:32s} {_share(pair)}")
        print(f"  false alarms on near misses {_share(figures.false_alarms)}")
        for kind, pair in figures.alarms_by_kind.items():
            print(f"    {kind:32s} {_share(pair)}")


if __name__ == "__main__":
    main()
