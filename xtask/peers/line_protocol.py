"""The command loop shared by the Python peers of `cargo xtask bench --peers` (gloo_bench.py,
mlx_bench.py): every rank reads the same commands on stdin and rank 0 answers on stdout.
  in:  "<op> <dtype> <redop> <count> <iters> <warmup>" | "quit"
  out: "ready" once, then "ok <wrong> <t_1> ... <t_iters>" (microseconds) or "skip <reason>".
"""

import sys


def serve(rank, system, dtypes, run, refusals):
    """Answers commands until "quit" or the end of stdin. `run(op, dtype, redop, count, iters,
    warmup)` returns `((wrong, times), None)` or `(None, reason)`; an exception of a type in
    `refusals` is the system refusing the command before any byte moved (on every rank alike,
    so the ranks stay in step) and is answered as a skip naming `system`."""

    def answer(text):
        if rank == 0:
            print(text, flush=True)

    answer("ready")
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        op, dtype_name, redop = words[0], words[1], words[2]
        count, iters, warmup = int(words[3]), int(words[4]), int(words[5])
        dtype = dtypes.get(dtype_name)
        if dtype is None:
            answer("skip unknown dtype")
            continue
        try:
            result, reason = run(op, dtype, redop, count, iters, warmup)
        except refusals as error:
            result, reason = None, system + ": " + str(error).splitlines()[0][:100]
        if result is None:
            answer("skip " + reason)
        else:
            answer("ok %d %s" % (result[0], " ".join("%.3f" % t for t in result[1])))
