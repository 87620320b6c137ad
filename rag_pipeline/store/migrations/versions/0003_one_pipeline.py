"""One per-document pipeline: the ``skipped`` state, one failure ledger, run ids for every log row.

* ``documents.status`` gains ``skipped``: a document that is empty or has no extractable content ends
  there; it is terminal like ``permanently_failed`` but is not a failure. Existing ``permanently_failed``
  rows whose reason is ``empty`` or ``no text extracted`` move to ``skipped`` with a failure count of 0.
* ``documents.embedding_model``: the model of the current version's chunks (written by the swap), so the
  plan sees a model change without scanning ``chunks``; filled from ``chunks`` for existing rows.
* ``documents.first_failed_at`` / ``last_failed_at``: the failure window of the current content (the
  dead-letter report reads them); reset by a successful write.
* ``document_failures`` becomes the one ledger of failed attempts for every caller (the key is
  ``<caller>:<run id>``), with the ``terminal`` flag.
* ``ingest_log.run_id`` becomes text (``sync:<sync_runs.id>`` or ``dagster:<run id>``) and its action
  vocabulary is ``rag_pipeline.pipeline.outcome.Action``.

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

ACTIONS = ("added", "updated", "repaired", "re-embedded", "metadata-updated", "skipped-unchanged", "skipped",
           "failed", "deleted", "retry-requested")


def upgrade() -> None:
    op.execute("ALTER TABLE documents DROP CONSTRAINT IF EXISTS documents_status_check")
    op.execute("ALTER TABLE documents ADD CONSTRAINT documents_status_check CHECK (status IN "
               "('pending', 'completed', 'failed', 'permanently_failed', 'skipped', 'deleted'))")
    op.execute("ALTER TABLE documents ADD COLUMN embedding_model text, ADD COLUMN first_failed_at timestamptz, "
               "ADD COLUMN last_failed_at timestamptz")
    op.execute(
        """
        UPDATE documents d SET embedding_model = c.model
        FROM (SELECT DISTINCT ON (document_id) document_id, version, embedding_model AS model FROM chunks
              ORDER BY document_id, version DESC) c
        WHERE c.document_id = d.id AND c.version = d.version
        """
    )
    op.execute(
        """
        UPDATE documents SET status = 'skipped', failure_count = 0
        WHERE status = 'permanently_failed'
          AND (last_error = 'empty' OR last_error LIKE 'no text%')
        """
    )
    op.execute("UPDATE documents SET first_failed_at = updated_at, last_failed_at = updated_at "
               "WHERE status IN ('failed', 'permanently_failed')")
    op.execute("ALTER TABLE document_failures ADD COLUMN terminal boolean NOT NULL DEFAULT false")
    op.execute("ALTER TABLE ingest_log ALTER COLUMN run_id TYPE text USING "
               "CASE WHEN run_id IS NULL THEN NULL ELSE 'sync:' || run_id END")
    op.execute("ALTER TABLE ingest_log DROP CONSTRAINT IF EXISTS ingest_log_action_check")
    op.execute("ALTER TABLE ingest_log ADD CONSTRAINT ingest_log_action_check CHECK (action IN (%s))"
               % ", ".join(f"'{a}'" for a in ACTIONS))
    op.execute("CREATE INDEX ingest_log_run ON ingest_log (run_id)")
    op.execute("ALTER TABLE document_stage ADD COLUMN children_names text[], ADD COLUMN children_data bytea[]")


def downgrade() -> None:
    op.execute("ALTER TABLE document_stage DROP COLUMN children_names, DROP COLUMN children_data")
    op.execute("DROP INDEX IF EXISTS ingest_log_run")
    op.execute("ALTER TABLE ingest_log DROP CONSTRAINT IF EXISTS ingest_log_action_check")
    op.execute("ALTER TABLE document_failures DROP COLUMN terminal")
    op.execute("ALTER TABLE documents DROP COLUMN embedding_model, DROP COLUMN first_failed_at, "
               "DROP COLUMN last_failed_at")
    op.execute("UPDATE documents SET status = 'permanently_failed' WHERE status = 'skipped'")
    op.execute("ALTER TABLE documents DROP CONSTRAINT IF EXISTS documents_status_check")
    op.execute("ALTER TABLE documents ADD CONSTRAINT documents_status_check CHECK (status IN "
               "('pending', 'completed', 'failed', 'permanently_failed', 'deleted'))")
