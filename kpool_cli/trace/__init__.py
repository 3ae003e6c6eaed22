"""The trace format v1: model, loader (located errors), writer and JSON Schemas."""
