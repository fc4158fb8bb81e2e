"""Group cluster_gpt: section B of the seed results, Megatron GPT at cluster scale.

The seed's model: hidden 3072, 32 layers, 32 heads, vocabulary 50264,
context 1024 (3,937,640,448 parameters with an untied LM head), micro-batch 4,
global batch 512 on 16 nodes x 8 A100-40GB. Rows are nodes of 8 GPUs x N
nodes, N in 1, 2, 4, 8, 16, for three tensor x pipeline layouts that each fill
one node with one model replica (tp8_pp1, tp4_pp2, tp2_pp4), data parallel
across nodes; and, as the seed compares, the same model under pure data
parallelism with sharded states (DeepSpeed ZeRO-3). Weak scaling: every
replica trains 32 sequences per step at any N, so the global batch is 32 x
replicas and reaches the seed's 512 at 16 nodes (ZeRO-3: 4 per rank).
Layout rows run on ``tp_pp`` (PyTorch-native, runs everywhere) and on
megatron-core (``_mcore``, CUDA only).

A row's ``nodes`` is its node count. Under Slurm each row takes as many nodes
of the allocation as its ranks need; with ``--perf-launcher torchrun`` the
launcher's topology decides; with the default local launcher a multi-node row
runs as that many torchrun agents on this host meeting over loopback, so an
8-GPU host runs the 1-node rows and skips the others saying how many GPUs they
need. Per-GPU achieved TFLOPS and MFU are in ``metrics.extra.mfu``; the
weak-scaling relations report each row's efficiency against one node.

On ``cpu`` a node is 2 gloo ranks and the model a 4-layer, 64-wide GPT: the
tp8_pp1 and ZeRO-3 rows run on 1 node and on 2 emulated nodes (tp spans a
node, as tp8 spans an 8-GPU node); the other rows need more ranks than a
2-core machine should host and run on GPUs only.
"""

from perfsuite import ModelSpec, Relation, Scenario, parametrize, parametrize_relations

GPT_3_9B = ModelSpec("megatron_gpt", layers=32, hidden=3072, heads=32, vocab=50264, max_positions=1024)
GPT_CPU = ModelSpec("megatron_gpt", layers=4, hidden=64, heads=4, vocab=512, max_positions=64)

GPUS_PER_NODE, CPU_RANKS_PER_NODE = 8, 2
NODES = (1, 2, 4, 8, 16)
CPU_NODES = (1, 2)
LAYOUTS = ((8, 1), (4, 2), (2, 4))  # (tp, pp): one replica per 8-GPU node
MICRO, MICROBATCHES = 4, 8  # per replica per step: 8 micro-batches of 4 (32 sequences)
CPU_MICRO, CPU_MICROBATCHES = 2, 2
MEASURE = dict(precision="fp16", seq_len=1024, warmup_steps=3, steps=10)
# Warmup capped on cpu: every step of a 4-rank tp row costs ~0.5 s, and the CI job has a budget.
CPU_MEASURE = dict(model=GPT_CPU, precision="fp32", seq_len=64, warmup_steps=1, max_warmup_steps=2, steps=4)


def layout_row(nodes: int, tp: int, pp: int, strategy: str = "tp_pp") -> Scenario:
    world, replicas = GPUS_PER_NODE * nodes, GPUS_PER_NODE * nodes // (tp * pp)
    options = {"tp": tp, "pp": pp, "microbatches": MICROBATCHES, **({"schedule": "1f1b"} if pp > 1 else {})}
    runs_on_cpu = strategy == "tp_pp" and (tp, pp) == (8, 1) and nodes in CPU_NODES
    # tp spans the node on cpu too: tp = 2 ranks, one replica per node.
    cpu_options = {"tp": CPU_RANKS_PER_NODE, "pp": 1, "microbatches": CPU_MICROBATCHES}
    return Scenario(
        "cluster_gpt",
        f"n{nodes}_tp{tp}_pp{pp}{'_mcore' if strategy == 'megatron_core' else ''}",
        GPT_3_9B,
        strategy=strategy,
        strategy_options=options,
        world_size=world,
        nodes=nodes,
        micro_batch=MICRO,
        global_batch=MICRO * MICROBATCHES * replicas,
        **MEASURE,
        only_on=() if runs_on_cpu else ("cuda",),
        variants={
            "cpu": {
                **CPU_MEASURE,
                "strategy_options": cpu_options,
                "world_size": CPU_RANKS_PER_NODE * nodes,
                "micro_batch": CPU_MICRO,
                "global_batch": CPU_MICRO * CPU_MICROBATCHES * nodes,
            }
        }
        if runs_on_cpu
        else {},
        reference=f"B: {nodes} node(s) x 8 GPUs, tp={tp} x pp={pp}"
        + (", megatron-core" if strategy == "megatron_core" else ""),
    )


def zero3_row(nodes: int) -> Scenario:
    world = GPUS_PER_NODE * nodes
    cpu_world = CPU_RANKS_PER_NODE * nodes
    return Scenario(
        "cluster_gpt",
        f"n{nodes}_zero3",
        GPT_3_9B,
        strategy="deepspeed_zero",
        strategy_options={"stage": 3},
        world_size=world,
        nodes=nodes,
        micro_batch=MICRO,
        global_batch=MICRO * world,
        **MEASURE,
        only_on=() if nodes in CPU_NODES else ("cuda",),
        variants={
            "cpu": {
                **CPU_MEASURE,
                "world_size": cpu_world,
                "micro_batch": CPU_MICRO,
                "global_batch": CPU_MICRO * CPU_MICROBATCHES * cpu_world,
                # DeepSpeed's default keeps parameters under 1e5 elements whole on every rank: all of a tiny model.
                "strategy_options": {"stage": 3, "param_persistence_threshold": 0},
            }
        }
        if nodes in CPU_NODES
        else {},
        reference=f"B: plain data parallel with sharded states (ZeRO-3), {nodes} node(s) x 8 GPUs",
    )


LAYOUT_ROWS = {(n, tp, pp): layout_row(n, tp, pp) for n in NODES for tp, pp in LAYOUTS}
MCORE_ROWS = [layout_row(n, tp, pp, "megatron_core") for n in NODES for tp, pp in LAYOUTS]
ZERO3_ROWS = {n: zero3_row(n) for n in NODES}
SCENARIOS = [*LAYOUT_ROWS.values(), *ZERO3_ROWS.values(), *MCORE_ROWS]


def weak_scaling(rows: list[Scenario]) -> list[Relation]:
    """N nodes deliver more than 80% of N x one node's samples/s (the seed's
    question: how well a cluster with a slower interconnect scales)."""
    return [
        Relation("samples_per_s", r, ">", rows[0], factor="scaling", efficiency=0.8, only_on=("cuda",))
        for r in rows[1:]
    ]


RELATIONS = [
    *(relation for tp, pp in LAYOUTS for relation in weak_scaling([LAYOUT_ROWS[n, tp, pp] for n in NODES])),
    *weak_scaling(list(ZERO3_ROWS.values())),
    # Exact on every profile: data parallelism across nodes replicates a
    # tp x pp replica's state unchanged, while ZeRO-3 shards over every rank.
    Relation("model_state_bytes_per_rank", LAYOUT_ROWS[2, 8, 1], "~", LAYOUT_ROWS[1, 8, 1], tolerance=0.01),
    Relation("model_state_bytes_per_rank", ZERO3_ROWS[2], "<", ZERO3_ROWS[1]),
]


@parametrize(SCENARIOS)
def test_cluster_gpt(perf, scenario):
    perf.check(scenario)


@parametrize_relations(RELATIONS)
def test_cluster_gpt_relations(perf, relation):
    perf.check_relation(relation)
