"""Index-wide checks on ``document_embeddings`` (the SQL lives in ``rag_pipeline.store.checks``).

``chunk_count_complete`` (per partition, blocking) is emitted by the asset itself; the checks here look
at the whole index and run in ``index_checks_job`` (hourly schedule, or "Execute checks" in the UI).
"""

import dagster as dg

from rag_pipeline.defs.documents.assets import document_embeddings
from rag_pipeline.defs.ingestion.resources import EmbedderResource, SettingsResource, StoreResource
from rag_pipeline.store import checks as check_sql


@dg.asset_check(asset=document_embeddings, description="No document has chunk rows of two versions.")
def index_versions_unique(rag_settings: SettingsResource, store: StoreResource,
                          embedder: EmbedderResource) -> dg.AssetCheckResult:
    """Fails with examples when any document holds chunks of more than one version."""
    settings = rag_settings.settings()
    with store.open(settings, embedder.get(settings)).connection() as conn:
        found = check_sql.mixed_versions(conn)
    return dg.AssetCheckResult(
        passed=found.passed,
        metadata={"documents_with_mixed_versions": found.count,
                  "examples": dg.MetadataValue.json([{"source": s, "source_id": i, "versions": v}
                                                     for s, i, v in found.examples])})


@dg.asset_check(asset=document_embeddings, description="Lists documents given up on, with reasons (warning).")
def no_permanently_failed_documents(rag_settings: SettingsResource, store: StoreResource,
                                    embedder: EmbedderResource) -> dg.AssetCheckResult:
    """Warns when documents are ``permanently_failed``; metadata lists them with their reasons."""
    settings = rag_settings.settings()
    with store.open(settings, embedder.get(settings)).connection() as conn:
        found = check_sql.permanently_failed(conn)
    table = "\n".join(f"| {d.source} | {d.source_id} | {(d.reason or '').replace('|', '/')} | {d.failure_count} |"
                      for d in found.documents)
    return dg.AssetCheckResult(
        passed=found.passed, severity=dg.AssetCheckSeverity.WARN,
        metadata={"permanently_failed": found.count,
                  "documents": dg.MetadataValue.md(
                      "| source | document | reason | failures |\n|---|---|---|---|\n" + table if table else "none")})


@dg.asset_check(asset=document_embeddings,
                description="The configured model's embedding generation is active and complete; while a new "
                            "model rolls out, its progress (warning).")
def embedding_generation_progress(rag_settings: SettingsResource, store: StoreResource,
                                  embedder: EmbedderResource) -> dg.AssetCheckResult:
    """Warns while the configured model's generation is not the active one (a rollout: documents and chunks
    embedded vs current, per kept generation in the metadata; fill it with the ``reembed`` job)."""
    settings = rag_settings.settings()
    emb = embedder.get(settings)
    with store.open(settings, emb).connection() as conn:
        found = check_sql.generation_status(conn, emb.model_id)
    rollout = found.rollout
    return dg.AssetCheckResult(
        passed=found.passed, severity=dg.AssetCheckSeverity.WARN,
        metadata={"model": emb.model_id,
                  "active_generation": found.active[0].id if found.active else None,
                  "rollout_documents": f"{rollout[1].documents_done} / {rollout[1].documents}" if rollout else "",
                  "rollout_chunks": f"{rollout[1].chunks_done} / {rollout[1].chunks}" if rollout else "",
                  "generations": dg.MetadataValue.json([
                      {"id": g.id, "model": g.model, "dimension": g.dimension, "storage": g.storage, "state": g.state,
                       "documents": p.documents, "documents_done": p.documents_done, "chunks": p.chunks,
                       "chunks_done": p.chunks_done} for g, p in found.generations])})


INDEX_CHECKS = [index_versions_unique, no_permanently_failed_documents, embedding_generation_progress]
