"""Generate uedp's bundled demo corpus: synthetic patient/customer messages in CoNLL-2003 format.

Everything here is invented for this project (names, organisations, phone numbers, e-mail
addresses); no licensed dataset is copied. The corpus is built so that the UeDP privacy unit matters:
a few entities (a clinic doctor, a pharmacy, a city) recur across many users, while each user's own
name, phone and e-mail recur only in that user's text.

Format: one ``-DOCSTART- -X- -X- O`` line per user document, one ``token POS chunk NER`` line per
token, blank lines between sentences, IOB2 tags over PER, LOC, ORG, MISC, PHONE and EMAIL. The POS
and chunk columns are coarse placeholders (NNP/I-NP on entity tokens, '.' on punctuation, XX/O
elsewhere); uedp reads only the token and NER columns.

Usage: python scripts/make_demo_corpus.py [--users 40] [--seed 7] [--out uedp/data/demo.conll]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

FIRST = ["Amara", "Bruno", "Chiara", "Dmitri", "Elif", "Farid", "Greta", "Hiroshi", "Ines", "Jonas",
         "Kaveh", "Lena", "Mateo", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Soren", "Tamsin",
         "Ulla", "Viktor", "Wanjiru", "Xavier", "Yusuf", "Zofia", "Anselm", "Beatriz", "Cyrus", "Dagny",
         "Emeka", "Fenna", "Gideon", "Hana", "Idris", "Jolene", "Kasimir", "Leocadia", "Marek", "Noor"]
LAST = ["Abernathy", "Brandvold", "Castellanos", "Drummond", "Eskildsen", "Fairweather", "Gorski",
        "Halvorsen", "Ibsen-Carr", "Jaramillo", "Kowalczyk", "Lindqvist", "Montague", "Nakashima",
        "Oyelaran", "Pellegrini", "Quarles", "Rautio", "Szabo", "Thackeray", "Umberfield", "Vasquez",
        "Whitcombe", "Yamazaki", "Zeller", "Ashdown", "Blackwood", "Corrigan", "Delacroix", "Everly"]
# Shared entities: these span many users' text (the UeDP unit protects them too).
SHARED_PEOPLE = ["Imelda Okafor", "Rupert Vance", "Selma Haddad", "Tobias Wren"]
SHARED_ORGS = ["Northgate Clinic", "Bellwether Pharmacy", "Harbourline Insurance", "Kestrel Bank",
               "Orchard Dental"]
PLACES = ["Leeds", "Bristol", "Glasgow", "Cardiff", "Rotterdam", "Lyon", "Porto", "Gdansk", "Tampere",
          "Riverside", "Maple Street", "Elm Avenue"]
MISC = ["Ibuprofen", "Metformin", "Atorvastatin", "Medicare", "Ramadan", "Christmas"]
DOMAINS = ["mailbox.example", "post.example", "inbox.example"]

# Templates are pre-tokenised; {SLOT} tokens are replaced by entities. Slots: SELF (the writer),
# DOC (a shared person), ORG (a shared organisation), LOC, MISC, PHONE and EMAIL (the writer's own).
TEMPLATES = [
    "My name is {SELF} and I am writing about my appointment .",
    "Please call me back on {PHONE} after five .",
    "You can reach me at {EMAIL} or on {PHONE} .",
    "Dr. {DOC} at {ORG} saw me last Tuesday .",
    "I moved from {LOC} to {LOC} in March .",
    "{ORG} has not refunded the charge yet .",
    "The prescription for {MISC} ran out on Friday .",
    "{SELF} here again , still waiting for the results .",
    "My daughter says {DOC} was very kind to her .",
    "I was told to contact {ORG} in {LOC} about the invoice .",
    "Send the letter to {EMAIL} please .",
    "The clinic in {LOC} asked for my number , which is {PHONE} .",
    "I would like to change my dentist at {ORG} .",
    "Thank you , {DOC} , for explaining the side effects of {MISC} .",
    "My husband works for {ORG} and has the same cover .",
    "We will be away in {LOC} until {MISC} .",
    "The appointment was moved twice without notice .",
    "I have not received any reply to my last message .",
    "The nurse was helpful but the waiting room was full .",
    "Is it possible to get the report by e-mail ?",
    "I paid the bill online but the payment is still pending .",
    "My account number changed when I switched to {ORG} .",
    "{DOC} recommended a follow-up in six weeks .",
    "The pharmacy on {LOC} had no stock this morning .",
    "Could someone from {ORG} confirm the new address ?",
    "I feel much better since I stopped taking {MISC} .",
    "Regards , {SELF} .",
    "The parking near the hospital is very expensive .",
    "My neighbour recommended {ORG} to me .",
    "Please update my phone number to {PHONE} .",
]


def _tag(tokens: list[str], label: str) -> list[tuple[str, str]]:
    return [(tok, ("B-" if i == 0 else "I-") + label) for i, tok in enumerate(tokens)]


def _zipf_choice(rng: random.Random, items: list[str]) -> str:
    """Pick with weights 1/rank, so the first items recur across many users."""
    weights = [1.0 / (rank + 1) for rank in range(len(items))]
    return rng.choices(items, weights=weights, k=1)[0]


def _user(rng: random.Random, index: int) -> dict[str, str]:
    first, last = FIRST[index % len(FIRST)], rng.choice(LAST)
    phone = f"+44 7700 9{rng.randrange(10**5):05d}"
    email = f"{first.lower()}.{last.lower()}@{rng.choice(DOMAINS)}"
    return {"SELF": f"{first} {last}", "PHONE": phone, "EMAIL": email}


def _sentence(rng: random.Random, template: str, user: dict[str, str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for tok in template.split():
        if not (tok.startswith("{") and tok.endswith("}")):
            out.append((tok, "O"))
            continue
        slot = tok[1:-1]
        if slot == "SELF":
            out += _tag(user["SELF"].split(), "PER")
        elif slot == "DOC":
            out += _tag(_zipf_choice(rng, SHARED_PEOPLE).split(), "PER")
        elif slot == "ORG":
            out += _tag(_zipf_choice(rng, SHARED_ORGS).split(), "ORG")
        elif slot == "LOC":
            out += _tag(_zipf_choice(rng, PLACES).split(), "LOC")
        elif slot == "MISC":
            out += _tag([rng.choice(MISC)], "MISC")
        elif slot in ("PHONE", "EMAIL"):
            # A phone number is one token group; keep its spaces as separate tokens.
            out += _tag(user[slot].split(), slot)
        else:
            raise ValueError(f"unknown slot {slot!r} in template {template!r}")
    return out


def _columns(token: str, tag: str) -> str:
    if tag != "O":
        return f"{token} NNP I-NP {tag}"
    if not any(ch.isalnum() for ch in token):
        return f"{token} . O {tag}"
    return f"{token} XX O {tag}"


def build(users: int, seed: int) -> str:
    rng = random.Random(seed)
    lines: list[str] = []
    for index in range(users):
        user = _user(rng, index)
        lines += ["-DOCSTART- -X- -X- O", ""]
        for template in rng.sample(TEMPLATES, k=rng.randint(10, 18)):
            lines += [_columns(tok, tag) for tok, tag in _sentence(rng, template, user)]
            lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("uedp/data/demo.conll"))
    args = parser.parse_args()
    args.out.write_text(build(args.users, args.seed), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
