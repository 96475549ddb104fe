"""kvcheck.conformance."""
