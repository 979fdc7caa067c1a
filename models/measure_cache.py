"""Measurements of a config that take seconds (fake-tensor memory peaks, FLOP counts), kept in
~/.cache/taehv/<name>.json by what they depend on: the config keys named and the code that measures.
Repeated dry runs, the docs generator and the tests then measure each shape once per machine."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def cached_measurement(name: str, config, keys: tuple[str, ...], code: tuple[str, ...], measure):
    """measure() (JSON-able), or what it returned before for the same key values and code."""
    digest = hashlib.sha1(b"".join((REPO_ROOT / file).read_bytes() for file in code)).hexdigest()[:12]
    key = json.dumps([digest] + [bool(config.latent_cache) if k == "latent_cache" else getattr(config, k) for k in keys],
                     sort_keys=True)
    return cached(name, key, measure)


def cached(name: str, key: str, measure):
    """measure() (JSON-able), or what it returned before under `key` in ~/.cache/taehv/<name>.json."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "taehv" / f"{name}.json"
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        known[key] = measure()
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=cache.parent, prefix=f".{cache.name}.")  # unique per writer
            with os.fdopen(handle, "w") as file:
                file.write(json.dumps(known))
            os.replace(temporary, cache)
        except OSError:
            pass  # a read-only home: measured again next time
    return known[key]
