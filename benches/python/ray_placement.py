"""Ray's placement-group lifecycle rate on one local node, the rival of
benches/src/bin/placement_groups.rs: create a group of one bundle
{"slot": 0.001}, wait until it is ready, remove it; `--concurrency`
groups in flight at a time (created together, waited together, removed
together), as Ray's own microbenchmark does.

    python benches/python/ray_placement.py [--groups 2000] [--concurrency 16]
"""

import argparse
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--groups", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--bundles", type=int, default=1)
    p.add_argument("--strategy", default="SPREAD")
    a = p.parse_args()
    ray.init(num_cpus=2, resources={"slot": 4000}, include_dashboard=False, log_to_driver=False)

    def round_of(n):
        pgs = [
            placement_group([{"slot": 0.001}] * a.bundles, strategy=a.strategy)
            for _ in range(n)
        ]
        ray.get([pg.ready() for pg in pgs], timeout=60)
        for pg in pgs:
            remove_placement_group(pg)

    round_of(a.concurrency)  # warm up
    started = time.perf_counter()
    done = 0
    while done < a.groups:
        round_of(a.concurrency)
        done += a.concurrency
    took = time.perf_counter() - started
    print(f"| Ray {ray.__version__}: create + ready + remove, {a.bundles} bundle(s) "
          f"{a.strategy}, {a.concurrency} in flight | {done / took:.0f} |")
    ray.shutdown()


if __name__ == "__main__":
    main()
