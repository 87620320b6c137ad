"""``<name>_permission_sync`` and the sensor that requests it every ``permission_interval_s`` seconds."""

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from rag_pipeline.defs.permissions.assets import permissions_key
from rag_pipeline.defs.sources.config import SourceSpec
from rag_pipeline.defs.sources.sensors import IN_FLIGHT, SOURCE_TAG


def build_permission_job(spec: SourceSpec) -> UnresolvedAssetJobDefinition:
    """``<name>_permission_sync``: materialize ``<name>/source_permissions``."""
    return dg.define_asset_job(f"{spec.name}_permission_sync", selection=dg.AssetSelection.assets(
        permissions_key(spec.name)), executor_def=dg.in_process_executor, tags={SOURCE_TAG: spec.name},
        description=f"Permission sync of {spec.name!r} (no content is fetched).")


def build_permission_sensor(spec: SourceSpec, job: UnresolvedAssetJobDefinition) -> dg.SensorDefinition:
    """``<name>_permission_sensor`` (running by default): one ``<name>_permission_sync`` run per tick, unless
    one is still queued or running."""

    @dg.sensor(name=f"{spec.name}_permission_sensor", job=job, minimum_interval_seconds=spec.permission_interval_s,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description=f"Requests the permission sync of {spec.name!r} every {spec.permission_interval_s} s.")
    def permission_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        runs = context.instance.get_runs(filters=dg.RunsFilter(job_name=job.name, statuses=IN_FLIGHT), limit=1)
        if runs:
            return dg.SensorResult(skip_reason="a permission sync of this source is still in flight")
        return dg.SensorResult(run_requests=[dg.RunRequest()])

    return permission_sensor
