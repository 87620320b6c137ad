"""Permission-aware index: who may read each document, group membership, held documents hidden.

* ``documents.principals`` (``text[]``, GIN-indexed): the principals allowed to read the document
  (``rag_pipeline.permissions.principals``); empty = nobody but an admin. ``permissions_error``: why the
  source's permissions could not be read (the scope is then empty: fail closed);
  ``permissions_synced_at``: when the permission sync last wrote the scope.
  **Existing documents get the empty scope** with ``permissions_error`` saying they were not read yet:
  nothing becomes readable by anyone until the next sync reads each source's own permission data.
* ``documents.hidden_reason``: set while the deletion guard holds a vanished document back and its
  source's policy hides such documents (``rag_pipeline.permissions.visibility``; a partial index finds a
  source's hidden documents without reading the others); queries skip it, its
  chunks stay, so a listing that brings it back shows it again with no re-embedding.
* ``group_members``: the *expanded* membership of each group a source issued: one row per
  (source, group, member) for every direct or nested member (users and groups).
* ``retrieval_log``: who asked (``principals`` as given, ``admin``), how many of the unfiltered top-k
  the permission filter removed (``filtered_count``) and how many hits the re-check dropped
  (``recheck_dropped``, ``recheck_dropped_ids``).

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE documents ADD COLUMN principals text[] NOT NULL DEFAULT '{}', "
               "ADD COLUMN permissions_error text, ADD COLUMN permissions_synced_at timestamptz, "
               "ADD COLUMN hidden_reason text")
    op.execute("UPDATE documents SET permissions_error = "
               "'permissions not read yet (index upgraded to revision 0004): readable by nobody until the next sync'")
    op.execute("CREATE INDEX documents_principals ON documents USING gin (principals)")
    op.execute("CREATE INDEX documents_hidden ON documents (source) WHERE hidden_reason IS NOT NULL")
    op.execute(
        """
        CREATE TABLE group_members (
            source          text NOT NULL,
            group_principal text NOT NULL,
            member          text NOT NULL,
            synced_at       timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (source, group_principal, member)
        )
        """
    )
    op.execute("CREATE INDEX group_members_member ON group_members (member)")
    op.execute("ALTER TABLE retrieval_log ADD COLUMN principals text[], ADD COLUMN admin boolean NOT NULL DEFAULT false, "
               "ADD COLUMN filtered_count integer, ADD COLUMN recheck_dropped integer, "
               "ADD COLUMN recheck_dropped_ids bigint[]")


def downgrade() -> None:
    op.execute("ALTER TABLE retrieval_log DROP COLUMN principals, DROP COLUMN admin, DROP COLUMN filtered_count, "
               "DROP COLUMN recheck_dropped, DROP COLUMN recheck_dropped_ids")
    op.execute("DROP TABLE group_members")
    op.execute("DROP INDEX documents_hidden")
    op.execute("DROP INDEX documents_principals")
    op.execute("ALTER TABLE documents DROP COLUMN principals, DROP COLUMN permissions_error, "
               "DROP COLUMN permissions_synced_at, DROP COLUMN hidden_reason")
