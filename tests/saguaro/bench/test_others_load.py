"""A bench call during which other processes computed is marked disturbed; its own children are not others."""

import subprocess
import sys
import time

from saguaro.bench.others import DISTURBED_SHARE, OtherLoad, disturbed_reason, others_cpu

BUSY = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass\n"


def _busy(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", BUSY.format(s=seconds)])


def test_a_busy_process_outside_the_tree_is_seen(tmp_path) -> None:
    # started by a shell that exits at once: the busy loop is re-parented, no longer in our tree
    subprocess.run(f"{sys.executable} -c '{BUSY.format(s=1.5)}' & ", shell=True, check=True)
    load = OtherLoad.now()
    time.sleep(1.2)
    share = load.share()
    assert share > 0.5  # one core busy for most of the window (other processes add to it)
    assert disturbed_reason(share) is not None


def test_our_own_child_is_not_counted_as_another_process() -> None:
    child = _busy(1.5)
    try:
        time.sleep(0.2)
        assert child.pid not in others_cpu()
    finally:
        child.wait(10)


def test_the_reason_names_the_share_only_above_the_threshold() -> None:
    assert disturbed_reason(DISTURBED_SHARE / 2) is None
    assert "of a core" in disturbed_reason(DISTURBED_SHARE + 0.5)
