"""The canary pipeline: see pipeline.py."""

from draslice.pipelines.canary import pipeline

__all__ = ["pipeline"]
