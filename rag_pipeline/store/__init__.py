"""The index store: PostgreSQL + pgvector schema, migrations, the write transaction, reads."""

from rag_pipeline.store.db import IndexConfigurationError, Store, migrate

__all__ = ["IndexConfigurationError", "Store", "migrate"]
