"""kvcheck.bench."""
