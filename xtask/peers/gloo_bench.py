"""The Gloo side of `cargo xtask bench --peers`: torch.distributed with the gloo backend.

Launched once per rank with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (torchrun's
variables). Every rank reads the same commands on stdin; rank 0 answers on stdout:
  in:  "<op> <dtype> <redop> <count> <iters> <warmup>" | "quit"
  out: "ready" once, then "ok <wrong> <t_1> ... <t_iters>" (microseconds, each the slowest
       rank's time for that iteration) or "skip <reason>".
The method is the one every system of the sweep uses: a barrier before each iteration, one
operation timed per iteration, the times reduced with MAX across ranks after the loop, the
output poisoned before the last iteration and checked after it, wrong elements summed.
"""

import datetime
import os
import time

import torch
import torch.distributed as dist

from line_protocol import serve

DTYPES = {
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f32": torch.float32,
    "f64": torch.float64,
    "i8": torch.int8,
    "u8": torch.uint8,
    "i32": torch.int32,
    "i64": torch.int64,
}
REDUCTIONS = {
    "sum": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "prod": dist.ReduceOp.PRODUCT,
}
# A value outside every input and every expected result.
POISON = 113


def reduce_input(redop, rank, world, count):
    index = torch.arange(count, dtype=torch.int64)
    if redop == "prod":
        return torch.where(index % world == rank, 2, 1)
    return (index + rank) % 4


def reduce_expected(redop, world, count):
    inputs = torch.stack([reduce_input(redop, r, world, count) for r in range(world)])
    if redop == "sum":
        return inputs.sum(0)
    if redop == "max":
        return inputs.max(0).values
    if redop == "min":
        return inputs.min(0).values
    return inputs.prod(0)


def data_value(rank, count, start=0):
    return (torch.arange(start, start + count, dtype=torch.int64) + rank * 31) % 101


def count_wrong(got, expected):
    # The expected values are small integers, exact in every dtype used here.
    return int((got.to(torch.float64) != expected.to(torch.float64)).sum())


def run(op, dtype, redop, count, iters, warmup):
    rank, world = dist.get_rank(), dist.get_world_size()
    reduction = REDUCTIONS.get(redop)
    block = count // world
    if op in ("all_reduce", "reduce", "reduce_scatter"):
        if reduction is None:
            return None, "gloo has no %s reduction" % redop
        pristine = reduce_input(redop, rank, world, count).to(dtype)
    elif op == "broadcast":
        pristine = data_value(0, count).to(dtype) if rank == 0 else torch.zeros(count, dtype=dtype)
    elif op == "all_gather":
        pristine = data_value(rank, block).to(dtype)
    else:
        pristine = data_value(rank, count).to(dtype)
    work = pristine.clone()
    out = torch.empty(block if op == "reduce_scatter" else count, dtype=dtype)
    outs = list(out.chunk(world)) if op == "all_gather" else None
    ins = list(pristine.chunk(world)) if op == "reduce_scatter" else None
    nxt, prev = (rank + 1) % world, (rank - 1) % world

    def once():
        if op == "all_reduce":
            dist.all_reduce(work, reduction)
        elif op == "reduce":
            dist.reduce(work, 0, reduction)
        elif op == "broadcast":
            dist.broadcast(work, 0)
        elif op == "all_gather":
            dist.all_gather(outs, pristine)
        elif op == "reduce_scatter":
            dist.reduce_scatter(out, ins, reduction)
        elif op == "all_to_all":
            dist.all_to_all_single(out, pristine)
        elif op == "sendrecv":
            send = dist.isend(pristine, nxt)
            recv = dist.irecv(out, prev)
            send.wait()
            recv.wait()

    times = []
    for it in range(-warmup, iters):
        # In-place operations start from the pristine input every time, outside the timing.
        if op in ("all_reduce", "reduce", "broadcast"):
            work.copy_(pristine)
            if op == "broadcast" and rank != 0 and it == iters - 1:
                work.fill_(POISON)
        if it == iters - 1:
            out.fill_(POISON)
        dist.barrier()
        t0 = time.perf_counter()
        once()
        t1 = time.perf_counter()
        if it >= 0:
            times.append((t1 - t0) * 1e6)

    if op == "all_reduce":
        wrong = count_wrong(work, reduce_expected(redop, world, count))
    elif op == "reduce":
        wrong = count_wrong(work, reduce_expected(redop, world, count)) if rank == 0 else 0
    elif op == "reduce_scatter":
        wrong = count_wrong(out, reduce_expected(redop, world, count)[rank * block:(rank + 1) * block])
    elif op == "broadcast":
        wrong = count_wrong(work, data_value(0, count))
    elif op == "all_gather":
        wrong = count_wrong(out, torch.cat([data_value(r, block) for r in range(world)]))
    elif op == "all_to_all":
        wrong = count_wrong(out, torch.cat([data_value(r, block, rank * block) for r in range(world)]))
    else:
        wrong = count_wrong(out, data_value(prev, count))
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, dist.ReduceOp.MAX)
    total_wrong = torch.tensor([wrong], dtype=torch.int64)
    dist.all_reduce(total_wrong, dist.ReduceOp.SUM)
    return (int(total_wrong[0]), slowest.tolist()), None


def main():
    dist.init_process_group(
        "gloo", timeout=datetime.timedelta(seconds=int(os.environ.get("RLX_PEER_TIMEOUT", "120")))
    )
    # Gloo refuses some operation/dtype pairs (reduce_scatter, bf16) with a RuntimeError.
    serve(dist.get_rank(), "gloo", DTYPES, run, (RuntimeError,))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
