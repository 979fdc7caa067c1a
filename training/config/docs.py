"""The configuration table of docs/configuration.md, generated from TrainConfig.
"""

from __future__ import annotations

import dataclasses

from training.config.schema import FIELD_TYPES, TrainConfig


def configuration_markdown() -> str:
    """docs/configuration.md, generated from the base so it cannot drift."""
    lines = [
        "# Configuration keys",
        "",
        "Generated from `training/config/schema.py` by `python -m training.plan --markdown > docs/configuration.md`;",
        "a test fails when this file is out of date. Profiles in `training/configs/` state only what differs.",
        "Set any key at launch with `--set key=value` (repeatable).",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        lines.append(f"| `{f.name}` | {FIELD_TYPES[f.name].__name__} | `{getattr(defaults, f.name)!r}` | {f.metadata['help']} |")
    from training.config.legacy import legacy_markdown

    return "\n".join(lines + legacy_markdown()) + "\n"
