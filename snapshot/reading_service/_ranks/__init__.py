"""Across ranks: ranks that end an epoch together (``even_batches``), sharing the rest when one runs out."""
