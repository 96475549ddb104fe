"""kvcheck.results."""
