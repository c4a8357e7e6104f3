"""Bytes in and out: paths, fsspec, atomic writes, directories and object stores, rotation, background saves."""
