"""uedp: user- and entity-level differentially private language-model training, as one pipeline."""

__version__ = "0.1.0"
