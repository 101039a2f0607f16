"""The bundled demo corpus (``demo.conll``, package data): made-up messages in CoNLL-2003 format, written by
``scripts/make_demo_corpus.py``. A package so that setuptools installs it as one, without a warning."""
