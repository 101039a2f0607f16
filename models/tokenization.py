"""Tokenizers that cannot leak training text through their vocabulary.

A BPE vocabulary learned on private text memorises its frequent strings (a patient's surname can
become one token). uedp therefore uses either a pretrained tokenizer loaded as users load one
(``from_pretrained`` on a local path or hub name, e.g. GPT-2's byte-level BPE), or, for models built
from scratch, a pure byte-level tokenizer: 256 byte symbols and no merges, learned from nothing.

For word-level models (the Selective-DP paper's LSTM) :func:`word_level_tokenizer` builds a word
vocabulary from a word list the caller takes from *public* text (never from the text a run protects:
an entry says that some sentence held the word, which no sentence-level epsilon covers). Digits are
always split into the single-digit tokens 0-9, which are always in the vocabulary, so no number is
ever an entry, whatever text the list came from; every other word outside the list is ``<unk>``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

EOS = "<|endoftext|>"
UNK = "<unk>"  # WikiText's own unknown-word mark: the same token
DIGITS = tuple("0123456789")
WORD_LIST_FILE = "word_list.json"  # beside a saved word-level tokenizer: where its words came from


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A GPT-2-compatible byte-level tokenizer with no learned merges (vocabulary: 256 bytes + EOS)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: index for index, symbol in enumerate(alphabet)}
    vocab[EOS] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves this __init__ unannotated
        tokenizer_object=core, eos_token=EOS, pad_token=EOS, bos_token=EOS
    )


def load_tokenizer(name_or_path: str | Path) -> PreTrainedTokenizerBase:
    """Load a tokenizer the way users do; ``byte`` builds the leak-free byte-level one."""
    if str(name_or_path) == "byte":
        return byte_level_tokenizer()
    tokenizer = AutoTokenizer.from_pretrained(str(name_or_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@dataclass(frozen=True)
class WordSplit:
    """How a word-level tokenizer cuts text into words. The default is WikiText's: words (``\\w+``) and
    runs of punctuation (``[^\\w\\s]+``, so ``@-@`` stays one word), then every digit on its own
    (``1990s`` is ``1 9 9 0 s``), so that no number is ever a vocabulary entry. ``pattern`` instead
    makes each match of a regex one word (and whatever lies between matches another): the local-DP
    sanitizers' segmentation, so that every word a release can hold is exactly one token."""

    pattern: str | None = None
    lowercase: bool = False
    digits_alone: bool = True

    def pre_tokenizer(self) -> pre_tokenizers.PreTokenizer:
        if self.pattern is None:
            steps: list[pre_tokenizers.PreTokenizer] = [pre_tokenizers.Whitespace()]
        else:
            steps = [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(self.pattern), behavior="isolated")]
        if self.digits_alone:
            steps.append(pre_tokenizers.Digits(individual_digits=True))
        return pre_tokenizers.Sequence(steps)


WIKITEXT_SPLIT = WordSplit()


def word_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """The default :class:`WordSplit`'s pre-tokenizer (WikiText's words, digits one by one)."""
    return WIKITEXT_SPLIT.pre_tokenizer()


def word_counts(texts: Iterable[str]) -> Counter[str]:
    """How often each word of ``texts`` occurs, split as :func:`word_level_tokenizer` splits; digits and
    ``<unk>`` are not counted (they are in every word-level vocabulary anyway)."""
    split = word_pre_tokenizer()
    counts: Counter[str] = Counter()
    for text in texts:
        for piece in text.split(UNK):  # WikiText's literal <unk> is the unknown token, not < unk >
            counts.update(word for word, _ in split.pre_tokenize_str(piece) if not _has_digit(word))
    return counts


def most_frequent_words(texts: Iterable[str], size: int) -> list[str]:
    """The ``size`` most frequent words of ``texts`` (ties by first occurrence): a word list for
    :func:`word_level_tokenizer`. Pass public text only: the list is released with every model."""
    if size < 1:
        raise ValueError("a word list needs at least one word")
    return [word for word, _ in word_counts(texts).most_common(size)]


def _has_digit(word: str) -> bool:
    return any(ch.isdigit() or ch.isnumeric() for ch in word)


def word_level_tokenizer(words: Iterable[str], split: WordSplit = WIKITEXT_SPLIT) -> PreTrainedTokenizerFast:
    """A word-level tokenizer (Hugging Face ``WordLevel``) over ``words``: ``<unk>``, the EOS token, the
    ten digits (when ``split.digits_alone``), then the words in order; anything else is ``<unk>``.

    With digits alone, a word with a digit in it is refused: the pre-tokenizer never yields one, and an
    entry such as ``341752`` would publish a number from the list's source. A word with whitespace is
    refused always (no split yields one)."""
    vocab: dict[str, int] = {UNK: 0, EOS: 1}
    if split.digits_alone:
        vocab.update({digit: 2 + i for i, digit in enumerate(DIGITS)})
    for word in words:
        if not word or (split.digits_alone and _has_digit(word)) or any(ch.isspace() for ch in word):
            raise ValueError(f"word list entry {word!r}: a vocabulary word has "
                             + ("no digit and no whitespace (digits are always single-digit tokens)"
                                if split.digits_alone else "no whitespace"))
        vocab.setdefault(word, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    if split.lowercase:
        core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = split.pre_tokenizer()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves this __init__ unannotated
        tokenizer_object=core, unk_token=UNK, eos_token=EOS, pad_token=EOS, bos_token=EOS
    )


def save_word_level_tokenizer(words: list[str], folder: Path, source: str,
                              split: WordSplit = WIKITEXT_SPLIT) -> Path:
    """Build :func:`word_level_tokenizer` and save it with ``save_pretrained`` into ``folder``, which
    ``load_tokenizer(folder)`` and a run's ``tokenizer=FOLDER`` then use as they are; ``source`` (where
    the words came from) is written beside it, for the statement a page makes about the vocabulary."""
    tokenizer = word_level_tokenizer(words, split)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(folder))
    (folder / WORD_LIST_FILE).write_text(json.dumps({"source": source, "words": len(words)}, indent=1) + "\n",
                                         encoding="utf-8")
    return folder


VOCABULARY_SOURCE_FILE = "vocabulary_source.json"  # beside a saved BPE tokenizer: the public text it learnt from


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2's scheme: any byte string is encodable, nothing is ``<unk>``)
    whose merges are learnt from ``texts``, which must be *public*: a merge says that its string was
    frequent in the text it came from, and the vocabulary is released with every model that uses it.

    Digits are split one by one before the merges, so no number of the source becomes a token (as in
    :func:`word_level_tokenizer`), and every digit costs one token whatever text the merges came from."""
    from tokenizers import trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 1:
        raise ValueError(f"a byte-level BPE vocabulary holds the {len(alphabet)} bytes and {EOS}: "
                         f"vocab_size must be at least {len(alphabet) + 1}, got {vocab_size}")
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                  pre_tokenizers.ByteLevel(add_prefix_space=False)])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=alphabet,
                                  show_progress=False)
    core.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves this __init__ unannotated
        tokenizer_object=core, eos_token=EOS, pad_token=EOS, bos_token=EOS
    )


def save_bpe_tokenizer(tokenizer: PreTrainedTokenizerBase, folder: Path, source: dict[str, object]) -> Path:
    """Save a :func:`train_bpe_tokenizer` with ``save_pretrained`` into ``folder`` (``--tokenizer FOLDER``
    and ``load_tokenizer`` use it as it is), with ``source`` (which public text it learnt from: the dataset,
    its text key and lineage) written beside it: training checks that lineage against the run's dataset."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(folder))
    (folder / VOCABULARY_SOURCE_FILE).write_text(json.dumps(source, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return folder


def vocabulary_source(folder: str | Path) -> dict[str, object] | None:
    """What a tokenizer folder says it learnt from (:func:`save_bpe_tokenizer`), or None."""
    path = Path(folder) / VOCABULARY_SOURCE_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else None
