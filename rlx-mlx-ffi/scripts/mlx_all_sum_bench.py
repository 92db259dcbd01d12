"""Times MLX's own mx.distributed.all_sum (float32, 8 B to 64 MiB) from Python, the
reference for examples/mlx_all_sum_bench.rs. Launch every rank with the same MLX ring
variables as the Rust example (MLX_HOSTFILE, MLX_RANK); rank 0 prints the table. Each rank
calls a tiny all_sum before every timed call, as the Rust example calls a barrier. Sizes in
bytes given as arguments replace the default list, as for the Rust example."""

import sys
import time

import mlx.core as mx

group = mx.distributed.init(strict=True, backend="ring")
n = group.size()
me = group.rank()
expected = n * (n + 1) / 2
cpu = mx.cpu
token = mx.array([1.0])
if me == 0:
    print(f"{'bytes':>10} {'iters':>8} {'median_us':>12} {'algbw':>10} {'busbw':>10}")
SIZES = [int(a) for a in sys.argv[1:]] or [
    8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20
]
for size in SIZES:
    count = size // 4
    iters = max(5, min(200, (256 << 20) // size))
    times = []
    for i in range(iters + 2):
        x = mx.full((count,), float(me + 1), dtype=mx.float32)
        mx.eval(x)
        mx.eval(mx.distributed.all_sum(token, stream=cpu))
        start = time.perf_counter()
        y = mx.distributed.all_sum(x, stream=cpu)
        mx.eval(y)
        took = time.perf_counter() - start
        if i >= 2:
            times.append(took)
        if not bool(mx.all(y == expected).item()):
            raise SystemExit(f"wrong result at {size} bytes")
    times.sort()
    median = times[len(times) // 2]
    algbw = size / median / 1e9
    busbw = algbw * 2 * (n - 1) / n
    if me == 0:
        print(f"{size:>10} {iters:>8} {median * 1e6:>12.1f} {algbw:>10.3f} {busbw:>10.3f}")
