"""Prefect tasks: one unit of work each. Each module keeps its logic in a plain function (testable
without Prefect) and exposes a thin ``@task`` around it for the flows."""
