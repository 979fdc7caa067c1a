"""Write an old-style `args = EasyDict()` config as a profile module of this project.

    python scripts/convert_config.py old_config.py -o training/configs/my_run.py [--force]

The result holds `overrides = dict(...)`, one line per key with the old key (and why a value
changed) as a comment, and resolves with training.config.load_config to the same config as the
old file (training/config/legacy.py does the mapping). Without -o it is printed. An existing
output is kept unless --force; the file is written under a temporary name and renamed.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from training.config.legacy import convert_legacy_args, is_legacy_namespace  # noqa: E402
from training.config.schema import ConfigError  # noqa: E402


def profile_module_text(old_path: Path) -> tuple[str, list[str]]:
    """(module text, notes) for the old config file at old_path. Raises ConfigError with one line."""
    try:
        namespace = runpy.run_path(str(old_path), run_name="taehv_legacy_config")
    except Exception as error:
        raise ConfigError(f"config file {old_path} does not run: {type(error).__name__}: {error}") from error
    if not is_legacy_namespace(namespace):
        raise ConfigError(f"{old_path} is not an old-style config: it must define `args` and no `overrides`")
    if "base_profile" in namespace:
        raise ConfigError(f"config file {old_path}: an old-style `args` file starts from the base values; drop base_profile")
    conversion = convert_legacy_args(namespace["args"], source=f"config file {old_path}")
    lines = [
        f'"""Converted from {old_path.resolve()} (an old-style `args` config) by scripts/convert_config.py.',
        "Each comment names the old key and why a value changed; keys not named start from the base values.",
        '"""',
        "",
        "overrides = dict(",
    ]
    for key, value in conversion.overrides.items():
        lines.append(f"    {key}={value!r},  # {conversion.origins[key]}")
    lines += [f"    # not applied: {dropped}" for dropped in conversion.dropped]
    lines.append(")")
    return "\n".join(lines) + "\n", conversion.notes


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    temporary.write_text(text)
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Convert an old-style `args = EasyDict()` config to a profile module.")
    parser.add_argument("old_config", type=Path, help="the old .py config file")
    parser.add_argument("-o", "--output", type=Path, help="the profile module to write (default: print it)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output file")
    args = parser.parse_args(argv)
    if not args.old_config.is_file():
        print(f"error: {args.old_config} does not exist", file=sys.stderr)
        return 2
    if args.output and args.output.exists() and not args.force:
        print(f"error: {args.output} exists; pass --force to overwrite it", file=sys.stderr)
        return 2
    try:
        text, notes = profile_module_text(args.old_config)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"legacy config: {note}", file=sys.stderr)
    if args.output is None:
        sys.stdout.write(text)
    else:
        write_atomically(args.output, text)
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
