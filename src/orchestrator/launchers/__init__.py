"""Launchers start one runner execution on some compute and report on it; one module per kind of compute."""
