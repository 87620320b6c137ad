"""Dagster layer: one folder per domain (ingestion, documents, sources); see rag_pipeline.definitions."""
