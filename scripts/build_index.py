"""Index a folder of videos for training.

    python -m scripts.build_index DIR --out INDEX.jsonl [--workers N]

Scans DIR recursively for video files, probes each container (frame count when the header has
one, fps, duration, width and height as stored, rotation, codec) in a process pool, and writes
INDEX.jsonl (one JSON object per line, paths relative to DIR) plus INDEX.rejects.jsonl (files
that failed, with the reason). A re-run probes only files it has not seen (new paths, or a
changed size or modification time) and keeps the rest. Both files are replaced atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tqdm import tqdm

from training.base.files import unique_temporary
from training.base.launch import die_with_parent
from training.data.decode import ClipError
from training.data.index import probe_video, scan_videos


def file_signature(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, int(stat.st_mtime)


def probe_one(job: tuple[str, str]) -> dict:
    root, relative = job
    path = Path(root) / relative
    size, mtime = file_signature(path)
    record = {"path": relative, "size": size, "mtime": mtime}
    try:
        record.update(probe_video(path))
    except ClipError as error:
        record.update(reason=error.reason, detail=str(error))
    return record


def read_jsonl(path: Path) -> dict[str, dict]:
    if not path.is_file():
        return {}
    records = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            records[record["path"]] = record
    return records


def write_jsonl(path: Path, records: list[dict]) -> None:
    temporary = unique_temporary(path)
    with open(temporary, "w") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    os.replace(temporary, path)


def rejects_path(index_path: Path) -> Path:
    return index_path.with_name(index_path.stem + ".rejects.jsonl")


def build_index(root: Path, out: Path, workers: int | None = None, show_progress: bool = True) -> dict:
    """Returns counts: files, probed (this run), kept (from the previous run), indexed, rejected."""
    root = root.resolve()
    previous = {**read_jsonl(rejects_path(out)), **read_jsonl(out)}
    relatives = scan_videos(root)
    kept, jobs = [], []
    for relative in relatives:
        old = previous.get(relative)
        if old is not None and (old.get("size"), old.get("mtime")) == file_signature(root / relative):
            kept.append(old)
        else:
            jobs.append((str(root), relative))
    probed = []
    if jobs:
        with ProcessPoolExecutor(max_workers=workers or os.cpu_count(), initializer=die_with_parent) as pool:
            results = pool.map(probe_one, jobs, chunksize=max(1, min(256, len(jobs) // (4 * (workers or os.cpu_count() or 1)))))
            probed = list(tqdm(results, total=len(jobs), unit="file", desc="probing", disable=not show_progress))
    records = sorted(kept + probed, key=lambda r: r["path"])
    good = [r for r in records if "reason" not in r]
    bad = [r for r in records if "reason" in r]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(out, good)
    write_jsonl(rejects_path(out), bad)
    return {"files": len(relatives), "probed": len(jobs), "kept": len(kept), "indexed": len(good), "rejected": len(bad)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="folder of videos (scanned recursively)")
    parser.add_argument("--out", type=Path, required=True, help="index file to write (.jsonl)")
    parser.add_argument("--workers", type=int, help="probe processes (default: all cores)")
    args = parser.parse_args()
    if not args.root.is_dir():
        print(f"error: {args.root} is not a folder", file=sys.stderr)
        return 2
    if args.out.suffix != ".jsonl":
        print(f"error: --out {args.out}: the index is JSONL, name it *.jsonl", file=sys.stderr)
        return 2
    counts = build_index(args.root, args.out, args.workers, show_progress=sys.stderr.isatty())
    print(f"{counts['files']} video files: {counts['indexed']} indexed, {counts['rejected']} rejected "
          f"({counts['probed']} probed now, {counts['kept']} kept from the last run) -> {args.out}, {rejects_path(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
