"""Python op classes for ETC's dialects."""
