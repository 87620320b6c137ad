"""``<name>/source_permissions``: who may read each of the source's documents, read from the source apart
from content (``rag_pipeline.permissions.sync.sync_permissions``: nothing is fetched or embedded).

Its ``permissions_readable`` check (WARN) fails while any document's permissions or any group's members
could not be read: those documents are readable by nobody and those groups grant nothing (fail closed),
so the check says why people may be missing answers, not that anything leaked.
"""

import dagster as dg

from rag_pipeline.defs.ingestion.resources import EmbedderResource, SettingsResource, SourcesResource, StoreResource
from rag_pipeline.defs.sources.config import SourceSpec
from rag_pipeline.permissions.sync import PermissionReport, sync_permissions

GROUP = "permissions"
_SHOWN = 20


def permissions_key(name: str) -> dg.AssetKey:
    """Asset key of source ``name``'s permission sync."""
    return dg.AssetKey([name, "source_permissions"])


def _md(items: dict[str, str]) -> dg.MetadataValue:
    lines = [f"- `{k}`: {v}" for k, v in sorted(items.items())[:_SHOWN]]
    if len(items) > _SHOWN:
        lines.append(f"- ... and {len(items) - _SHOWN} more")
    return dg.MetadataValue.md("\n".join(lines) or "_none_")


def readable_check(key: dg.AssetKey, report: PermissionReport) -> dg.AssetCheckResult:
    """The ``permissions_readable`` result of ``report``."""
    bad = len(report.unreadable) + len(report.group_errors)
    return dg.AssetCheckResult(
        asset_key=key, check_name="permissions_readable", passed=bad == 0, severity=dg.AssetCheckSeverity.WARN,
        description=None if bad == 0 else (f"{len(report.unreadable)} document(s) readable by nobody and "
                                           f"{len(report.group_errors)} group(s) granting nothing: could not be read"),
        metadata={"unreadable_documents": _md(report.unreadable), "unreadable_groups": _md(report.group_errors)})


def build_permission_assets(spec: SourceSpec) -> list[dg.AssetsDefinition]:
    """The permission-sync asset of one configured source."""
    key = permissions_key(spec.name)

    @dg.asset(key=key, group_name=GROUP, kinds={"postgres"},
              description=f"Who may read each document of {spec.name!r}, from the source's own permission data.",
              check_specs=[dg.AssetCheckSpec("permissions_readable", asset=key,
                                             description="Every document's permissions and every group's "
                                                         "members could be read.")])
    def source_permissions(rag_settings: SettingsResource, store: StoreResource, embedder: EmbedderResource,
                           sources: SourcesResource) -> dg.MaterializeResult:
        settings = rag_settings.settings()
        with store.open(settings, embedder.get(settings)).connection() as conn:
            report = sync_permissions(sources.build(spec.name), conn, settings)
        return dg.MaterializeResult(metadata={**report.summary(), "duration_s": round(report.duration_s, 3)},
                                    check_results=[readable_check(key, report)])

    return [source_permissions]
