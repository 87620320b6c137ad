"""Local fake API servers (127.0.0.1) speaking the Zotero, Drive v3 and Graph protocols."""
