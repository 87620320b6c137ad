"""rag_pipeline: keep a RAG index in PostgreSQL + pgvector exactly in sync with its sources.

Plain-Python core (sources, extraction, chunking, embedding, store, retrieval, sync) with a thin
Dagster layer in `rag_pipeline.defs`. See README.md for the tour.
"""

__version__ = "0.1.0"
