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
        "A resume of a recorded run may change only the keys marked in the column *resume may change*",
        "([resume](howto/resume.md#what-a-resume-may-change)); any other change is refused.",
        "",
        "| key | type | default | resume may change | meaning |",
        "|---|---|---|---|---|",
    ]
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        resume = "yes" if f.metadata["resume_may_change"] else ""
        lines.append(f"| `{f.name}` | {FIELD_TYPES[f.name].__name__} | `{getattr(defaults, f.name)!r}` | {resume} | "
                     f"{f.metadata['help']} |")
    from training.config.legacy import legacy_markdown

    return "\n".join(lines + legacy_markdown()) + "\n"
