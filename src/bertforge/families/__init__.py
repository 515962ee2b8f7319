"""Task families: one module per family, each owning its whole slice (see `families.base`), and the registry."""
