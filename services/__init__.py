"""The pipeline's services: training (set-up, run, record), configuration, data preparation, tracking,
detection, sanitization, audit plans, coverage, attacks and reports, as plain functions that Prefect's
tasks (:mod:`uedp.tasks`) wrap. Importable and testable without Prefect."""
