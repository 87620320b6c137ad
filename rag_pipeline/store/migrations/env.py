"""Alembic environment: runs on the connection handed over by ``rag_pipeline.store.migrate``."""

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None, transaction_per_migration=True)
with context.begin_transaction():
    context.run_migrations()
