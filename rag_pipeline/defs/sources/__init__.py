"""Per-source definitions: inventory, deletion guard, purge, diff sensor, daily reconciliation."""
