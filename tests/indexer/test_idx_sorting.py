"""The suffix sort's OpenMP team must not outlive the sort on the daemon's long-lived indexing thread."""
import os
import threading
import time

import numpy as np
import pytest

from indexer.sorting import divsufsort, suffix_array


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2,
                    reason="counts the process's threads in /proc; one CPU makes an OpenMP team of one")
def test_a_long_lived_thread_that_sorts_keeps_no_openmp_threads():
    """pydivsufsort sorts on an OpenMP team that stays docked while the thread that started it lives, and more
    OpenMP threads than CPUs make libgomp (torch's, in the daemon) wake its threads through the kernel at every
    parallel region: every model forward 1.55x slower on 2 cores (docs/cpu.md). Sorted through
    indexer.sorting, the team goes with the sort's own thread."""
    import torch  # noqa: F401 - the daemon's setting: pydivsufsort's team in torch's libgomp

    tokens = np.random.default_rng(0).integers(0, 50_000, 300_000).astype(np.int64)
    counts: dict[str, int] = {}
    sorted_, release = threading.Event(), threading.Event()

    def indexing_thread(sort) -> None:
        counts["before"] = _threads()
        counts["sa"] = sort(tokens)
        deadline = time.monotonic() + 5  # a finished team's threads exit shortly after their master
        while _threads() > counts["before"] and time.monotonic() < deadline:
            time.sleep(0.01)
        counts["after"] = _threads()
        sorted_.set()
        release.wait()

    def run(sort) -> tuple[int, int, np.ndarray]:
        sorted_.clear(), release.clear()
        t = threading.Thread(target=indexing_thread, args=(sort,))
        t.start()
        sorted_.wait()
        release.set()
        t.join()
        return counts["before"], counts["after"], counts["sa"]

    before, after, sa = run(lambda arr: suffix_array(arr, 4, 50_000))
    assert after == before
    # the same sort called on the long-lived thread itself leaves its team behind: what the check above catches
    from pydivsufsort import divsufsort as on_this_thread

    before_direct, after_direct, _ = run(lambda arr: on_this_thread(arr.astype(np.uint16)))
    assert after_direct > before_direct
    # and the order is the suffix order
    s = tokens[:500].tolist()
    head = divsufsort(tokens[:500].astype(np.uint16))
    assert head.tolist() == sorted(range(len(s)), key=lambda i: s[i:])
    assert len(sa) == len(tokens)


def test_a_sort_that_fails_raises_on_the_callers_thread():
    with pytest.raises(Exception):
        divsufsort(np.zeros(10, dtype=np.float64))
