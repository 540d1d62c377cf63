"""Cluster side: what preflight checks before a slice is claimed, and what an admin installs."""
