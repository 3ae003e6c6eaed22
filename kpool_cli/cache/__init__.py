"""The indexer cache model: cells and streams, batch validation and split, find_slot."""
