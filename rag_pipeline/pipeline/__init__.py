"""The per-document pipeline, plain Python (no Dagster): every caller's one route.

* ``plan``: pure decisions: one listed document against its index row, a listing's diff, the deletion guard;
* ``inventory``: listing or change feed + the index state read once -> a ``SourceDiff``;
* ``steps``: fetch/hash/extract -> chunk -> embed (cache first) -> the swap; attachments; failure
  recording (one policy, one counter, keyed by the run); deletions;
* ``locks``: the per-source and per-document locks every route takes;
* ``sync``: one sync of one source (the CLI and the daily reconciliation);
* ``operate``: the operator's actions and views: retry, retire a source, the dead-letter report, guard holds;
* ``outcome``: the one action vocabulary (``Action``) and outcome type (``DocumentOutcome``).
"""
