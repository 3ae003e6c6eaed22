"""The k-pool engine: layout, marking, scatter plan, and engine versions."""
