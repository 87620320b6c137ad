"""Sources: local folder, Zotero, Google Drive, SharePoint; the interface is in ``sources.base``."""
