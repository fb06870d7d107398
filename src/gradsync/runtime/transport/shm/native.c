/* The shared-buffer collectives of one host, in C: copy in, meet, reduce, copy out.

Why C: a 4 KiB all-reduce between two ranks is about 1 us of copying and adding and one
cache-line round trip; in Python the same steps (views, torch.sum, a barrier written with numpy
words) cost 40-60 us. Everything here works on raw addresses the Python side hands over (the
segment's mapping, the tensors' data pointers); no torch headers are needed.

THE PROTOCOL (the words are laid out by segment.py; every rank maps the same segment)

  word            written by          read by           how it is ordered
  ARRIVED[r]      rank r              every rank        seq_cst store; readers seq_cst load
  GENERATION lo   the last to arrive  every rank        seq_cst store after seeing all ARRIVED
  GENERATION hi   a rank about to     the releaser      seq_cst store, then the sleeper looks once
                  sleep (1), the                        more before futex_wait; the releaser loads
                  releaser (0)                          it after its seq_cst GENERATION store
  slot data       its owner rank      every rank        written before the owner's ARRIVED store
                                                        (release by the seq_cst store), read after
                                                        the reader saw every ARRIVED (acquire)
  slot digest     its owner rank      every rank        as slot data
  FAILED          whoever sees a      every rank        one compare-and-swap from -1: the first
                  failure first                         writer wins, so every survivor names the
                                                        same rank; value (why << 32) | rank
  BLOCKED[r]      rank r              every rank        relaxed: advice for naming a stall
  PID, START,     rank r at set-up    every rank        written before the set-up's store round
  CLOSED[r]       rank r at close     every rank        relaxed; a rank that sees it stops waiting

A barrier is the Dekker pattern twice (a store of one's own word, then loads of the others'),
so it needs sequentially consistent atomics; the C11 atomics below give them on x86 (a locked
store) and on ARM (stlr/ldar) alike. Two ranks arriving last at the same instant each see the
other's ARRIVED (seq_cst forbids both loads passing both stores), so one of them releases.

Alternating slots (parity) between collectives makes a barrier per collective enough: a rank
back at a parity has passed a barrier of the collective in between, which every rank reached
after it finished reading this parity's slots.

WAITING: look (yielding the core between looks, or a pause) for spin_ns, then sleep in the kernel on GENERATION with a
futex (the kernel compares the word first, so a release between the last look and the sleep is
not lost), at most nap_ns at a time. Every check_ns the waiter checks its peers' processes
(/proc/<pid>/stat: gone, a zombie, or another process with that pid all count as dead), the
group's FAILED word and the deadline, and returns a status instead of waiting on.
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* statuses a wait or a collective returns (besides OK) */
enum { OK = 0, DIED = 1, TIMEOUT = 2, FAILED = 3, MISMATCH = 4, CANCELLED = 5 };
/* reduce ops, as Python numbers them (REDUCE_OPS in native.py) */
enum { OP_SUM, OP_AVG, OP_PRODUCT, OP_MIN, OP_MAX, OP_BAND, OP_BOR, OP_BXOR };
/* dtypes, as Python numbers them (DTYPES in native.py) */
enum { T_F32, T_F64, T_F16, T_BF16, T_I8, T_U8, T_I16, T_I32, T_I64, T_BOOL, T_COUNT };
static const int ITEMSIZE[T_COUNT] = {4, 8, 2, 2, 1, 1, 2, 4, 8, 1};

#define MAX_RANKS 256
#define BLOCK 2048           /* elements reduced at a time: a float accumulator of 8 KiB stays in L1 */
#define SLOT_HEADER 64

#if defined(__x86_64__) || defined(__i386__)
#define PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define PAUSE() __asm__ __volatile__("yield")
#else
#define PAUSE() ((void)0)
#endif

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void futex_wait32(_Atomic int32_t *word, int32_t expected, int64_t ns) {
    struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
    syscall(SYS_futex, (int32_t *)word, FUTEX_WAIT, expected, &ts, NULL, 0);
}

static void futex_wake32(_Atomic int32_t *word) {
    syscall(SYS_futex, (int32_t *)word, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* ---- liveness --------------------------------------------------------------------------- */

/* The process's start time in clock ticks, or -1 if it is gone or a zombie. */
static long long start_time(long long pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%lld/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return -1;
    p += 2;                                  /* the state */
    if (*p == 'Z' || *p == 'X') return -1;
    for (int field = 3; field < 22 && *p; field++) {    /* on to field 22, starttime */
        p = strchr(p, ' ');
        if (!p) return -1;
        p++;
    }
    return strtoll(p, NULL, 10);
}

/* ---- the group ---------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    char *base;                          /* the segment's mapping (0 once closed) */
    int rank, size;
    _Atomic int64_t *failed;             /* FAILED */
    _Atomic int32_t *generation;         /* GENERATION's low half; its high half: someone sleeps */
    _Atomic int32_t *sleepers;
    _Atomic int32_t *arrived[MAX_RANKS]; /* ARRIVED's low halves */
    _Atomic int64_t *pid[MAX_RANKS], *start[MAX_RANKS], *closed[MAX_RANKS], *blocked[MAX_RANKS];
    char *region[2];                     /* every rank's slots of each parity */
    int64_t region_bytes, capacity;      /* a slot's bytes, and of data after its header */
    int64_t spin_ns, nap_ns, check_ns;
    int yield_core;                      /* yield the core between looks (a peer may share it) */
    uint32_t barriers;                   /* barriers passed, the same count on every rank */
    uint64_t uses;                       /* collectives begun: their parity */
    int parity;
    int last_peer;                       /* the peer a failed wait was waiting for */
    _Atomic int cancelled;               /* this rank gave the group up (abort): waits end */
} Group;

static inline char *slot(Group *g, int r, int parity) {
    return g->region[parity] + (int64_t)r * g->region_bytes + SLOT_HEADER;
}

static inline int64_t *digest_of(Group *g, int r, int parity) {
    return (int64_t *)(g->region[parity] + (int64_t)r * g->region_bytes);
}

/* A peer's process is alive and has not left. */
static int alive(Group *g, int r) {
    if (atomic_load_explicit(g->closed[r], memory_order_relaxed)) return 0;
    long long pid = atomic_load_explicit(g->pid[r], memory_order_relaxed);
    long long want = atomic_load_explicit(g->start[r], memory_order_relaxed);
    return start_time(pid) == want;
}

/* The first peer that has not reached barrier ``mark``, or -1. */
static int missing(Group *g, uint32_t mark) {
    for (int r = 0; r < g->size; r++) {
        if (r == g->rank) continue;
        uint32_t seen = (uint32_t)atomic_load_explicit(g->arrived[r], memory_order_seq_cst);
        if ((int32_t)(seen - mark) < 0) return r;
    }
    return -1;
}

/* Why waiting must stop now, or OK: a failure recorded, a peer dead or gone, the deadline. */
static int check(Group *g, int waiting_for, int64_t deadline) {
    if (atomic_load_explicit(&g->cancelled, memory_order_relaxed)) return CANCELLED;
    if (atomic_load_explicit(g->failed, memory_order_acquire) >= 0) return FAILED;
    for (int r = 0; r < g->size; r++) {
        if (r != g->rank && !alive(g, r)) {
            g->last_peer = r;
            return DIED;
        }
    }
    if (now_ns() >= deadline) {
        g->last_peer = waiting_for;
        return TIMEOUT;
    }
    return OK;
}

static void release(Group *g, uint32_t mark) {
    atomic_store_explicit(g->generation, (int32_t)mark, memory_order_seq_cst);
    if (atomic_load_explicit(g->sleepers, memory_order_seq_cst)) {
        atomic_store_explicit(g->sleepers, 0, memory_order_relaxed);
        futex_wake32(g->generation);
    }
}

/* Wait (GIL released by the caller) until every rank reached barrier ``mark``. */
static int wait_for(Group *g, uint32_t mark, int64_t deadline) {
    int64_t t0 = now_ns(), next_check = t0 + g->check_ns, spin_until = t0 + g->spin_ns;
    int status = OK;
    int who = missing(g, mark);
    if (who < 0) { release(g, mark); return OK; }
    for (;;) {
        /* spin: the peer is likely running on another core right now */
        while (now_ns() < spin_until) {
            if ((int32_t)((uint32_t)atomic_load_explicit(g->generation, memory_order_acquire) - mark) >= 0)
                goto done;
            if (g->yield_core) sched_yield(); else PAUSE();
        }
        atomic_store_explicit(g->blocked[g->rank], who, memory_order_relaxed);
        atomic_store_explicit(g->sleepers, 1, memory_order_seq_cst);     /* say so, then look again */
        int32_t seen = atomic_load_explicit(g->generation, memory_order_seq_cst);
        if ((int32_t)((uint32_t)seen - mark) >= 0) goto done;
        who = missing(g, mark);
        if (who < 0) { release(g, mark); goto done; }    /* all here, nobody released: we do */
        int64_t now = now_ns();
        if (now >= next_check || now >= deadline) {
            status = check(g, who, deadline);
            if (status != OK) goto done;
            next_check = now + g->check_ns;
        }
        int64_t nap = g->nap_ns;
        if (next_check - now < nap) nap = next_check - now;
        if (nap < 100000) nap = 100000;
        futex_wait32(g->generation, seen, nap);
        spin_until = now_ns() + g->spin_ns / 4;       /* woken: a short spin before sleeping again */
    }
done:
    /* a failed wait keeps its word until the failure is recorded: a peer following the chain
       meanwhile would find this rank free and name it (a survivor named so in a campaign) */
    if (status == OK) atomic_store_explicit(g->blocked[g->rank], -1, memory_order_relaxed);
    return status;
}

/* One barrier: publish arrival, wait for everyone. */
static int barrier(Group *g, int64_t deadline) {
    if (atomic_load_explicit(g->failed, memory_order_acquire) >= 0) return FAILED;
    g->barriers++;
    uint32_t mark = g->barriers & 0x7fffffffu;
    atomic_store_explicit(g->arrived[g->rank], (int32_t)mark, memory_order_seq_cst);
    return wait_for(g, mark, deadline);
}

/* ``what``: the collective (bits 56-63), its dtype (48-55) and elements per rank (0-47), beside
   the digest so that ranks that disagree can say how: (collective << 56) | (dtype << 48) | count. */
static int begin(Group *g, int64_t d0, int64_t d1, int64_t what) {
    g->parity = (int)(g->uses & 1);
    g->uses++;
    int64_t *mine = digest_of(g, g->rank, g->parity);
    mine[0] = d0;
    mine[1] = d1;
    mine[2] = what;
    return g->parity;
}

static inline int64_t describe(int collective, int dtype, int64_t count) {
    return ((int64_t)collective << 56) | ((int64_t)dtype << 48) | (count & 0xFFFFFFFFFFFFLL);
}

/* After the first barrier: every rank runs this collective (its digest is ours). */
static int digests_agree(Group *g) {
    int64_t *mine = digest_of(g, g->rank, g->parity);
    for (int r = 0; r < g->size; r++) {
        int64_t *theirs = digest_of(g, r, g->parity);
        if (theirs[0] != mine[0] || theirs[1] != mine[1]) {
            g->last_peer = r;
            return MISMATCH;
        }
    }
    return OK;
}

/* ---- reductions ----------------------------------------------------------------------------
   out[i] = op(src[0][i], ..., src[n-1][i]) in rank order, so that every rank computes the same
   bits; floats of 16 bits are added in float and rounded once. Written once per (type, op)
   by a macro; the compiler vectorizes the inner loops (built for the best of AVX-512, AVX2 or
   the baseline the CPU has). */

static inline float f_from_bf16(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t bf16_from_f(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);   /* NaN stays NaN */
    bits += 0x7fffu + ((bits >> 16) & 1);                                               /* round to even */
    return (uint16_t)(bits >> 16);
}

#define ADD(a, b) ((a) + (b))
#define MUL(a, b) ((a) * (b))
#define MIN_(a, b) ((b) < (a) ? (b) : (a))
#define MAX_(a, b) ((b) > (a) ? (b) : (a))
#define AND_(a, b) ((a) & (b))
#define OR_(a, b) ((a) | (b))
#define XOR_(a, b) ((a) ^ (b))

#if defined(__x86_64__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

/* T: the stored type; A: the accumulator's; LOAD/STORE convert between them */
#define REDUCER(NAME, T, A, LOAD, STORE, OP)                                                     \
    CLONES static void NAME(char *out, char *const *src, int n, int64_t count) {                 \
        A acc[BLOCK];                                                                            \
        for (int64_t b = 0; b < count; b += BLOCK) {                                             \
            int64_t m = count - b < BLOCK ? count - b : BLOCK;                                   \
            const T *s0 = (const T *)src[0] + b;                                                 \
            for (int64_t i = 0; i < m; i++) acc[i] = LOAD(s0[i]);                                \
            for (int r = 1; r < n; r++) {                                                        \
                const T *s = (const T *)src[r] + b;                                              \
                for (int64_t i = 0; i < m; i++) acc[i] = OP(acc[i], LOAD(s[i]));                 \
            }                                                                                    \
            T *o = (T *)out + b;                                                                 \
            for (int64_t i = 0; i < m; i++) o[i] = STORE(acc[i]);                                \
        }                                                                                        \
    }

#define SAME(x) (x)
#define F16_LOAD(x) ((float)(x))
#define F16_STORE(x) ((_Float16)(x))
#define BOOL_LOAD(x) ((uint8_t)((x) != 0))

typedef void (*reducer)(char *, char *const *, int, int64_t);

#define FLOAT_OPS(P, T, A, L, S) \
    REDUCER(P##_sum, T, A, L, S, ADD) REDUCER(P##_prod, T, A, L, S, MUL) \
    REDUCER(P##_min, T, A, L, S, MIN_) REDUCER(P##_max, T, A, L, S, MAX_)
#define INT_OPS(P, T) \
    FLOAT_OPS(P, T, T, SAME, SAME) REDUCER(P##_and, T, T, SAME, SAME, AND_) \
    REDUCER(P##_or, T, T, SAME, SAME, OR_) REDUCER(P##_xor, T, T, SAME, SAME, XOR_)

FLOAT_OPS(f32, float, float, SAME, SAME)
FLOAT_OPS(f64, double, double, SAME, SAME)
FLOAT_OPS(f16, _Float16, float, F16_LOAD, F16_STORE)
FLOAT_OPS(bf16, uint16_t, float, f_from_bf16, bf16_from_f)
INT_OPS(i8, int8_t)
INT_OPS(u8, uint8_t)
INT_OPS(i16, int16_t)
INT_OPS(i32, int32_t)
INT_OPS(i64, int64_t)
/* bool, as torch sums it: any (sum), all (product), and the bitwise ops on 0/1 */
REDUCER(b_or, uint8_t, uint8_t, BOOL_LOAD, SAME, OR_)
REDUCER(b_and, uint8_t, uint8_t, BOOL_LOAD, SAME, AND_)
REDUCER(b_xor, uint8_t, uint8_t, BOOL_LOAD, SAME, XOR_)

#define FLOATS(P) {P##_sum, P##_sum, P##_prod, P##_min, P##_max, NULL, NULL, NULL}
#define INTS(P) {P##_sum, NULL, P##_prod, P##_min, P##_max, P##_and, P##_or, P##_xor}
static const reducer REDUCERS[T_COUNT][8] = {
    FLOATS(f32), FLOATS(f64), FLOATS(f16), FLOATS(bf16), INTS(i8), INTS(u8), INTS(i16), INTS(i32), INTS(i64),
    {b_or, NULL, b_and, b_and, b_or, b_and, b_or, b_xor},
};

/* out /= n, for AVG on floats */
static void divide(char *out, int dtype, int64_t count, int n) {
    if (dtype == T_F32) {
        float *o = (float *)out;
        for (int64_t i = 0; i < count; i++) o[i] /= n;
    } else if (dtype == T_F64) {
        double *o = (double *)out;
        for (int64_t i = 0; i < count; i++) o[i] /= n;
    } else if (dtype == T_F16) {
        _Float16 *o = (_Float16 *)out;
        for (int64_t i = 0; i < count; i++) o[i] = (_Float16)((float)o[i] / n);
    } else if (dtype == T_BF16) {
        uint16_t *o = (uint16_t *)out;
        for (int64_t i = 0; i < count; i++) o[i] = bf16_from_f(f_from_bf16(o[i]) / n);
    }
}

static void reduce_into(char *out, char *const *src, int n, int64_t count, int dtype, int op) {
    if (count <= 0) return;
    REDUCERS[dtype][op](out, src, n, count);
    if (op == OP_AVG) divide(out, dtype, count, n);
}

/* ---- the collectives ------------------------------------------------------------------------
   Each runs in pieces that fit a slot; each piece begins a parity, meets the others at one
   barrier (two for the two-shot all-reduce) and checks the digests after its first. */

#define RUN(call)                 \
    do {                          \
        int _s = (call);          \
        if (_s != OK) return _s;  \
    } while (0)

/* One piece of an all-reduce as a read program (compiled from the algorithm's schedule by
   runtime/reads.py): this rank's data goes into its slot, then each round meets the others at
   a barrier and makes its reads. The program is int64 words: rounds, then per round its reads,
   then per read: op (0 reduce, 1 copy), start, stop, publish, complete (the sources and this
   rank are the whole group: AVG divides here), sources, then the sources in rank order. */
static int run_reads(Group *g, char *piece, int64_t m, int dtype, int op, int64_t deadline, int64_t d0,
                     int64_t d1, int check_digests, const int64_t *prog, int64_t words) {
    int isz = ITEMSIZE[dtype];
    char *src[MAX_RANKS];
    int64_t at = 0;
    if (words < 1 || prog[0] <= 0) return OK;       /* nothing to move: no slots, no barrier */
    int parity = begin(g, d0, d1, describe(0, dtype, m));
    char *mine = slot(g, g->rank, parity);
    memcpy(mine, piece, m * isz);
    int64_t rounds = prog[at++];
    for (int64_t k = 0; k < rounds; k++) {
        RUN(barrier(g, deadline));
        if (k == 0 && check_digests) RUN(digests_agree(g));
        int64_t reads = prog[at++];
        for (int64_t i = 0; i < reads; i++) {
            int64_t kind = prog[at], a = prog[at + 1], b = prog[at + 2], publish = prog[at + 3];
            int64_t complete = prog[at + 4], n = prog[at + 5];
            const int64_t *sources = prog + at + 6;
            at += 6 + n;
            if (kind == 1) {
                memcpy(piece + a * isz, slot(g, (int)sources[0], parity) + a * isz, (b - a) * isz);
            } else {
                for (int64_t j = 0; j < n; j++) src[j] = slot(g, (int)sources[j], parity) + a * isz;
                int reduce_op = op == OP_AVG && !complete ? OP_SUM : op;
                reduce_into(piece + a * isz, src, (int)n, b - a, dtype, reduce_op);
            }
            if (publish) memcpy(mine + a * isz, piece + a * isz, (b - a) * isz);
        }
    }
    return OK;
}

/* torch's order: rank r's output gets op over ranks of chunk r of the input (n chunks of count). */
static int reduce_scatter(Group *g, char *out, char *in, int64_t count, int dtype, int op, int64_t deadline,
                          int64_t d0, int64_t d1) {
    int isz = ITEMSIZE[dtype], n = g->size;
    int64_t width = g->capacity / isz / n;            /* columns of every chunk per piece */
    if (width < 1) width = 1;
    char *src[MAX_RANKS];
    int first = 1;
    for (int64_t c = 0; c < count; c += width) {
        int64_t w = count - c < width ? count - c : width;
        int parity = begin(g, d0, d1, describe(1, dtype, count));
        char *mine = slot(g, g->rank, parity);
        for (int r = 0; r < n; r++) memcpy(mine + r * w * isz, in + (r * count + c) * isz, w * isz);
        RUN(barrier(g, deadline));
        if (first) RUN(digests_agree(g));
        first = 0;
        for (int r = 0; r < n; r++) src[r] = slot(g, r, parity) + g->rank * w * isz;
        reduce_into(out + c * isz, src, n, w, dtype, op);
    }
    return OK;
}

static int all_gather(Group *g, char *out, char *in, int64_t count, int dtype, int64_t deadline, int64_t d0,
                      int64_t d1) {
    int isz = ITEMSIZE[dtype], n = g->size;
    int64_t width = g->capacity / isz;
    int first = 1;
    for (int64_t c = 0; c < count; c += width) {
        int64_t w = count - c < width ? count - c : width;
        int parity = begin(g, d0, d1, describe(2, dtype, count));
        memcpy(slot(g, g->rank, parity), in + c * isz, w * isz);
        RUN(barrier(g, deadline));
        if (first) RUN(digests_agree(g));
        first = 0;
        for (int r = 0; r < n; r++) memcpy(out + (r * count + c) * isz, slot(g, r, parity), w * isz);
    }
    return OK;
}

static int broadcast(Group *g, char *data, int64_t count, int dtype, int root, int64_t deadline, int64_t d0,
                     int64_t d1) {
    int isz = ITEMSIZE[dtype];
    int64_t width = g->capacity / isz;
    int first = 1;
    for (int64_t c = 0; c < count; c += width) {
        int64_t w = count - c < width ? count - c : width;
        int parity = begin(g, d0, d1, describe(3, dtype, count));
        if (g->rank == root) memcpy(slot(g, root, parity), data + c * isz, w * isz);
        RUN(barrier(g, deadline));
        if (first) RUN(digests_agree(g));
        first = 0;
        if (g->rank != root) memcpy(data + c * isz, slot(g, root, parity), w * isz);
    }
    return OK;
}

/* ---- Python ------------------------------------------------------------------------------- */

static int ready(Group *g) {
    if (g->base == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the shared-memory group is closed");
        return 0;
    }
    return 1;
}

static int check_dtype_op(int dtype, int op) {
    if (dtype < 0 || dtype >= T_COUNT || op < 0 || op > OP_BXOR || REDUCERS[dtype][op] == NULL) {
        PyErr_Format(PyExc_ValueError, "no reduction for dtype code %d and op code %d", dtype, op);
        return 0;
    }
    return 1;
}

static PyObject *done(Group *g, int status) {
    if (status == OK) Py_RETURN_NONE;
    return Py_BuildValue("(ii)", status, g->last_peer);
}

static int Group_init(Group *g, PyObject *args, PyObject *kw) {
    static char *names[] = {"base", "rank", "size", "words", "region", "region_bytes", "spin_ns", "nap_ns",
                            "check_ns", "yield_core", NULL};
    unsigned long long base;
    PyObject *words;
    long long region, region_bytes, spin, nap, check_every;
    int rank, size, yield_core;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KiiOLLLLLp", names, &base, &rank, &size, &words, &region,
                                     &region_bytes, &spin, &nap, &check_every, &yield_core))
        return -1;
    if (size < 1 || size > MAX_RANKS || rank < 0 || rank >= size) {
        PyErr_Format(PyExc_ValueError, "rank %d of %d: at most %d ranks", rank, size, MAX_RANKS);
        return -1;
    }
    /* words: byte offsets (failed, generation, then per rank: arrived, pid, start, closed, blocked) */
    PyObject *seq = PySequence_Fast(words, "words must be a sequence");
    if (!seq) return -1;
    if (PySequence_Fast_GET_SIZE(seq) != 2 + 5 * size) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "words: failed, generation, then 5 per rank");
        return -1;
    }
    long long at[2 + 5 * MAX_RANKS];
    for (Py_ssize_t i = 0; i < 2 + 5 * size; i++) at[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    Py_DECREF(seq);
    if (PyErr_Occurred()) return -1;
    char *b = (char *)(uintptr_t)base;
    g->base = b;
    g->rank = rank;
    g->size = size;
    g->failed = (_Atomic int64_t *)(b + at[0]);
    g->generation = (_Atomic int32_t *)(b + at[1]);
    g->sleepers = g->generation + 1;
    for (int r = 0; r < size; r++) {
        long long *w = at + 2 + 5 * r;
        g->arrived[r] = (_Atomic int32_t *)(b + w[0]);
        g->pid[r] = (_Atomic int64_t *)(b + w[1]);
        g->start[r] = (_Atomic int64_t *)(b + w[2]);
        g->closed[r] = (_Atomic int64_t *)(b + w[3]);
        g->blocked[r] = (_Atomic int64_t *)(b + w[4]);
    }
    g->region[0] = b + region;
    g->region[1] = b + region + size * region_bytes;
    g->region_bytes = region_bytes;
    g->capacity = region_bytes - SLOT_HEADER;
    g->spin_ns = spin;
    g->nap_ns = nap;
    g->check_ns = check_every;
    g->yield_core = yield_core;
    g->barriers = 0;
    g->uses = 0;
    g->parity = 0;
    g->last_peer = -1;
    atomic_store(&g->cancelled, 0);
    return 0;
}

#define STATUS_DOC "Returns None when done, else (status, local peer): DIED, TIMEOUT, FAILED, MISMATCH, CANCELLED."

static PyObject *Group_run_reads(Group *g, PyObject *args) {
    unsigned long long data;
    long long count, deadline, d0, d1;
    int dtype, op, check_digests, status;
    Py_buffer prog;
    if (!PyArg_ParseTuple(args, "KLiiLLLpy*", &data, &count, &dtype, &op, &deadline, &d0, &d1, &check_digests,
                          &prog))
        return NULL;
    if (!ready(g) || !check_dtype_op(dtype, op)) {
        PyBuffer_Release(&prog);
        return NULL;
    }
    if (count * ITEMSIZE[dtype] > g->capacity) {
        PyBuffer_Release(&prog);
        return PyErr_Format(PyExc_ValueError, "a piece of %lld elements does not fit a slot", count);
    }
    Py_BEGIN_ALLOW_THREADS
    status = run_reads(g, (char *)(uintptr_t)data, count, dtype, op, deadline, d0, d1, check_digests,
                       (const int64_t *)prog.buf, prog.len / 8);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&prog);
    return done(g, status);
}

static PyObject *Group_reduce_scatter(Group *g, PyObject *args) {
    unsigned long long out, in;
    long long count, deadline, d0, d1;
    int dtype, op, status;
    if (!PyArg_ParseTuple(args, "KKLiiLLL", &out, &in, &count, &dtype, &op, &deadline, &d0, &d1)) return NULL;
    if (!ready(g) || !check_dtype_op(dtype, op)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = reduce_scatter(g, (char *)(uintptr_t)out, (char *)(uintptr_t)in, count, dtype, op, deadline, d0, d1);
    Py_END_ALLOW_THREADS
    return done(g, status);
}

static PyObject *Group_all_gather(Group *g, PyObject *args) {
    unsigned long long out, in;
    long long count, deadline, d0, d1;
    int dtype, status;
    if (!PyArg_ParseTuple(args, "KKLiLLL", &out, &in, &count, &dtype, &deadline, &d0, &d1)) return NULL;
    if (!ready(g) || !check_dtype_op(dtype, OP_SUM)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = all_gather(g, (char *)(uintptr_t)out, (char *)(uintptr_t)in, count, dtype, deadline, d0, d1);
    Py_END_ALLOW_THREADS
    return done(g, status);
}

static PyObject *Group_broadcast(Group *g, PyObject *args) {
    unsigned long long data;
    long long count, deadline, d0, d1;
    int dtype, root, status;
    if (!PyArg_ParseTuple(args, "KLiiLLL", &data, &count, &dtype, &root, &deadline, &d0, &d1)) return NULL;
    if (!ready(g) || !check_dtype_op(dtype, OP_SUM)) return NULL;
    if (root < 0 || root >= g->size) return PyErr_Format(PyExc_ValueError, "root %d is not a rank", root);
    Py_BEGIN_ALLOW_THREADS
    status = broadcast(g, (char *)(uintptr_t)data, count, dtype, root, deadline, d0, d1);
    Py_END_ALLOW_THREADS
    return done(g, status);
}

static PyObject *Group_barrier(Group *g, PyObject *args) {
    long long deadline;
    int status;
    if (!PyArg_ParseTuple(args, "L", &deadline)) return NULL;
    if (!ready(g)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = barrier(g, deadline);
    Py_END_ALLOW_THREADS
    return done(g, status);
}

static PyObject *Group_begin(Group *g, PyObject *args) {
    long long d0, d1;
    if (!PyArg_ParseTuple(args, "LL", &d0, &d1)) return NULL;
    if (!ready(g)) return NULL;
    return PyLong_FromLong(begin(g, d0, d1, 0));
}

static PyObject *Group_digests_agree(Group *g, PyObject *noargs) {
    if (!ready(g)) return NULL;
    return done(g, digests_agree(g));
}

static PyObject *Group_record(Group *g, PyObject *args) {
    long long value;
    if (!PyArg_ParseTuple(args, "L", &value)) return NULL;
    if (!ready(g)) return NULL;
    int64_t expected = -1;
    atomic_compare_exchange_strong_explicit(g->failed, &expected, value, memory_order_acq_rel,
                                            memory_order_acquire);
    return PyLong_FromLongLong(atomic_load_explicit(g->failed, memory_order_acquire));
}

static PyObject *Group_alive(Group *g, PyObject *args) {
    int r;
    if (!PyArg_ParseTuple(args, "i", &r)) return NULL;
    if (!ready(g)) return NULL;
    if (r < 0 || r >= g->size) return PyErr_Format(PyExc_ValueError, "rank %d is not a local rank", r);
    return PyBool_FromLong(alive(g, r));
}

static PyObject *Group_cancel(Group *g, PyObject *noargs) {
    atomic_store_explicit(&g->cancelled, 1, memory_order_relaxed);    /* a wait sees it within check_ns */
    Py_RETURN_NONE;
}

static PyObject *Group_close(Group *g, PyObject *noargs) {
    g->base = NULL;               /* every later call raises instead of touching the mapping */
    Py_RETURN_NONE;
}

static PyObject *Group_get_parity(Group *g, void *closure) { return PyLong_FromLong(g->parity); }
static PyObject *Group_get_barriers(Group *g, void *closure) { return PyLong_FromUnsignedLong(g->barriers); }
static PyObject *Group_get_uses(Group *g, void *closure) { return PyLong_FromUnsignedLongLong(g->uses); }
static PyObject *Group_get_capacity(Group *g, void *closure) { return PyLong_FromLongLong(g->capacity); }

static int Group_set_capacity(Group *g, PyObject *value, void *closure) {
    long long c = value ? PyLong_AsLongLong(value) : -1;
    if (c == -1 && PyErr_Occurred()) return -1;
    if (c < 64 || c > g->region_bytes - SLOT_HEADER) {
        PyErr_Format(PyExc_ValueError, "capacity must be 64..%lld bytes, got %lld", g->region_bytes - SLOT_HEADER, c);
        return -1;
    }
    g->capacity = c;          /* smaller slots: messages go in more pieces (tests) */
    return 0;
}
static PyObject *Group_get_closed(Group *g, void *closure) { return PyBool_FromLong(g->base == NULL); }

static PyMethodDef Group_methods[] = {
    {"run_reads", (PyCFunction)Group_run_reads, METH_VARARGS,
     "run_reads(data, count, dtype, op, deadline_ns, digest0, digest1, check_digests, program): one piece "
     "of an all-reduce, in place, by a read program (see run_reads in native.c). " STATUS_DOC},
    {"reduce_scatter", (PyCFunction)Group_reduce_scatter, METH_VARARGS,
     "reduce_scatter(out, in, count, dtype, op, deadline_ns, digest0, digest1): count per rank. " STATUS_DOC},
    {"all_gather", (PyCFunction)Group_all_gather, METH_VARARGS,
     "all_gather(out, in, count, dtype, deadline_ns, digest0, digest1): count per rank. " STATUS_DOC},
    {"broadcast", (PyCFunction)Group_broadcast, METH_VARARGS,
     "broadcast(data, count, dtype, root, deadline_ns, digest0, digest1). " STATUS_DOC},
    {"barrier", (PyCFunction)Group_barrier, METH_VARARGS, "barrier(deadline_ns). " STATUS_DOC},
    {"begin", (PyCFunction)Group_begin, METH_VARARGS,
     "begin(digest0, digest1): start a collective in the next parity's slots; its parity."},
    {"digests_agree", (PyCFunction)Group_digests_agree, METH_NOARGS,
     "After the first barrier: None, or (MISMATCH, first local rank whose digest differs)."},
    {"record", (PyCFunction)Group_record, METH_VARARGS,
     "record(value): compare-and-swap FAILED from -1 to value; the word as it is after."},
    {"alive", (PyCFunction)Group_alive, METH_VARARGS, "alive(local_rank): its process lives, not closed."},
    {"cancel", (PyCFunction)Group_cancel, METH_NOARGS,
     "Give the group up: a wait in progress returns CANCELLED at its next check (thread-safe)."},
    {"close", (PyCFunction)Group_close, METH_NOARGS, "Forget the mapping: later calls raise."},
    {NULL}};

static PyGetSetDef Group_getset[] = {
    {"parity", (getter)Group_get_parity, NULL, "the parity of the collective begun last", NULL},
    {"barriers", (getter)Group_get_barriers, NULL, "barriers passed", NULL},
    {"uses", (getter)Group_get_uses, NULL, "collectives begun", NULL},
    {"capacity", (getter)Group_get_capacity, (setter)Group_set_capacity, "bytes of data a slot holds", NULL},
    {"closed", (getter)Group_get_closed, NULL, "whether close() was called", NULL},
    {NULL}};

static PyTypeObject GroupType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gradsync.runtime.transport.shm._native.Group",
    .tp_basicsize = sizeof(Group),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One rank's view of a group's shared buffers and barrier (see the module's source).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Group_init,
    .tp_methods = Group_methods,
    .tp_getset = Group_getset,
};

static PyObject *mod_futex_wait(PyObject *self, PyObject *args) {
    unsigned long long address;
    int expected;
    long long ns;
    if (!PyArg_ParseTuple(args, "KiL", &address, &expected, &ns)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    futex_wait32((_Atomic int32_t *)(uintptr_t)address, expected, ns > 0 ? ns : 0);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *mod_futex_wake(PyObject *self, PyObject *args) {
    unsigned long long address;
    if (!PyArg_ParseTuple(args, "K", &address)) return NULL;
    futex_wake32((_Atomic int32_t *)(uintptr_t)address);
    Py_RETURN_NONE;
}

static PyObject *mod_load(PyObject *self, PyObject *args) {
    unsigned long long address;
    if (!PyArg_ParseTuple(args, "K", &address)) return NULL;
    return PyLong_FromLongLong(atomic_load_explicit((_Atomic int64_t *)(uintptr_t)address, memory_order_acquire));
}

static PyObject *mod_store(PyObject *self, PyObject *args) {
    unsigned long long address;
    long long value;
    if (!PyArg_ParseTuple(args, "KL", &address, &value)) return NULL;
    atomic_store_explicit((_Atomic int64_t *)(uintptr_t)address, value, memory_order_seq_cst);
    Py_RETURN_NONE;
}

static PyObject *mod_cas(PyObject *self, PyObject *args) {
    unsigned long long address;
    long long expected, value;
    if (!PyArg_ParseTuple(args, "KLL", &address, &expected, &value)) return NULL;
    int64_t e = expected;
    atomic_compare_exchange_strong_explicit((_Atomic int64_t *)(uintptr_t)address, &e, value,
                                            memory_order_acq_rel, memory_order_acquire);
    return PyLong_FromLongLong(e == expected ? value : e);
}

static PyObject *mod_ring(PyObject *self, PyObject *args) {
    unsigned long long address;
    if (!PyArg_ParseTuple(args, "K", &address)) return NULL;
    _Atomic int32_t *bell = (_Atomic int32_t *)(uintptr_t)address;
    atomic_fetch_add_explicit(bell, 1, memory_order_seq_cst);
    futex_wake32(bell);
    Py_RETURN_NONE;
}

static PyObject *mod_reduce(PyObject *self, PyObject *args) {
    unsigned long long out;
    PyObject *sources;
    long long count;
    int dtype, op;
    if (!PyArg_ParseTuple(args, "KOLii", &out, &sources, &count, &dtype, &op)) return NULL;
    if (!check_dtype_op(dtype, op)) return NULL;
    PyObject *seq = PySequence_Fast(sources, "sources must be a sequence of addresses");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > MAX_RANKS) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "between 1 and %d sources, got %zd", MAX_RANKS, n);
    }
    char *src[MAX_RANKS];
    for (Py_ssize_t i = 0; i < n; i++)
        src[i] = (char *)(uintptr_t)PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
    Py_DECREF(seq);
    if (PyErr_Occurred()) return NULL;
    Py_BEGIN_ALLOW_THREADS
    reduce_into((char *)(uintptr_t)out, src, (int)n, count, dtype, op);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"futex_wait", mod_futex_wait, METH_VARARGS,
     "futex_wait(address, expected, timeout_ns): sleep while the int32 there holds expected."},
    {"futex_wake", mod_futex_wake, METH_VARARGS, "futex_wake(address): wake every sleeper on it."},
    {"load", mod_load, METH_VARARGS, "load(address): the int64 there (acquire)."},
    {"store", mod_store, METH_VARARGS, "store(address, value): write the int64 there (seq_cst)."},
    {"cas", mod_cas, METH_VARARGS,
     "cas(address, expected, value): compare-and-swap an int64; the word's value after."},
    {"ring", mod_ring, METH_VARARGS,
     "ring(address): add one to the int32 doorbell there and wake whoever sleeps on it."},
    {"reduce", mod_reduce, METH_VARARGS,
     "reduce(out, [sources], count, dtype, op): out = op over the sources, in their order."},
    {NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_native",
                                       "gradsync's shared-buffer collectives in C (see native.c).", -1,
                                       module_methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&GroupType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    Py_INCREF(&GroupType);
    PyModule_AddObject(m, "Group", (PyObject *)&GroupType);
    PyModule_AddIntConstant(m, "OK", OK);
    PyModule_AddIntConstant(m, "DIED", DIED);
    PyModule_AddIntConstant(m, "TIMEOUT", TIMEOUT);
    PyModule_AddIntConstant(m, "FAILED", FAILED);
    PyModule_AddIntConstant(m, "MISMATCH", MISMATCH);
    PyModule_AddIntConstant(m, "CANCELLED", CANCELLED);
    PyModule_AddIntConstant(m, "MAX_RANKS", MAX_RANKS);
    PyModule_AddIntConstant(m, "SLOT_HEADER", SLOT_HEADER);
    return m;
}
