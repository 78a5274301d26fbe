"""Where a traced step's time goes: total time per XLA op (kernel on a GPU, thunk on the CPU)
from a profiler trace (`.xplane.pb`, written by `jax.profiler.trace` or step_throughput's
--profile), largest first, with the share of the traced device time.

  python benchmarks/step/profile_summary.py TRACE.xplane.pb [--top 40] [--steps 3]

On a GPU the events come from the device plane's kernel/op lines; on the CPU from the XLA
thread pools' op events (one event per thunk). Events with the same name are summed; --steps
divides the totals by the number of traced steps.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re

# Host-side bookkeeping events of the CPU thread pools, not ops.
_NOT_OPS = re.compile(r"^(ThreadpoolListener|SlinkyThreadPool|ThunkExecutor|\$|Thunk::|end:)")


def op_times(path: str) -> tuple[dict, str]:
    """{op name: [total ns, count]} and the plane the events came from."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(path)
    planes = {plane.name: plane for plane in data.planes}
    device = [
        name for name in planes if name.startswith("/device:GPU") or name.startswith("/device:TPU")
    ]
    totals = collections.defaultdict(lambda: [0.0, 0])
    if device:
        plane = planes[sorted(device)[0]]
        lines = [line for line in plane.lines if line.name in ("XLA Ops", "Kernels")] or [
            line for line in plane.lines if line.name.startswith("Stream")
        ]
    else:
        plane = planes["/host:CPU"]
        lines = [line for line in plane.lines if line.name.startswith("tf_XLA")]
    for line in lines:
        for event in line.events:
            if not _NOT_OPS.match(event.name):
                totals[event.name][0] += event.duration_ns
                totals[event.name][1] += 1
    return dict(totals), plane.name


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="an .xplane.pb file or a folder holding one")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--steps", type=int, default=1)
    args = parser.parse_args()
    path = args.path
    if os.path.isdir(path):
        path = sorted(glob.glob(os.path.join(path, "**", "*.xplane.pb"), recursive=True))[-1]
    totals, plane = op_times(path)
    everything = sum(total for total, _ in totals.values())
    print(
        f"{path}: plane {plane}, {len(totals)} distinct ops, "
        f"{everything / 1e6 / args.steps:.1f} ms of op time per step"
    )
    print("| op | ms/step | calls/step | share |\n|---|---|---|---|")
    for name, (total, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(
            f"| {name[:70]} | {total / 1e6 / args.steps:.2f} | {count / args.steps:.0f} | "
            f"{total / everything:.1%} |"
        )


if __name__ == "__main__":
    main()
