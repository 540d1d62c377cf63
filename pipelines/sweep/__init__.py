"""The sweep pipeline: see pipeline.py."""

from draslice.pipelines.sweep import pipeline

__all__ = ["pipeline"]
