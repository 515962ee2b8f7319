"""Retrieval: embedding a corpus into a vector folder, and everything that reads one (exact, approximate,
sparse and hybrid search, chunks, maps, hard-negative mining). Above `bertforge.inference` (pipelines embed
the texts), below `bertforge.serving`."""
