"""Prefect tasks: one unit of work each, a thin ``@task`` (retries, a log line) around a service of
:mod:`uedp.services`, where the logic lives and is tested without Prefect."""
