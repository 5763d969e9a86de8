"""Timing for the kernel benchmarks (``batch_norm_kernels``, ``conv_kernels``):
candidates called in alternating rounds in one process, so drift of the host falls on all of them alike."""

import time


def alternating_rounds(candidates, rounds, repeats):
    """{name: [ms per call, one per round]}: each round calls every candidate once untimed, then ``repeats``
    times timed, in the order given."""
    times = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, call in candidates.items():
            call()
            start = time.perf_counter()
            for _ in range(repeats):
                call()
            times[name].append(1000 * (time.perf_counter() - start) / repeats)
    return times
