"""Per-source assets: ``<name>/source_inventory`` (with the blocking ``deletion_guard`` check) and
``<name>/purge_deleted_documents`` downstream of it.

The inventory lists the whole source, diffs it against the index and, only when the deletion guard
passes, records the vanished documents as pending deletions; the purge step tombstones them and removes
their partitions. A failed guard (incomplete listing, empty listing, too large a fraction) fails the
check with the numbers, alerts, and blocks the purge: nothing is deleted.
"""

from typing import Optional

import dagster as dg

from rag_pipeline.defs.documents.assets import run_context
from rag_pipeline.defs.documents.partitions import document_partition_key, documents
from rag_pipeline.defs.ingestion.resources import (
    EmbedderResource,
    NotifierResource,
    SettingsResource,
    SourcesResource,
    StoreResource,
)
from rag_pipeline.defs.sources.config import SourceSpec
from rag_pipeline.pipeline import staged
from rag_pipeline.pipeline.inventory import take_inventory
from rag_pipeline.pipeline.plan import Decision, SourceDiff

GROUP = "sources"
KINDS = {"local": "file", "zotero": "zotero", "gdrive": "googledrive", "sharepoint": "sharepoint"}
_SHOWN = 20


class InventoryConfig(dg.Config):
    """``allow_mass_delete``: the explicit, logged override of the deletion fraction (never of an incomplete
    or empty listing)."""

    allow_mass_delete: bool = False
    confirm_delete: Optional[int] = None
    """The exact number of deletions expected (lifts the fraction and the empty-listing rule when it matches)."""


def inventory_key(name: str) -> dg.AssetKey:
    """Asset key of source ``name``'s inventory."""
    return dg.AssetKey([name, "source_inventory"])


def purge_key(name: str) -> dg.AssetKey:
    """Asset key of source ``name``'s purge step."""
    return dg.AssetKey([name, "purge_deleted_documents"])


def _ids_md(ids: list[str]) -> dg.MetadataValue:
    shown = "\n".join(f"- `{i}`" for i in ids[:_SHOWN])
    more = f"\n- ... and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else ""
    return dg.MetadataValue.md(shown + more if ids else "_none_")


def inventory_metadata(diff: SourceDiff) -> dict[str, object]:
    """The inventory's metadata: count, completeness, the diff against the index, the guard's numbers."""
    return {
        "listed": diff.listed, "complete": diff.complete, "incomplete_reason": diff.incomplete_reason or "",
        "indexed": diff.indexed, **diff.summary(),
        "guard_passed": diff.guard.passed, "guard_reason": diff.guard.reason or "",
        "added_documents": _ids_md([p.doc.source_id for p in diff.work if p.decision == Decision.ADD]),
        "changed_documents": _ids_md([p.doc.source_id for p in diff.work
                                      if p.decision in (Decision.CHANGE, Decision.METADATA)]),
        "deleted_documents": _ids_md([i.source_id for i in diff.vanished]),
    }


def guard_result(diff: SourceDiff) -> dg.AssetCheckResult:
    """The ``deletion_guard`` check result, with the numbers it judged."""
    g = diff.guard
    return dg.AssetCheckResult(
        check_name="deletion_guard", passed=g.passed, description=g.reason,
        metadata={"complete": g.complete, "listed": g.listed, "indexed": g.indexed, "to_delete": g.to_delete,
                  "fraction": round(g.to_delete / g.indexed, 4) if g.indexed else 0.0,
                  "max_fraction": g.max_fraction})


def build_source_assets(spec: SourceSpec) -> list[dg.AssetsDefinition]:
    """The inventory (with its ``deletion_guard`` check) and purge assets of one configured source."""
    inv_key = inventory_key(spec.name)
    kind = KINDS.get(spec.kind, spec.kind)

    @dg.asset(key=inv_key, group_name=GROUP, kinds={kind, "postgres"},
              description=f"The complete listing of source {spec.name!r} and its diff against the index.",
              check_specs=[dg.AssetCheckSpec(
                  "deletion_guard", asset=inv_key, blocking=True,
                  description="Deletions only from a complete, non-empty listing that removes at most the "
                              "allowed fraction of the source's documents.")])
    def source_inventory(context: dg.AssetExecutionContext, config: InventoryConfig, rag_settings: SettingsResource,
                         store: StoreResource, embedder: EmbedderResource, sources: SourcesResource,
                         notifier: NotifierResource) -> dg.MaterializeResult:
        settings = rag_settings.settings()
        source = sources.build(spec.name)
        if config.allow_mass_delete or config.confirm_delete is not None:
            context.log.warning(f"{source.name}: mass-delete override requested for this inventory")
        emb = embedder.get(settings)
        with store.open(settings, emb).connection() as conn:
            diff = take_inventory(source, conn, settings, allow_mass_delete=config.allow_mass_delete,
                                  confirm_delete=config.confirm_delete)
        if not diff.guard.passed:
            g = diff.guard
            notifier.get().notify("deletion_guard", f"{source.name}: deletion guard tripped: {g.reason}",
                                  {"source": source.name, "listed": g.listed, "indexed": g.indexed,
                                   "to_delete": g.to_delete, "complete": g.complete})
        return dg.MaterializeResult(metadata=inventory_metadata(diff), check_results=[guard_result(diff)])

    @dg.asset(key=purge_key(spec.name), deps=[inv_key], group_name=GROUP, kinds={"postgres"},
              description=f"Tombstones documents gone from {spec.name!r} (guarded) and removes their partitions.")
    def purge_deleted_documents(context: dg.AssetExecutionContext, rag_settings: SettingsResource,
                                store: StoreResource, embedder: EmbedderResource,
                                sources: SourcesResource) -> dg.MaterializeResult:
        settings = rag_settings.settings()
        source = sources.build(spec.name)
        with store.open(settings, embedder.get(settings)).connection() as conn:
            purged = [o.source_id for o in staged.purge_deletions(run_context(context, conn, source.name, settings))]
        existing = set(context.instance.get_dynamic_partitions(documents.name))
        keys = [k for k in (document_partition_key(spec.name, sid) for sid in purged) if k in existing]
        for key in keys:
            context.instance.delete_dynamic_partition(documents.name, key)
        return dg.MaterializeResult(metadata={"deleted": len(purged), "partitions_removed": len(keys),
                                              "documents": _ids_md(purged)})

    return [source_inventory, purge_deleted_documents]
