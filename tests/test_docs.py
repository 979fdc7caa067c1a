"""The docs do what they say: every block marked runnable in README.md and docs/*.md runs here,
and every generated part of a doc is current.

Marks (an HTML comment on the line before a fenced block, invisible on GitHub):
  <!-- runnable -->             a bash block that exits 0 on a CPU machine
  <!-- runnable exit=1 -->      ... that exits with this code (a dry run on a machine without the inputs)
  <!-- runnable file=PATH -->   a block whose text is written to PATH (a config file the next commands use)
The blocks run in the order of RUNNABLE_DOCS and of the file, as one user would, in a scratch copy
of the repository (a block may use what an earlier one made, e.g. output/latest), with `python`
being this interpreter and a free MASTER_PORT.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, SHARED, free_port

HOW_TO_PAGES = ["docs/quickstart.md", "docs/howto/train-8-gpus.md", "docs/howto/train-multinode.md",
                "docs/howto/container-offline.md", "docs/howto/resume.md", "docs/howto/finetune.md",
                "docs/howto/distill-new-vae.md", "docs/howto/evaluate.md", "docs/data.md"]
RUNNABLE_DOCS = ["README.md", "docs/README.md", *HOW_TO_PAGES, "docs/launching.md", "docs/training.md",
                 "docs/performance.md", "docs/configuration.md", "docs/evaluation.md", "docs/model.md",
                 "docs/benchmarks.md", "docs/reliability.md", "docs/troubleshooting.md", "docs/architecture.md"]
MARK = re.compile(r"^<!-- runnable(?: (exit|file)=(\S+))? -->\n```(\w+)\n(.*?)^```$", re.M | re.S)


def runnable_blocks() -> list[tuple[str, str, str, str]]:
    """(doc, mark kind, mark value, block text) in the order a user reads them."""
    blocks = []
    for doc in RUNNABLE_DOCS:
        for match in MARK.finditer((REPO_ROOT / doc).read_text()):
            kind, value, _, text = match.groups()
            blocks.append((doc, kind or "exit", value or "0", text))
    return blocks


def test_every_doc_is_listed_so_its_runnable_blocks_run():
    docs = {"README.md"} | {str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "docs").rglob("*.md")}
    assert docs == set(RUNNABLE_DOCS)
    assert len(runnable_blocks()) >= 8


def not_copied(folder: str, names: list[str]) -> set[str]:
    """What the scratch copy leaves out: caches and environments anywhere; the run outputs and
    clips only at the top (training/data is code: a copy without it imported the checkout's
    through its editable install, and failed once that install pointed elsewhere)."""
    skipped = {".git", ".venv", "__pycache__", ".pytest_cache"} | {name for name in names if name.endswith(".egg-info")}
    if Path(folder) == REPO_ROOT:
        skipped |= {"output", "data", "gpu_check"}
    return skipped & set(names)


@pytest.mark.slow
def test_the_runnable_blocks_of_the_docs_run_as_documented(tmp_path):
    scratch = tmp_path / "repo"
    shutil.copytree(REPO_ROOT, scratch, ignore=not_copied)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # a venv's python, also as `python`
    (bin_dir / "python").chmod(0o755)
    env = {**os.environ, "PYTHON": sys.executable, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    if SHARED.is_dir():  # ../shared beside the scratch copy too
        (tmp_path / "shared").symlink_to(SHARED)
    for doc, kind, value, text in runnable_blocks():
        if "../shared" in text and not SHARED.is_dir():
            continue  # a fresh clone without ../shared: the blocks that read it cannot run
        if kind == "file":
            (scratch / value).write_text(text)
            continue
        result = subprocess.run(["bash", "-c", text], cwd=scratch, env={**env, "MASTER_PORT": str(free_port())},
                                capture_output=True, text=True, timeout=600)
        where = f"{doc}:\n{text}\nexit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        assert result.returncode == int(value), where
        assert "Traceback" not in result.stderr, where


def test_generated_parts_of_the_docs_are_current():
    result = subprocess.run([sys.executable, "-m", "scripts.generate_docs", "--check"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def prose_paragraphs(text: str) -> list[list[str]]:
    """The paragraphs of plain text, outside fenced blocks, tables, headings and comments."""
    paragraphs, current, fenced = [], [], False
    for line in text.splitlines() + [""]:
        if line.startswith("```"):
            fenced = not fenced
        plain = not fenced and line.strip() and not line.startswith(("|", "#", "```", "<!--"))
        if plain:
            current.append(line)
        elif current:
            paragraphs.append(current)
            current = []
    return paragraphs


def test_the_readme_gives_the_gpu_users_command_first_and_stays_short():
    """README.md: at most about 80 lines, `./train_taehv_h100.sh 8 h100` in its first 30, no paragraph
    over three lines (figures go in tables); a how-to page starts with its command."""
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 85, len(lines)
    assert any("./train_taehv_h100.sh 8 h100" in line for line in lines[:30])
    long = [paragraph[0] for paragraph in prose_paragraphs("\n".join(lines)) if len(paragraph) > 3]
    assert not long, long
    for page in HOW_TO_PAGES:
        head = (REPO_ROOT / page).read_text().splitlines()[:15]
        assert any(line.startswith("```bash") for line in head), f"{page}: no command in its first 15 lines"



def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation but `-` and `_` dropped,
    spaces as `-` (a repeated heading gets `-1`, `-2`, ...)."""
    anchors, fenced = set(), False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


MD_LINK = re.compile(r"\]\(([^()\s]+?)\)")
CODE_LINK = re.compile(r"\bdocs/[\w/.-]*?\.md(?:#[\w-]+)?")


def test_every_link_to_a_doc_names_a_page_and_a_heading_that_exist():
    """Relative links in README.md and docs/, and `docs/<page>.md#<heading>` in the code, the scripts,
    the Makefile and the tests, reach a file that exists and, with an anchor, one of its headings."""
    def check(target: str, base, where: str, broken: list[str]):
        path, _, anchor = target.partition("#")
        file = (base / path).resolve() if path else None
        if file is not None and not file.exists():
            broken.append(f"{where}: {target} (no such file)")
        elif anchor and (file is None or file.suffix == ".md") and \
                anchor not in heading_anchors((file or base).read_text() if file else ""):
            broken.append(f"{where}: {target} (no such heading)")

    broken: list[str] = []
    pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
    for page in pages:
        text = page.read_text()
        for target in MD_LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            if target.startswith("#"):
                check(page.name + target, page.parent, str(page.relative_to(REPO_ROOT)), broken)
            else:
                check(target, page.parent, str(page.relative_to(REPO_ROOT)), broken)
    code = [p for pattern in ("*.py", "*.sh", "Makefile", "*.toml", "*.yaml")
            for p in REPO_ROOT.rglob(pattern) if not {".venv", "output", "data", ".git"} & set(p.relative_to(REPO_ROOT).parts)]
    for file in [*code, *pages]:
        for target in CODE_LINK.findall(file.read_text(errors="replace")):
            check(target, REPO_ROOT, str(file.relative_to(REPO_ROOT)), broken)
    assert not broken, "\n".join(broken)


def test_every_launcher_option_is_in_the_launching_reference():
    """docs/launching.md is the reference of both launchers: each option train_taehv_h100.sh's
    argument loop parses, and each variable start_multinode_platform.sh reads from the platform,
    has its line there (a new one without it fails here)."""
    reference = (REPO_ROOT / "docs" / "launching.md").read_text()
    options = re.findall(r"^\s*(--[a-z][a-z-]*)\)", (REPO_ROOT / "train_taehv_h100.sh").read_text(), re.M)
    variables = re.findall(r"\$\{([A-Z][A-Z0-9_]+):-", (REPO_ROOT / "start_multinode_platform.sh").read_text())
    assert "--set" in options and "GPUS_PER_NODE" in variables  # the patterns still find them
    assert [option for option in options if f"`{option}" not in reference] == []
    assert [name for name in variables if f"`{name}`" not in reference] == []


def generated_memory_table() -> dict[str, tuple[str, str]]:
    """profile -> (training step GB, GPU per rank GB) as docs/performance.md's generated table prints
    them (the dry run's estimate; test_generated_parts_of_the_docs_are_current keeps it current)."""
    text = (REPO_ROOT / "docs" / "performance.md").read_text()
    part = text.split("<!-- generated: memory-table -->", 1)[1].split("<!-- end generated -->", 1)[0]
    return {m[1]: (m[2], m[3]) for m in re.finditer(r"^\| `(\w+)` \([^)]*\) \| ([\d.]+) \| ([\d.]+)", part, re.M)}


def readme_profile_rows() -> list[list[str]]:
    """The cells of README.md's profile table (profile, GPUs, clip, engine, memory, measured)."""
    rows = [line.strip("|").split(" | ") for line in (REPO_ROOT / "README.md").read_text().splitlines()
            if line.startswith("| `")]
    return [[cell.strip() for cell in row] for row in rows if len(row) == 6]


def test_memory_figures_are_the_dry_runs():
    """Every profile's docstring and README's table quote the memory per rank the dry run prints, to
    its digit; a profile said 'about 45 GB' while the dry run printed 33.1 (issue 58)."""
    import ast

    table = generated_memory_table()
    assert {"1gpu_h100", "h100", "16gpu_h100", "64gpu_h100", "a800"} <= set(table)
    for profile, (step, rank) in table.items():
        text = " ".join(ast.get_docstring(ast.parse((REPO_ROOT / "training" / "configs" / f"{profile}.py").read_text())).split())
        assert re.findall(r"the step measures ([\d.]+) GB, the rank ([\d.]+) GB", text) == [(step, rank)], (profile, text)
        assert not re.search(r"about \d+ GB", text), profile
    rows = readme_profile_rows()
    checked = 0
    for profile, gpus, _, _, memory, _ in rows:
        names = ["16gpu_h100", "64gpu_h100"] if gpus == "16, 64" else [profile.strip("`")]
        if memory.endswith(" GB"):
            assert all(memory == f"{table[name][1]} GB" for name in names), (profile, gpus, memory)
            checked += len(names)
    assert checked == 5


def dated_benchmark_lines(figure: str) -> list[tuple[str, str]]:
    """(date, line) of each line of docs/benchmarks.md that gives `figure` clips/s; the date is the
    line's own, else its section's."""
    found, heading_date = [], ""
    for line in (REPO_ROOT / "docs" / "benchmarks.md").read_text().splitlines():
        date = re.search(r"\d{4}-\d{2}-\d{2}", line)
        if line.startswith("#"):
            heading_date = date[0] if date else ""
        if re.search(rf"(?<![\d.]){re.escape(figure)} clips/s", line.replace("**", "")):
            found.append((date[0] if date else heading_date, line))
    return found


def test_throughput_figures_are_dated_measurements_per_gpu_under_their_engine():
    """README's throughput: each figure is one docs/benchmarks.md gives, with its date; a several-GPU
    profile's figure measured on one GPU says 'per GPU'; one measured under an engine the profile no
    longer uses (1gpu_h100's 2.35 clips/s, under ZeRO-2) names it."""
    measured = [row for row in readme_profile_rows() if "clips/s" in row[5]]
    assert len(measured) >= 2
    for profile, gpus, _, engine, _, cell in measured:
        date = re.search(r"\d{4}-\d{2}-\d{2}", cell)
        assert date, cell
        for figure in re.findall(r"(?<![\d-])(\d+\.\d+)(?= clips/s| on the fly| cached)", cell):
            sources = [line for day, line in dated_benchmark_lines(figure) if day == date[0]]
            assert sources, f"{figure} clips/s ({date[0]}) is in no dated line of docs/benchmarks.md"
            if gpus != "1":
                assert "per GPU" in cell, cell
            for other in ("ZeRO-2", "ZeRO-3", "DDP"):
                if all(other in line for line in sources) and other not in engine:
                    assert f"under {other}" in cell, (cell, other)


def test_the_demo_time_is_the_latest_measured_one_everywhere():
    """One figure for how long `make demo` takes: the latest `make demo` row of docs/benchmarks.md's
    index, with its date, in README.md, docs/README.md and docs/quickstart.md; no other count of
    minutes beside the demo (README said 15, docs/README.md about 10)."""
    index = (REPO_ROOT / "docs" / "benchmarks.md").read_text().split("## Index", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in index.splitlines() if line.startswith("| 20") and "| `make demo`" in line]
    date, figure = rows[-1][0].strip("| "), rows[-1][4]
    took = re.search(r"\d+ m \d+ s", figure)[0]
    for doc in ("README.md", "docs/README.md", "docs/quickstart.md"):
        text = (REPO_ROOT / doc).read_text()
        assert took in text and date in text, doc
        for line in text.splitlines():
            if "demo" in line.lower() or line.startswith("## "):
                assert not re.search(r"\d+ minutes", line), (doc, line)


def test_the_pictures_of_the_docs_are_small_shown_and_refreshable():
    """docs/images/: each PNG under 100 KB, shown by a page, the three `make demo` draws among them,
    and the command that redraws them from a demo run given where they are shown."""
    from scripts.evaluation_report import PICTURE_BYTES

    images = sorted((REPO_ROOT / "docs" / "images").glob("*.png"))
    assert {"contact_sheet.png", "psnr_vs_step.png", "compare.png"} <= {p.name for p in images}
    pages = {p: p.read_text() for p in [REPO_ROOT / "README.md", *(REPO_ROOT / "docs").rglob("*.md")]}
    shown = {(page.parent / target).resolve() for page, text in pages.items() for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)}
    for image in images:
        data = image.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < PICTURE_BYTES, image.name
        assert image.resolve() in shown, f"{image.name} is shown by no page"
    assert "python -m scripts.evaluation_report --pictures docs/images output/latest" in pages[REPO_ROOT / "docs" / "quickstart.md"]
