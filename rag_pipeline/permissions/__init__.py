"""Who may read what: principals, group expansion, the permission sync and the re-check of query hits.

* ``principals``: the principal strings (``user:…``, ``group:<source>:<id>``, ``domain:…``, ``everyone``);
* ``groups``: a source's groups closed transitively into ``group_members``; ``expand`` a caller;
* ``sync``: ``sync_permissions`` reads each document's scope from its source (fail closed) apart from content;
* ``recheck``: ``recheck_hits`` asks the source again, right before hits are returned;
* ``visibility``: documents the deletion guard holds back, hidden or kept by the source's policy.
"""

from rag_pipeline.permissions.groups import expand
from rag_pipeline.permissions.principals import EVERYONE, parse_principal
from rag_pipeline.permissions.recheck import recheck_hits
from rag_pipeline.permissions.sync import PermissionReport, apply_scopes, sync_permissions

__all__ = ["EVERYONE", "PermissionReport", "apply_scopes", "expand", "parse_principal", "recheck_hits",
           "sync_permissions"]
