"""training/base/fast_exit.py: the entry points end as the interpreter would, less its teardown."""

import subprocess
import sys
import textwrap

from conftest import REPO_ROOT

PROGRAM = textwrap.dedent("""
    import atexit, sys, threading, time
    from pathlib import Path
    from training.base.fast_exit import exit_now

    folder = Path(sys.argv[1])
    atexit.register(lambda: (folder / "atexit").write_text("ran"))
    def late_writer():
        time.sleep(0.5)
        (folder / "thread").write_text("finished")
    threading.Thread(target=late_writer).start()  # not a daemon: waited for, as at a normal exit

    class FreedAtTeardown:
        def __del__(self):
            (folder / "teardown").write_text("ran")
    kept = FreedAtTeardown()  # a module global: freed only by the interpreter's teardown
    sys.stdout.write("no newline, still buffered")
    exit_now(3)
""")


def test_exit_now_keeps_the_exit_code_threads_atexit_and_output_and_skips_the_teardown(tmp_path):
    result = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path)], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 3, result.stderr
    assert result.stdout == "no newline, still buffered"
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "thread").read_text() == "finished"
    assert not (tmp_path / "teardown").exists()  # the objects were not freed one by one
