"""Per-document steps: staged work between steps, failed attempts, pending deletions.

Additive only (no existing table changes):

* ``document_stage``: one row per document between the ``document_markdown`` and
  ``document_embeddings`` steps (fetched content's hash, the listing, the Markdown, then the chunk
  texts). Large data stays in PostgreSQL instead of passing through Dagster IO managers. A row is
  valid only while it is newer than the document's last write (``documents.ingested_at``).
* ``document_failures``: one row per failed attempt of a document, keyed by an attempt key (a
  Dagster run id), so a retried or re-delivered failure is counted once.
* ``pending_deletions``: documents that left a source, recorded by an inventory whose deletion guard
  passed, waiting for the purge step.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE document_stage (
            document_id    bigint PRIMARY KEY REFERENCES documents(id) ON DELETE CASCADE,
            content_sha256 text NOT NULL,
            listing        jsonb NOT NULL,
            markdown       text NOT NULL,
            mime_type      text NOT NULL,
            doc_type       text NOT NULL,
            page_count     integer,
            char_count     integer NOT NULL,
            stats          jsonb NOT NULL DEFAULT '{}'::jsonb,
            chunks         jsonb,
            staged_at      timestamptz NOT NULL DEFAULT clock_timestamp()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE document_failures (
            document_id bigint NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
            attempt_key text NOT NULL,
            reason      text,
            created_at  timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (document_id, attempt_key)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE pending_deletions (
            source      text NOT NULL,
            document_id bigint NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
            source_id   text NOT NULL,
            detected_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (source, document_id)
        )
        """
    )


def downgrade() -> None:
    for table in ("pending_deletions", "document_failures", "document_stage"):
        op.execute(f"DROP TABLE IF EXISTS {table}")
