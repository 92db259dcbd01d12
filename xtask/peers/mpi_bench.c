/*
 * The Open MPI side of `cargo xtask bench --peers`: the same sweep as RLX's own ranks, driven
 * by the same line protocol, so that both are measured the same way in the same run.
 *
 * Protocol (rank 0 reads stdin, which mpirun forwards to it, and broadcasts each command):
 *   in:  "<op> <dtype> <redop> <count> <iters> <warmup>" | "quit"
 *   out: "ready" once, then per command "ok <wrong> <t_1> ... <t_iters>" (microseconds, each
 *        the slowest rank's time for that iteration) or "skip <reason>".
 *
 * Method (shared with every system in the sweep): a barrier before every iteration, one
 * operation timed per iteration, per-iteration times reduced with MAX across ranks after the
 * loop, the output poisoned before the last iteration and checked after it against the
 * closed-form expected values, wrong elements summed across ranks.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

enum op { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE, ALL_TO_ALL, SENDRECV, GATHER, SCATTER };
enum dt { F32, F64, I8, U8, I32, I64 };
enum rop { SUM, MAX, MIN, PROD, NONE };

/* A value outside every input and every expected result, written before the checked iteration. */
#define POISON 113.0

static int rank, world;

static int parse_op(const char *s, enum op *op) {
    static const char *names[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                  "reduce", "all_to_all", "sendrecv", "gather", "scatter"};
    for (int i = 0; i < 9; i++) {
        if (strcmp(s, names[i]) == 0) {
            *op = (enum op)i;
            return 1;
        }
    }
    return 0;
}

static int parse_dtype(const char *s, enum dt *dt, MPI_Datatype *mpi, size_t *size) {
    if (strcmp(s, "f32") == 0) { *dt = F32; *mpi = MPI_FLOAT; *size = 4; return 1; }
    if (strcmp(s, "f64") == 0) { *dt = F64; *mpi = MPI_DOUBLE; *size = 8; return 1; }
    if (strcmp(s, "i8") == 0) { *dt = I8; *mpi = MPI_INT8_T; *size = 1; return 1; }
    if (strcmp(s, "u8") == 0) { *dt = U8; *mpi = MPI_UINT8_T; *size = 1; return 1; }
    if (strcmp(s, "i32") == 0) { *dt = I32; *mpi = MPI_INT32_T; *size = 4; return 1; }
    if (strcmp(s, "i64") == 0) { *dt = I64; *mpi = MPI_INT64_T; *size = 8; return 1; }
    return 0;
}

static int parse_redop(const char *s, enum rop *r, MPI_Op *mpi) {
    if (strcmp(s, "sum") == 0) { *r = SUM; *mpi = MPI_SUM; return 1; }
    if (strcmp(s, "max") == 0) { *r = MAX; *mpi = MPI_MAX; return 1; }
    if (strcmp(s, "min") == 0) { *r = MIN; *mpi = MPI_MIN; return 1; }
    if (strcmp(s, "prod") == 0) { *r = PROD; *mpi = MPI_PROD; return 1; }
    if (strcmp(s, "none") == 0) { *r = NONE; *mpi = MPI_OP_NULL; return 1; }
    return 0;
}

static void set(void *buf, enum dt dt, size_t i, double v) {
    switch (dt) {
    case F32: ((float *)buf)[i] = (float)v; break;
    case F64: ((double *)buf)[i] = v; break;
    case I8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    }
}

static double get(const void *buf, enum dt dt, size_t i) {
    switch (dt) {
    case F32: return ((const float *)buf)[i];
    case F64: return ((const double *)buf)[i];
    case I8: return ((const int8_t *)buf)[i];
    case U8: return ((const uint8_t *)buf)[i];
    case I32: return ((const int32_t *)buf)[i];
    case I64: return (double)((const int64_t *)buf)[i];
    }
    return 0;
}

/* Input of rank r at global index i for reductions (the product pattern keeps results at 2). */
static double reduce_input(enum rop r, int from, size_t i) {
    if (r == PROD) return (i % (size_t)world) == (size_t)from ? 2.0 : 1.0;
    return (double)((from + i) % 4);
}

static double reduce_expected(enum rop r, size_t i) {
    double acc = reduce_input(r, 0, i);
    for (int k = 1; k < world; k++) {
        double v = reduce_input(r, k, i);
        switch (r) {
        case SUM: acc += v; break;
        case MAX: acc = v > acc ? v : acc; break;
        case MIN: acc = v < acc ? v : acc; break;
        case PROD: acc *= v; break;
        case NONE: break;
        }
    }
    return acc;
}

/* Input of rank r at index i for data movement. */
static double data_value(int from, size_t i) { return (double)((from * 31 + i) % 101); }

static long long count_wrong(const void *buf, enum dt dt, size_t n, double (*expected)(size_t, void *),
                             void *ctx) {
    long long wrong = 0;
    for (size_t i = 0; i < n; i++) {
        double e = expected(i, ctx);
        double g = get(buf, dt, i);
        double tol = (dt == F32) ? 1e-5 * fmax(1.0, fabs(e)) : 0.0;
        if (fabs(g - e) > tol) wrong++;
    }
    return wrong;
}

struct ctx { enum op op; enum rop r; size_t block; };

static double expect_elem(size_t i, void *p) {
    struct ctx *c = (struct ctx *)p;
    switch (c->op) {
    case ALL_REDUCE:
    case REDUCE: return reduce_expected(c->r, i);
    case REDUCE_SCATTER: return reduce_expected(c->r, (size_t)rank * c->block + i);
    case ALL_GATHER: return data_value((int)(i / c->block), i % c->block);
    case BROADCAST: return data_value(0, i);
    case ALL_TO_ALL: return data_value((int)(i / c->block), (size_t)rank * c->block + i % c->block);
    case SENDRECV: return data_value((rank + world - 1) % world, i);
    case GATHER: return data_value((int)(i / c->block), i % c->block);
    case SCATTER: return data_value(0, (size_t)rank * c->block + i);
    }
    return 0;
}

static void run(enum op op, enum dt dt, MPI_Datatype type, size_t esize, enum rop r, MPI_Op mop,
                size_t count, int iters, int warmup, double *times, long long *wrong_out) {
    int blocked = op == ALL_GATHER || op == REDUCE_SCATTER || op == ALL_TO_ALL || op == GATHER || op == SCATTER;
    size_t block = blocked ? count / world : count;
    /* Gather: every rank sends a block, the root's output is the whole size. Scatter: the
     * root's input is the whole size, every rank receives a block. */
    size_t in_count = (op == ALL_GATHER || op == GATHER) ? block : count;
    size_t out_count = (op == REDUCE_SCATTER || op == SCATTER) ? block : count;
    void *in = malloc(in_count * esize + 1);
    void *out = malloc(out_count * esize + 1);
    for (size_t i = 0; i < in_count; i++) {
        double v;
        if (op == ALL_REDUCE || op == REDUCE || op == REDUCE_SCATTER) v = reduce_input(r, rank, i);
        else if (op == BROADCAST || op == SCATTER) v = rank == 0 ? data_value(0, i) : 0.0;
        else v = data_value(rank, i);
        set(in, dt, i, v);
    }
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    for (int it = -warmup; it < iters; it++) {
        if (it == iters - 1) {
            for (size_t i = 0; i < out_count; i++) set(out, dt, i, POISON);
        }
        void *bcast = out;
        if (op == BROADCAST) {
            /* Broadcast is in place: the root sends its input, the others land in `out`. */
            if (rank == 0) bcast = in;
        }
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        switch (op) {
        case ALL_REDUCE: MPI_Allreduce(in, out, (int)count, type, mop, MPI_COMM_WORLD); break;
        case ALL_GATHER: MPI_Allgather(in, (int)block, type, out, (int)block, type, MPI_COMM_WORLD); break;
        case REDUCE_SCATTER: MPI_Reduce_scatter_block(in, out, (int)block, type, mop, MPI_COMM_WORLD); break;
        case BROADCAST: MPI_Bcast(bcast, (int)count, type, 0, MPI_COMM_WORLD); break;
        case REDUCE: MPI_Reduce(in, out, (int)count, type, mop, 0, MPI_COMM_WORLD); break;
        case ALL_TO_ALL: MPI_Alltoall(in, (int)block, type, out, (int)block, type, MPI_COMM_WORLD); break;
        case GATHER: MPI_Gather(in, (int)block, type, out, (int)block, type, 0, MPI_COMM_WORLD); break;
        case SCATTER: MPI_Scatter(in, (int)block, type, out, (int)block, type, 0, MPI_COMM_WORLD); break;
        case SENDRECV:
            MPI_Sendrecv(in, (int)count, type, next, 7, out, (int)count, type, prev, 7, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
            break;
        }
        double t1 = MPI_Wtime();
        if (it >= 0) times[it] = (t1 - t0) * 1e6;
    }
    struct ctx c = {op, r, block};
    long long wrong = 0;
    if (op == BROADCAST) {
        wrong = count_wrong(rank == 0 ? in : out, dt, count, expect_elem, &c);
    } else if (!((op == REDUCE || op == GATHER) && rank != 0)) {
        wrong = count_wrong(out, dt, out_count, expect_elem, &c);
    }
    MPI_Reduce(&wrong, wrong_out, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    free(in);
    free(out);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (rank == 0) {
        printf("ready\n");
        fflush(stdout);
    }
    char line[256];
    for (;;) {
        /* Rank 0 reads the command and broadcasts it; end of input means quit. The others
         * wait with MPI_Test and a 1 ms sleep rather than in a blocking MPI_Bcast, which
         * would spin on a core that the other systems being measured need. */
        memset(line, 0, sizeof line);
        if (rank == 0 && fgets(line, sizeof line, stdin) == NULL) line[0] = '\0';
        MPI_Request request;
        MPI_Ibcast(line, sizeof line, MPI_CHAR, 0, MPI_COMM_WORLD, &request);
        for (int done = 0;;) {
            MPI_Test(&request, &done, MPI_STATUS_IGNORE);
            if (done) break;
            struct timespec pause = {0, 1000000};
            nanosleep(&pause, NULL);
        }
        char ops[32], dts[32], rops[32];
        unsigned long long count;
        int iters, warmup;
        if (sscanf(line, "%31s %31s %31s %llu %d %d", ops, dts, rops, &count, &iters, &warmup) != 6) break;
        enum op op;
        enum dt dt;
        enum rop r;
        MPI_Datatype type;
        MPI_Op mop;
        size_t esize;
        const char *skip = NULL;
        if (!parse_op(ops, &op)) skip = "unknown operation";
        else if (!parse_dtype(dts, &dt, &type, &esize)) skip = "MPI has no such standard type";
        else if (!parse_redop(rops, &r, &mop)) skip = "MPI has no such reduction";
        else if (iters < 1 || count > (unsigned long long)0x7fffffff) skip = "count or iterations out of range";
        if (skip != NULL) {
            if (rank == 0) {
                printf("skip %s\n", skip);
                fflush(stdout);
            }
            continue;
        }
        double *times = calloc((size_t)iters, sizeof(double));
        double *slowest = calloc((size_t)iters, sizeof(double));
        long long wrong = 0;
        run(op, dt, type, esize, r, mop, (size_t)count, iters, warmup, times, &wrong);
        MPI_Reduce(times, slowest, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("ok %lld", wrong);
            for (int i = 0; i < iters; i++) printf(" %.3f", slowest[i]);
            printf("\n");
            fflush(stdout);
        }
        free(times);
        free(slowest);
    }
    MPI_Finalize();
    return 0;
}
