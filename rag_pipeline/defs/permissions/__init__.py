"""Per-source permission sync: ``<name>/source_permissions`` (with its ``permissions_readable`` check), the
``<name>_permission_sync`` job and the ``<name>_permission_sensor`` that runs it every
``permission_interval_s`` seconds (default 300), more often than content changes are synced."""
