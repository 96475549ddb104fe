"""kvcheck.plugin."""
