"""The trace format v1: its declaration (format), model, safe YAML (yaml_safe), loader
(load), writer (write) and JSON Schema (schema)."""
