"""The demo pipeline: see pipeline.py."""

from draslice.pipelines.demo import pipeline

__all__ = ["pipeline"]
