"""Tests of rag_pipeline (run with ./scripts/test)."""
