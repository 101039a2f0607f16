"""Local-DP text sanitization (the thesis' chapter 3): each user's tokens are replaced before the
text leaves the user, by CusText (exponential mechanism over a customized K-token output set) or
SanText (exponential mechanism over the whole vocabulary, the baseline). No Prefect, no MLflow."""
