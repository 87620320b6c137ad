-- Runs once, when the PostgreSQL volume is created: the index database next to Dagster's own.
CREATE DATABASE rag;
\connect rag
CREATE EXTENSION IF NOT EXISTS vector;
