"""Runtimes that execute compiled ETC programs."""
