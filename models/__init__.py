"""Model builders, tokenization, batching and utility metrics. Imports neither Prefect nor MLflow."""
