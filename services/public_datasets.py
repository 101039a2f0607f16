"""Datasets declared public at ingest (``uedp ingest ... --public WHY``): a search's proxy, a pretraining
corpus. Their runs and local-DP releases are charged to no privacy ledger (there is no one in them to
protect), and a run's statement names the declaration among what it treats as public.

A declaration is refused while another dataset of the data home holds the same text (the same sentences
under another name, or a copy of either one's train split: :mod:`services.text_overlap`) without being
declared public itself: a public copy of a private text would put releases of that text in no ledger.
The declaration is the curator's word, as ``--public-count`` is: uedp cannot see whether text is public.
"""

from __future__ import annotations

from uedp.errors import UedpError
from uedp.services.lineage import text_lineage
from uedp.services.text_overlap import shares_train_text
from uedp.storage.home import DataHome
from uedp.storage.public_declaration import public_declaration, withdraw_declaration, write_declaration


def declare_public(home: DataHome, dataset: str, why: str) -> None:
    """Declare an ingested dataset public, after checking no private dataset of the home holds its text."""
    why = " ".join(why.split())
    if not why:
        raise UedpError("--public: say why the text is public (its source, e.g. 'Reuters-21578, public 1987 news')")
    private = private_copies(home, dataset)
    if private:
        raise UedpError(f"--public: {dataset!r} holds the same text as {', '.join(map(repr, private))}, which "
                        f"{'is' if len(private) == 1 else 'are'} not declared public; runs on a public copy would be "
                        "charged to no ledger while exposing that text. Ingest it again with --public too if its text "
                        "is public, or drop --public here")
    write_declaration(home, dataset, why)


def private_copies(home: DataHome, dataset: str) -> list[str]:
    """The datasets of the home, not declared public, that hold the text of ``dataset`` (either way round)."""
    return _copies(home, dataset, declared=False)


def public_copies(home: DataHome, dataset: str) -> list[str]:
    """The datasets of the home declared public that hold the text of ``dataset`` (either way round)."""
    return _copies(home, dataset, declared=True)


def _copies(home: DataHome, dataset: str, declared: bool) -> list[str]:
    own = next(iter(text_lineage(home, dataset)), "")
    found = []
    for other in home.dataset_folders():
        if other == dataset or (public_declaration(home, other) is not None) != declared:
            continue
        theirs = next(iter(text_lineage(home, other)), "")
        if theirs and (theirs == own or shares_train_text(home, other, [own]) or shares_train_text(home, dataset, [theirs])):
            found.append(other)
    return found


def apply_declaration(home: DataHome, dataset: str, why: str | None) -> str:
    """After an ingest: declare the dataset public (``why``), or withdraw a declaration an earlier ingest made
    (an ingest without ``--public`` says the text is private). Returns what to tell the user ("" for nothing)."""
    if why is not None:
        try:
            declare_public(home, dataset, why)
        except UedpError as exc:
            raise UedpError(f"{dataset!r} is ingested, as a private dataset: {exc}") from None
        return (f"{dataset}: declared public ({' '.join(why.split())}): its runs and local-DP releases are charged to "
                "no privacy ledger, and their statements name it among what they treat as public")
    said = (f"{dataset}: no longer declared public (ingested without --public): its later runs are charged to its "
            "privacy ledger" if withdraw_declaration(home, dataset) else "")
    public = public_copies(home, dataset)
    if public:  # runs on the public copy were charged to no ledger, and this dataset's ledger cannot see them
        said = "\n".join(line for line in (said, (
            f"warning: {dataset!r} holds the same text as {', '.join(map(repr, public))}, declared public at ingest: "
            "runs on it were charged to no ledger, and this dataset's budget cannot count them. If this text is "
            f"private, ingest {public[0]!r} again without --public")) if line)
    return said


def declared_public_words(home: DataHome, dataset: str) -> tuple[str, ...]:
    """What a run's statement adds to what it treats as public: the dataset's text, with the declaration."""
    why = public_declaration(home, dataset)
    return () if why is None else (f"the text of {dataset!r} (declared public at ingest: {why})",)
