"""Parquet tables, atomic writers and the DuckDB catalog: the only code that knows paths."""
