"""kpool: replay and inspect traces of llama.cpp's k-pool indexer cache."""

__version__ = "0.1.0"
