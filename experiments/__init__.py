"""Results pages, in one home: the seed papers' reproductions (``uedp reproduce``: :mod:`.reproduce` and
one module per paper's experiment) and the pages of uedp's own measurements (``python
experiments/<page>.py``: learning from a pretrained start, noise-to-signal, the one-run audit,
uedp-bounded on CoNLL). What every page shares (its scales, its table of runs, its figures, the
``command.txt`` beside it) is in :mod:`.common`."""
