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


def cached_measurement(name: str, values: list, code: tuple[str, ...], measure):
    """measure() (JSON-able), or what it returned before for the same values (of the config keys it
    depends on) and the same code."""
    digest = hashlib.sha1(b"".join((REPO_ROOT / file).read_bytes() for file in code)).hexdigest()[:12]
    return cached(name, json.dumps([digest] + list(values), sort_keys=True), measure)


def cached(name: str, key: str, measure):
    """measure() (JSON-able), or what it returned before under `key` in ~/.cache/taehv/<name>.json."""
    cache = cache_root() / f"{name}.json"
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


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "taehv"


def compile_cache_dir() -> str:
    """Where torch.compile keeps its artefacts (inductor's FX graph cache, autotuning results), set
    for this process before anything compiles: TORCHINDUCTOR_CACHE_DIR when the user set it, else
    <cache root>/inductor, so a later run of the same shapes reuses them after a container's /tmp is
    gone. torch's own default (/tmp/torchinductor_<user>), which importing diffusers already writes
    into the variable, counts as unset."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    if os.environ.get("TORCHINDUCTOR_CACHE_DIR", default_cache_dir()) == default_cache_dir():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root() / "inductor")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]
