"""Names on disk that several layers agree on: video file extensions and the prepared-dataset marker.
"""

from __future__ import annotations

VIDEO_EXTENSIONS = {".mp4", ".mkv", ".mov", ".webm", ".avi", ".m4v", ".mpg", ".mpeg", ".ts"}


PREPARED_MARKER = "dataset.json"  # written last by scripts/prepare_dataset.py, beside its index.jsonl
