"""The MLX side of `cargo xtask bench --peers`: mlx.core.distributed on its ring backend.

Launched once per rank with MLX_HOSTFILE (a JSON list of ["host:port"] per rank) and MLX_RANK,
as mlx.launch would. Every rank reads the same commands on stdin; rank 0 answers on stdout:
  in:  "<op> <dtype> <redop> <count> <iters> <warmup>" | "quit"
  out: "ready" once, then "ok <wrong> <t_1> ... <t_iters>" (microseconds, each the slowest
       rank's time for that iteration) or "skip <reason>".
The method is the one every system of the sweep uses: a barrier before each iteration, one
operation timed per iteration (up to mx.eval of its result, since MLX is lazy), the times
reduced with MAX across ranks after the loop, the result checked against the expected values.
"""

import time

import mlx.core as mx

from line_protocol import serve

DTYPES = {
    "f16": mx.float16,
    "bf16": mx.bfloat16,
    "f32": mx.float32,
    "f64": mx.float64,
    "i8": mx.int8,
    "u8": mx.uint8,
    "i32": mx.int32,
    "i64": mx.int64,
}


def reduce_input(rank, count):
    return (mx.arange(count, dtype=mx.int32) + rank) % 4


def reduce_expected(redop, world, count):
    inputs = mx.stack([reduce_input(r, count) for r in range(world)])
    return {"sum": inputs.sum(0), "max": inputs.max(0), "min": inputs.min(0)}[redop]


def data_value(rank, count):
    return (mx.arange(count, dtype=mx.int32) + rank * 31) % 101


def count_wrong(got, expected):
    # The expected values are small integers, exact in every dtype used here (float32 holds
    # every one of them, so the comparison is exact too).
    return int((got.astype(mx.float32) != expected.astype(mx.float32)).sum().item())


def run(group, op, dtype, redop, count, iters, warmup):
    rank, world = group.rank(), group.size()
    block = count // world
    if op == "all_reduce":
        fn = {"sum": mx.distributed.all_sum, "max": mx.distributed.all_max, "min": mx.distributed.all_min}.get(redop)
        if fn is None:
            return None, "mlx has no %s all-reduce" % redop
        x = reduce_input(rank, count).astype(dtype)
        expected = reduce_expected(redop, world, count)
    elif op == "reduce_scatter":
        if redop != "sum":
            return None, "mlx has only a sum reduce-scatter"
        fn = mx.distributed.sum_scatter
        x = reduce_input(rank, count).astype(dtype)
        expected = reduce_expected(redop, world, count)[rank * block:(rank + 1) * block]
    elif op == "all_gather":
        fn = mx.distributed.all_gather
        x = data_value(rank, block).astype(dtype)
        expected = mx.concatenate([data_value(r, block) for r in range(world)])
    else:
        # mlx.distributed has no broadcast, reduce or all-to-all, and its point-to-point
        # send/recv only reaches ring neighbours, so a simultaneous sendrecv is not measured.
        return None, "the mlx peer measures all_reduce, all_gather and reduce_scatter only"
    mx.eval(x)
    token = mx.array([1.0])
    times = []
    y = None
    for it in range(-warmup, iters):
        mx.eval(mx.distributed.all_sum(token, group=group))
        t0 = time.perf_counter()
        y = fn(x, group=group)
        mx.eval(y)
        t1 = time.perf_counter()
        if it >= 0:
            times.append((t1 - t0) * 1e6)
    wrong = count_wrong(y, expected)
    # Every rank contributes its row; the column maxima are the slowest rank's times.
    row = mx.array([float(wrong)] + times, dtype=mx.float32)
    table = mx.distributed.all_gather(row.reshape(1, -1), group=group).reshape(world, -1)
    return (int(table[:, 0].sum().item()), table[:, 1:].max(0).tolist()), None


def main():
    group = mx.distributed.init(backend="ring", strict=True)
    # MLX refuses some dtypes on its CPU backend with a RuntimeError or ValueError.
    serve(
        group.rank(),
        "mlx",
        DTYPES,
        lambda *command: run(group, *command),
        (RuntimeError, ValueError),
    )


if __name__ == "__main__":
    main()
