"""Finding codes and the detectors that raise them."""
