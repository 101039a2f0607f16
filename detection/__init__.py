"""Sensitive-entity detectors. Each turns sentences into entity rows of ``storage.schemas.ENTITIES``."""
