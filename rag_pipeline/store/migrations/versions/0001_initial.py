"""Initial schema: documents, chunks (pgvector + HNSW), document_markdown, logs, runs, cursors.

The embedding dimension comes from the configured model and is fixed at creation time
(``context.config.attributes["embedding_dimension"]``); it is recorded in ``index_settings``.

Revision ID: 0001
Revises:
"""

from alembic import context, op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    dim = int(context.config.attributes["embedding_dimension"])
    model = str(context.config.attributes["embedding_model"])
    # the column and its index go in 0005 (vectors per embedding generation); a larger dimension is checked
    # there (``store.generations.storage_for``), and ``vector`` holds up to 16,000 until then
    if not 0 < dim <= 16000:
        raise ValueError(f"embedding dimension {dim} cannot be stored by pgvector")
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.execute(
        """
        CREATE TABLE index_settings (
            key   text PRIMARY KEY,
            value text NOT NULL
        )
        """
    )
    op.execute(
        "INSERT INTO index_settings (key, value) VALUES ('embedding_dimension', %s), ('embedding_model', %s)"
        % (dim, "'" + model.replace("'", "''") + "'")
    )
    op.execute(
        """
        CREATE TABLE documents (
            id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            source               text NOT NULL,
            source_id            text NOT NULL,
            parent_id            bigint REFERENCES documents(id) ON DELETE CASCADE,
            uri                  text,
            title                text,
            mime_type            text,
            doc_type             text,
            content_sha256       text,
            version              integer NOT NULL DEFAULT 0,
            source_version       text,
            modified_at          timestamptz,
            expires_at           timestamptz,
            seen_sha256          text,
            seen_source_version  text,
            status               text NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'completed', 'failed', 'permanently_failed', 'deleted')),
            failure_count        integer NOT NULL DEFAULT 0,
            last_error           text,
            expected_chunk_count integer,
            chunk_count          integer NOT NULL DEFAULT 0,
            char_count           integer,
            page_count           integer,
            extraction_stats     jsonb NOT NULL DEFAULT '{}'::jsonb,
            metadata             jsonb NOT NULL DEFAULT '{}'::jsonb,
            ingested_at          timestamptz,
            ready_at             timestamptz,
            deleted_at           timestamptz,
            last_seen_at         timestamptz,
            created_at           timestamptz NOT NULL DEFAULT now(),
            updated_at           timestamptz NOT NULL DEFAULT now(),
            UNIQUE (source, source_id)
        )
        """
    )
    op.execute("CREATE INDEX documents_source_status ON documents (source, status)")
    op.execute("CREATE INDEX documents_content_sha256 ON documents (content_sha256)")
    op.execute(
        """
        CREATE TABLE document_markdown (
            document_id    bigint PRIMARY KEY REFERENCES documents(id) ON DELETE CASCADE,
            version        integer NOT NULL,
            content_sha256 text NOT NULL,
            markdown       text NOT NULL,
            created_at     timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute("CREATE INDEX document_markdown_sha ON document_markdown (content_sha256)")
    op.execute(
        f"""
        CREATE TABLE chunks (
            id              text PRIMARY KEY,
            document_id     bigint NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
            version         integer NOT NULL,
            ordinal         integer NOT NULL,
            text            text NOT NULL,
            text_sha256     text NOT NULL,
            embedding       vector({dim}) NOT NULL,
            embedding_model text NOT NULL,
            token_count     integer NOT NULL,
            pages           integer[] NOT NULL DEFAULT '{{}}',
            heading_path    text[] NOT NULL DEFAULT '{{}}',
            metadata        jsonb NOT NULL DEFAULT '{{}}'::jsonb,
            created_at      timestamptz NOT NULL DEFAULT now(),
            UNIQUE (document_id, version, ordinal)
        )
        """
    )
    if dim <= 2000:
        op.execute("CREATE INDEX chunks_embedding_hnsw ON chunks USING hnsw (embedding vector_cosine_ops)")
    op.execute("CREATE INDEX chunks_model_text ON chunks (embedding_model, text_sha256)")
    op.execute(
        """
        CREATE TABLE sync_runs (
            id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            source        text NOT NULL,
            mode          text NOT NULL,
            started_at    timestamptz NOT NULL DEFAULT now(),
            finished_at   timestamptz,
            status        text NOT NULL DEFAULT 'running',
            listed        integer,
            guard_passed  boolean,
            guard_reason  text,
            counts        jsonb NOT NULL DEFAULT '{}'::jsonb
        )
        """
    )
    op.execute(
        """
        CREATE TABLE ingest_log (
            id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            run_id         bigint,
            document_id    bigint,
            source         text NOT NULL,
            source_id      text NOT NULL,
            version        integer,
            action         text NOT NULL
                CHECK (action IN ('added', 'updated', 'skipped-unchanged', 'metadata-updated',
                                  'repaired', 'failed', 'deleted', 're-embedded')),
            status         text,
            reason         text,
            char_count     integer,
            chunk_count    integer,
            embedded_count integer,
            duration_ms    integer,
            created_at     timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute("CREATE INDEX ingest_log_document ON ingest_log (source, source_id)")
    op.execute(
        """
        CREATE TABLE retrieval_log (
            id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            query           text NOT NULL,
            k               integer NOT NULL,
            embedding_model text NOT NULL,
            chunk_ids       text[] NOT NULL,
            scores          double precision[] NOT NULL,
            document_ids    bigint[] NOT NULL,
            versions        integer[] NOT NULL,
            document_ages_s double precision[] NOT NULL,
            duration_ms     integer,
            created_at      timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE source_cursors (
            source     text PRIMARY KEY,
            cursor     text NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )


def downgrade() -> None:
    for table in ("source_cursors", "retrieval_log", "ingest_log", "sync_runs", "chunks",
                  "document_markdown", "documents", "index_settings"):
        op.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
