"""Robot descriptions used by bcg (data only: MJCF files and constants)."""
