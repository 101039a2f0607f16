"""The privacy core: accountants and calibration, mechanisms, sanitizers and attacks.

Follows ../shared/design/PRIVACY.md. Imports neither Prefect nor MLflow, so it runs and tests as plain
Python and torch.
"""
