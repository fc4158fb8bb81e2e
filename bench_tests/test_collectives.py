"""Group collectives: bus bandwidth of all-reduce, all-gather and reduce-scatter
(nccl-tests' definitions, see perfsuite/core/workloads/collective.py), NCCL on
GPUs and gloo on cpu, at a small message (1 MiB, latency-bound) and a large one
(1 GiB on GPUs, as far as nccl-tests' usual sweep goes; 16 MiB on cpu).

GPU profiles run 8 ranks, or 4 or 2 where fewer GPUs are present (busbw is
comparable across world sizes); cpu runs 2 gloo ranks.

The group is in the nightly tier: a pull request's cpu gate (`make test`, `--perf-tier pr`)
leaves it out. gloo over loopback on the 2-vCPU CI VM moves far more between sessions than any
tolerance absorbs: in two CI runs of the same baselines (2026-11-27), reduce_scatter_1mib read
0.059 and 0.189 GB/s, all_reduce_large 0.58 and 0.86, and all_gather_large was unreliable in
one and a confirmed -40.7% in the other (tolerance 40%) with nothing changed.
`selftest --simulate` puts the smallest slowdown these rows' gate catches at 98-113% of step
time. GPU runs (`make bench`) and `make bench-nightly` judge every tier.
"""

from perfsuite import Collective, Relation, parametrize, parametrize_relations

MIB, GIB = 2**20, 2**30
SEED = dict(world_size=8, world_sizes=(4, 2), warmup_steps=5, steps=20)
# gloo's staging buffers make a rank's peak RSS vary between launches (measured
# 332-400 MiB for the 16 MiB reduce-scatter over 5 runs), beyond the cpu
# profile's 15% memory tolerance, so this group allows 30% there.
CPU = dict(world_size=2, warmup_steps=2, steps=10, tolerances={"peak_mem_mib": 0.30})


def row(op: str, size: str) -> Collective:
    small = size == "1mib"
    return Collective(
        "collectives",
        f"{op}_{size}",
        op=op,
        size_bytes=MIB if small else GIB,
        # Many small collectives per timed step, so the clock measures them rather than itself.
        # On cpu 50: a step of 20 (~30 ms) caught the VM's scheduling hiccups whole, per-step
        # spread 16-48% over 3 runs of each op, against 12-37% with 50.
        iterations=20 if small else 1,
        **SEED,
        variants={"cpu": {**CPU, "size_bytes": MIB if small else 16 * MIB, "iterations": 50 if small else 1}},
        reference="nccl-tests busbw" + ("" if small else "; 1 GiB on GPUs, 16 MiB on cpu"),
        tier="nightly",
    )


OPS = ("all_reduce", "all_gather", "reduce_scatter")
ROWS = {(op, size): row(op, size) for op in OPS for size in ("1mib", "large")}
SCENARIOS = list(ROWS.values())

# Small messages are latency-bound: a large one moves more bytes per second.
# Measured on cpu too (1.5-1.9x over 4 runs), but a busy 2-core machine drifts
# 20-47%, so the claim is gated where it is certain.
RELATIONS = [
    Relation("busbw_gbps", ROWS[op, "large"], ">", ROWS[op, "1mib"], only_on=("cuda",), why="latency-bound 1 MiB")
    for op in OPS
]


@parametrize(SCENARIOS)
def test_collectives(perf, scenario):
    perf.check(scenario)


@parametrize_relations(RELATIONS)
def test_collectives_relations(perf, relation):
    perf.check_relation(relation)
