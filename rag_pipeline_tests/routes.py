"""The two callers of the per-document core behind one callable, so the invariant and crash tests run on both.

A *route* is ``route(source, store, embedder, settings, *, full=False, allow_mass_delete=False,
notifier=None) -> RouteResult``: one pass of a caller over one source.

* ``cli_route``: ``rag_pipeline.pipeline.sync.sync_source``, what ``rag-pipeline sync`` and the daily
  reconciliation run (one process, one source lock, batches of documents).
* ``DagsterRoute``: what production runs under Dagster, in-process: the diff sensor's plan
  (``pipeline.inventory.list_and_diff``, with the change-feed cursor the sensor keeps between ticks), one
  ``ingest_documents``-style run per planned document (the three assets ``document_markdown`` ->
  ``document_chunks`` -> ``document_embeddings`` on the document's ``documents`` partition, the listing
  passed as run config exactly as the sensor passes it), then, when documents vanished, the guard failed
  or the operator overrides it, the source's ``<name>/source_inventory`` (+ ``deletion_guard`` check)
  and, only when the guard passed, ``<name>/purge_deleted_documents`` in the same run (the sensor's
  selection). Failed runs are normal outcomes (the steps record failures themselves); a run that failed
  for any other reason raises ``RouteError`` (as an exception escaping ``sync_source`` would).
  ``allow_mass_delete`` is the operator's override: the inventory materialized with
  ``allow_mass_delete: true``.

``route.sync_permissions(source, store, embedder, settings)`` runs the permission sync alone on either
route (the core function; the ``<name>/source_permissions`` asset its sensor requests).

Both routes are judged on the same truth, read back from PostgreSQL: the ``ingest_log`` rows the call
wrote (``RouteResult.rows``; ``actions``/``deleted``/``failed``/``embedded`` derive from them). The deletion
guard's verdict comes from the caller's own record (``SyncReport.guard``; the ``deletion_guard`` check
evaluation of the inventory run, or the plan's verdict when no inventory ran) and the exit code keeps
``SyncReport.exit_code``'s meaning (0 ok, 1 document failures, 2 listing incomplete or guard tripped).

Where the Dagster route differs from a deployment, on purpose: the plan counts each document's chunk rows
(``list_and_diff``'s default, as the inventory asset and ``sync_source`` do; the sensor itself passes
``count_rows=False`` and trusts ``documents.chunk_count``, so on a deployment rows deleted behind the
pipeline's back are found by the daily reconciliation, not by the sensor); every planned run is executed
(no run-key de-duplication, no in-flight limit); ``document_failure_sensor`` is not evaluated (the steps
record their own failures; a run whose process was killed is only marked failed, ``reap_interrupted``).

Resources of the Dagster route are the production resource classes with one method overridden to hand
back the objects given to the call (``_Bound``, looked up in a module-level registry by a token), so a
test's in-memory source, counting embedder, own ``Settings`` and recording notifier reach the assets
unchanged; everything past resource construction (assets, checks, staging, steps) is production code.
Sources get a Dagster name derived from ``source.name`` (``spec_name``); rows keep ``source.name``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import dagster as dg

from rag_pipeline.config import Settings
from rag_pipeline.defs.documents.assets import (
    document_chunks,
    document_embeddings,
    document_markdown,
)
from rag_pipeline.defs.documents.partitions import document_partition_key, documents
from rag_pipeline.defs.ingestion.resources import (
    EmbedderResource,
    NotifierResource,
    SettingsResource,
    SourceResource,
    SourcesResource,
    StoreResource,
)
from rag_pipeline.defs.permissions.assets import build_permission_assets, permissions_key
from rag_pipeline.defs.sources.assets import (
    build_source_assets,
    inventory_key,
    purge_key,
)
from rag_pipeline.defs.sources.config import SourceSpec
from rag_pipeline.embedding.base import Embedder
from rag_pipeline.store.generations import ensure_for
from rag_pipeline.permissions import sync_permissions
from rag_pipeline.pipeline.inventory import cursor_after, list_and_diff
from rag_pipeline.pipeline.plan import Decision, GuardResult, PlannedDocument
from rag_pipeline.pipeline.steps import Notifier
from rag_pipeline.pipeline.sync import (
    EXIT_DOCUMENT_FAILURES,
    EXIT_GUARD,
    EXIT_OK,
    SyncReport,
    sync_source,
)
from rag_pipeline.sources.base import Source
from rag_pipeline.store.db import Store
from rag_pipeline.store.staging import document_to_json

ROUTES = ("cli", "dagster")
"""The route names tests parametrize over."""

DOCUMENT_ASSETS = [document_markdown, document_chunks, document_embeddings]


class RouteError(RuntimeError):
    """A Dagster run failed for another reason than a document failure its steps recorded (a bug, a
    database error): what would escape ``sync_source`` as an exception."""


@dataclass(frozen=True)
class LoggedOutcome:
    """One ``ingest_log`` row written by the call (plain SQL, not the code under test's own report)."""

    run_id: str
    source_id: str
    action: str
    status: str | None
    reason: str | None
    version: int | None
    chunk_count: int | None
    embedded: int

    @property
    def reused(self) -> int:
        """Chunk vectors taken from the embedding cache (chunk rows written minus texts embedded now)."""
        return (self.chunk_count or 0) - self.embedded


@dataclass
class RouteResult:
    """What one route call did to one source.

    ``rows``: every ``ingest_log`` row the call wrote, in order; ``guard``: the deletion guard's verdict;
    ``mode``: ``full`` | ``full+verify`` | ``changes``; ``listing_error``: why the source could not be
    listed; ``report``: the ``SyncReport`` (CLI route only); ``runs``: ``(what, partition key or None,
    success)`` per Dagster run (Dagster route only)."""

    route: str
    source: str
    rows: list[LoggedOutcome]
    guard: GuardResult
    mode: str
    listing_error: str | None = None
    report: SyncReport | None = None
    runs: list[tuple[str, str | None, bool]] = field(default_factory=list)

    @property
    def outcomes(self) -> dict[str, LoggedOutcome]:
        """The last logged row per source id."""
        return {r.source_id: r for r in self.rows}

    @property
    def actions(self) -> dict[str, str]:
        """``{source_id: last action logged}`` (documents the call left alone are absent)."""
        return {sid: r.action for sid, r in self.outcomes.items()}

    @property
    def deleted(self) -> list[str]:
        """Source ids tombstoned by the call, sorted."""
        return sorted(sid for sid, r in self.outcomes.items() if r.action == "deleted")

    @property
    def failed(self) -> list[str]:
        """Source ids whose last logged attempt in the call failed, sorted."""
        return sorted(sid for sid, r in self.outcomes.items() if r.action == "failed")

    @property
    def embedded(self) -> int:
        """Chunk texts sent to the model by the call (sum of ``ingest_log.embedded_count``)."""
        return sum(r.embedded for r in self.rows)

    @property
    def exit_code(self) -> int:
        """``SyncReport.exit_code``'s meaning: 0 all well; 1 documents failed; 2 listing incomplete or
        deletion guard tripped (the CLI route returns the report's own code)."""
        if self.report is not None:
            return self.report.exit_code
        if not self.guard.passed or self.listing_error:
            return EXIT_GUARD
        return EXIT_DOCUMENT_FAILURES if self.failed else EXIT_OK


class Route(Protocol):
    """The callable every route implements."""

    name: str

    def __call__(self, source: Source, store: Store, embedder: Embedder, settings: Settings, *,
                 full: bool = False, allow_mass_delete: bool = False,
                 notifier: Notifier | None = None) -> RouteResult: ...


def _watermark(store: Store) -> int:
    with store.connection() as conn:
        return int(conn.execute("SELECT COALESCE(max(id), 0) FROM ingest_log").fetchone()[0])


def logged_since(store: Store, source: str, watermark: int) -> list[LoggedOutcome]:
    """``ingest_log`` rows of ``source`` written after row id ``watermark``, oldest first."""
    with store.connection() as conn:
        rows = conn.execute(
            "SELECT run_id, source_id, action, status, reason, version, chunk_count, COALESCE(embedded_count, 0) "
            "FROM ingest_log WHERE source = %s AND id > %s ORDER BY id", (source, watermark)).fetchall()
    return [LoggedOutcome(*r) for r in rows]


# --- the CLI route ----------------------------------------------------------------------------------


class CliRoute:
    """``sync_source`` (see module docstring); the rows are those of its ``sync:<run id>``."""

    name = "cli"

    def __call__(self, source: Source, store: Store, embedder: Embedder, settings: Settings, *,
                 full: bool = False, allow_mass_delete: bool = False,
                 notifier: Notifier | None = None) -> RouteResult:
        mark = _watermark(store)
        report = sync_source(source, store, embedder, settings, full=full, allow_mass_delete=allow_mass_delete,
                             notifier=notifier)
        rows = logged_since(store, source.name, mark)
        stray = {r.run_id for r in rows} - {f"sync:{report.run_id}"}
        assert not stray, f"ingest_log rows of other runs during sync run {report.run_id}: {stray}"
        return RouteResult("cli", source.name, rows, report.guard, report.mode, report.listing_error, report)

    def sync_permissions(self, source: Source, store: Store, embedder: Embedder, settings: Settings) -> dict:
        """The permission sync alone (``permissions.sync_permissions``, which every CLI sync also runs):
        ``PermissionReport.summary()`` plus ``check_passed`` (no unreadable document or group)."""
        with store.connection() as conn:
            report = sync_permissions(source, conn, settings)
        return {**report.summary(), "check_passed": not report.unreadable and not report.group_errors}

    def close(self) -> None:
        """Nothing to release."""


cli_route = CliRoute()


# --- the Dagster partition route ----------------------------------------------------------------------


@dataclass
class _Bound:
    """The objects one Dagster route call hands to the resources."""

    spec_name: str
    source: Source
    store: Store
    embedder: Embedder
    settings: Settings
    notifier: Notifier


_REGISTRY: dict[str, _Bound] = {}
_REGISTRY_LOCK = threading.Lock()


def _bound(token: str) -> _Bound:
    with _REGISTRY_LOCK:
        return _REGISTRY[token]


class BoundSettings(SettingsResource):
    """``SettingsResource`` returning the call's ``Settings`` object."""

    token: str

    def settings(self) -> Settings:
        return _bound(self.token).settings


class BoundStore(StoreResource):
    """``StoreResource`` returning the call's ``Store`` (already migrated by the test fixtures)."""

    token: str

    def open(self, settings: Settings, embedder: Embedder) -> Store:
        return _bound(self.token).store


class BoundEmbedder(EmbedderResource):
    """``EmbedderResource`` returning the call's embedder (e.g. a counting wrapper of the real model)."""

    token: str

    def get(self, settings: Settings) -> Embedder:
        return _bound(self.token).embedder


class BoundSources(SourcesResource):
    """``SourcesResource`` knowing one source: the call's object under its Dagster name."""

    token: str

    def names(self) -> list[str]:
        return [_bound(self.token).spec_name]

    def build(self, name: str) -> Source:
        b = _bound(self.token)
        if name != b.spec_name:
            raise KeyError(f"no source named {name!r} is configured (known: {b.spec_name})")
        return b.source


class BoundNotifier(NotifierResource):
    """``NotifierResource`` returning the call's notifier (the log notifier when the call gave none)."""

    token: str

    def get(self) -> Notifier:
        return _bound(self.token).notifier


def spec_name(source: Source) -> str:
    """The Dagster name (``SOURCE_NAME_RE``) of ``source``: ``s_`` + 12 hex digits of its name's SHA-1."""
    return "s_" + hashlib.sha1(source.name.encode()).hexdigest()[:12]


def _guard_from_check(evaluation: dg.AssetCheckEvaluation, settings: Settings) -> GuardResult:
    meta = {k: v.value for k, v in evaluation.metadata.items()}
    return GuardResult(bool(evaluation.passed), evaluation.description, bool(meta.get("complete", True)),
                       int(meta.get("listed", 0)), int(meta.get("indexed", 0)), int(meta.get("to_delete", 0)),
                       float(meta.get("max_fraction", settings.deletion_max_fraction)))


def _run_errors(result: dg.ExecuteInProcessResult) -> list[str]:
    """Step failures that are not a document failure recorded by the steps (``dg.Failure`` with
    ``failed_partitions``) nor a failed blocking check."""
    errors = []
    for event in result.all_events:
        if not event.is_step_failure:
            continue
        data = event.step_failure_data
        user = data.user_failure_data if data else None
        if user is not None and "failed_partitions" in user.metadata:
            continue
        if data and data.error and data.error.cls_name == "DagsterAssetCheckFailedError":
            continue  # a blocking check failed: its evaluation says why
        message = data.error.message if data and data.error else event.message or ""
        errors.append(f"{event.step_key}: {message.strip()[:2000]}")
    return errors


class DagsterRoute:
    """The Dagster partition route (module docstring) on ``instance`` (one per test: partitions, runs
    and the sensor's cursors persist between calls as they do on a deployment). ``reap_interrupted``
    marks runs a killed process left ``STARTED`` as failed (what Dagster's run monitoring does), so the
    instance tells the truth before the next call."""

    name = "dagster"

    def __init__(self, instance: dg.DagsterInstance) -> None:
        self.instance = instance
        self.cursors: dict[str, str | None] = {}
        """Per Dagster source name: the change-feed cursor the sensor keeps (``feed`` of its cursor)."""

    @contextlib.contextmanager
    def _bind(self, source: Source, store: Store, embedder: Embedder, settings: Settings,
              notifier: Notifier | None) -> Iterator[tuple[str, dict[str, object]]]:
        from rag_pipeline.notify import build_notifier

        token = uuid.uuid4().hex
        name = spec_name(source)
        with _REGISTRY_LOCK:
            _REGISTRY[token] = _Bound(name, source, store, embedder, settings,
                                      notifier if notifier is not None else build_notifier(retries=0))
        try:
            yield name, {"rag_settings": BoundSettings(token=token), "store": BoundStore(token=token),
                         "embedder": BoundEmbedder(token=token), "sources": BoundSources(token=token),
                         "notifier": BoundNotifier(token=token)}
        finally:
            with _REGISTRY_LOCK:
                del _REGISTRY[token]

    def _document_run(self, resources, name: str, planned: PlannedDocument) -> tuple[str, bool]:
        key = document_partition_key(name, planned.doc.source_id)
        if key not in self.instance.get_dynamic_partitions(documents.name):
            self.instance.add_dynamic_partitions(documents.name, [key])
        listing = json.dumps(document_to_json(planned.doc))
        result = dg.materialize(
            DOCUMENT_ASSETS, partition_key=key, instance=self.instance, resources=resources,
            run_config={"ops": {"document_markdown": {"config": {"listing": listing}}}},
            tags={"rag/source": name, "rag/decision": planned.decision.value}, raise_on_error=False)
        errors = _run_errors(result)
        if errors:
            raise RouteError(f"run {result.run_id} of {key} failed: " + "; ".join(errors))
        return key, result.success

    def __call__(self, source: Source, store: Store, embedder: Embedder, settings: Settings, *,
                 full: bool = False, allow_mass_delete: bool = False,
                 notifier: Notifier | None = None) -> RouteResult:
        mark = _watermark(store)
        with self._bind(source, store, embedder, settings, notifier) as (name, resources):
            cursor = None if full else self.cursors.get(name)
            with store.connection() as conn:
                # what the sensor's StoreResource.open does first: the configured model has its generation
                ensure_for(conn, embedder, settings)
                diff = list_and_diff(source, conn, settings, cursor=cursor, allow_mass_delete=allow_mass_delete)
            self.cursors[name] = cursor_after(diff, cursor)  # the sensor's own rule (source_diff_tick)
            runs: list[tuple[str, str | None, bool]] = []
            # The sensor requests retries after the other work (sensors._ordered).
            ordered = ([p for p in diff.work if p.decision != Decision.RETRY]
                       + [p for p in diff.work if p.decision == Decision.RETRY])
            for planned in ordered:
                key, ok = self._document_run(resources, name, planned)
                runs.append(("document", key, ok))
            guard = diff.guard
            if diff.vanished or not diff.guard.passed or allow_mass_delete:
                guard = self._inventory_run(resources, name, settings, purge=diff.guard.passed,
                                            allow_mass_delete=allow_mass_delete, runs=runs)
        rows = logged_since(store, source.name, mark)
        stray = {r.run_id for r in rows} - {f"dagster:{run_id}" for run_id in self._run_ids}
        assert not stray, f"ingest_log rows of runs this route did not start: {stray}"
        return RouteResult("dagster", source.name, rows, guard, diff.mode, diff.listing_error, runs=runs)

    def materialize_documents(self, source: Source, store: Store, embedder: Embedder, settings: Settings,
                              source_ids: Sequence[str], *, notifier: Notifier | None = None) -> RouteResult:
        """Materialize the partitions of ``source_ids`` without a listing (as from the UI or a backfill:
        the listing is rebuilt from the index); the same ``RouteResult`` as a call."""
        mark = _watermark(store)
        runs: list[tuple[str, str | None, bool]] = []
        with self._bind(source, store, embedder, settings, notifier) as (name, resources):
            for sid in source_ids:
                key = document_partition_key(name, sid)
                if key not in self.instance.get_dynamic_partitions(documents.name):
                    self.instance.add_dynamic_partitions(documents.name, [key])
                result = dg.materialize(DOCUMENT_ASSETS, partition_key=key, instance=self.instance,
                                        resources=resources, tags={"rag/source": name}, raise_on_error=False)
                errors = _run_errors(result)
                if errors:
                    raise RouteError(f"run {result.run_id} of {key} failed: " + "; ".join(errors))
                runs.append(("document", key, result.success))
        guard = GuardResult(True, None, True, 0, 0, 0, settings.deletion_max_fraction)
        return RouteResult("dagster", source.name, logged_since(store, source.name, mark), guard, "none", runs=runs)

    @property
    def _run_ids(self) -> set[str]:
        return {r.run_id for r in self.instance.get_runs()}

    def _inventory_run(self, resources, name: str, settings: Settings, *, purge: bool, allow_mass_delete: bool,
                       runs: list) -> GuardResult:
        spec = SourceSpec(name, SourceResource(kind="local", path="/nonexistent"))  # only its name is used
        assets = build_source_assets(spec)
        selection = [inventory_key(name)] + ([purge_key(name)] if purge else [])
        op = "__".join(inventory_key(name).path)
        result = dg.materialize(
            assets, selection=selection, instance=self.instance, resources=resources,
            run_config={"ops": {op: {"config": {"allow_mass_delete": allow_mass_delete}}}},
            tags={"rag/source": name, "rag/reason": "route"}, raise_on_error=False)
        errors = _run_errors(result)
        if errors:
            raise RouteError(f"inventory run {result.run_id} of {name} failed: " + "; ".join(errors))
        runs.append(("inventory+purge" if purge else "inventory", None, result.success))
        (check,) = [e for e in result.get_asset_check_evaluations() if e.check_name == "deletion_guard"]
        return _guard_from_check(check, settings)

    def sync_permissions(self, source: Source, store: Store, embedder: Embedder, settings: Settings) -> dict:
        """What ``<name>_permission_sensor`` requests: a run of ``<name>/source_permissions``; its metadata
        plus ``check_passed`` (the ``permissions_readable`` check). Raises ``RouteError`` if the run failed."""
        with self._bind(source, store, embedder, settings, None) as (name, resources):
            spec = SourceSpec(name, SourceResource(kind="local", path="/nonexistent"))  # only its name is used
            result = dg.materialize(build_permission_assets(spec), instance=self.instance, resources=resources,
                                    tags={"rag/source": name}, raise_on_error=False)
        errors = _run_errors(result)
        if errors or not result.success:
            raise RouteError(f"permission run {result.run_id} of {name} failed: " + "; ".join(errors))
        (m,) = result.asset_materializations_for_node("__".join(permissions_key(name).path))
        (check,) = result.get_asset_check_evaluations()
        return {**{k: v.value for k, v in m.metadata.items()}, "check_passed": bool(check.passed)}

    def reap_interrupted(self) -> int:
        """Mark every ``STARTED``/``STARTING`` run as failed (a killed process's run); return how many."""
        runs = self.instance.get_runs(filters=dg.RunsFilter(
            statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING]))
        for run in runs:
            self.instance.report_run_failed(run, message="the process running it was killed")
        return len(runs)

    def close(self) -> None:
        """Nothing to release (the instance belongs to the caller)."""


INSTANCE_OVERRIDES = {"compute_logs": {"module": "dagster._core.storage.noop_compute_log_manager",
                                     "class": "NoOpComputeLogManager"}}
"""Test instances keep no per-step log files (nothing reads them; ~10% of a document run's time)."""


@contextlib.contextmanager
def open_route(name: str, *, instance_dir: str | None = None) -> Iterator[CliRoute | DagsterRoute]:
    """The route called ``name`` (``ROUTES``); a Dagster route gets a SQLite instance in ``instance_dir``
    (kept, so several processes can share it one after another) or a throwaway one."""
    if name == "cli":
        yield cli_route
        return
    if name != "dagster":
        raise ValueError(f"unknown route {name!r}: {', '.join(ROUTES)}")
    if instance_dir is not None:
        os.makedirs(instance_dir, exist_ok=True)
        with dg.DagsterInstance.local_temp(tempdir=instance_dir, overrides=INSTANCE_OVERRIDES) as instance:
            yield DagsterRoute(instance)
        return
    with dg.instance_for_test(overrides=INSTANCE_OVERRIDES) as instance:
        yield DagsterRoute(instance)


__all__ = ["ROUTES", "CliRoute", "DagsterRoute", "LoggedOutcome", "Route", "RouteError", "RouteResult", "cli_route",
           "logged_since", "open_route", "spec_name"]
