"""Privacy attacks on trained models (canary exposure, membership inference, entity extraction) and the
empirical lower bound on epsilon they imply. Imports neither Prefect nor MLflow."""
