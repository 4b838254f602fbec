/* The read-ahead stage: reads issued in the sampler's order by native IO threads, apart from
 * the kernel threads that decode.
 *
 * NOTE [ Read-ahead ]
 * On storage where a read costs milliseconds (network filesystems, object-store mounts, cold
 * disks), a kernel thread that reads its own sample spends most of its time blocked: with two
 * threads there are two reads in flight, and the cores idle (0.16x of the CPU ceiling at 4 ms
 * per file). Here reads are a stage of their own:
 *
 * - The engine knows the epoch's order in advance (the RunState stream), so it queues reads
 *   for the next stream positions (``ll_reader_queue``), oldest first, each into a free slot
 *   of a pool of ``cap`` (found again through ``map[pos % mapn]``). A queued read holds its
 *   own copy of what to read (a path, or a descriptor, offset and length) and, once read,
 *   its bytes. At most ``limit`` slots are in use (the memory bound the owner sets); free
 *   slots are reused last-in first-out, so only as many buffers grow to a file's size as
 *   were ever in use at once.
 * - ``depth`` native IO threads take queued reads in order and issue blocking reads, so
 *   ``depth`` reads are in flight whatever the number of kernel threads. The threads block
 *   every signal and wait on a condition variable when idle; threads above ``depth`` (the
 *   depth was lowered) park until it is raised again.
 * - A batch queued on the kernel team (``_chain.start_into``) first attaches its items to
 *   their slots (``ll_reader_attach``): items whose bytes have arrived are ready at once;
 *   the others are ready when their read completes. The kernel threads claim a batch's
 *   items *in the order their bytes arrived* (``ll_rwait_next``), so a thread never waits on
 *   a slow read while another item of the batch is ready, and blocks only when none is.
 *   Each item still writes its own output slot with its own (seed, epoch, index) key, so
 *   the batch is bitwise the same for any depth, thread count or arrival order.
 * - An item whose position was never queued (the ring was full, or read-ahead is off) is
 *   read in the kernel pass as before; positions below the last attached batch's end are
 *   never queued afterwards (``floor``), so no slot is left without a reader.
 * - A read that does not complete within the wait's deadline fails its item ("did not
 *   complete within N s"); its slot is orphaned and freed when the read finally returns.
 *
 * The reader belongs to one process (after fork() the child's copy has no threads) and is
 * reference-counted: the owner and each IO thread hold a reference, so a thread stuck in a
 * read that never returns (a hung mount) keeps only the reader's memory alive, and never
 * blocks interpreter exit (closing joins the threads for a bounded time and detaches those
 * still in a read: NOTE [ Closing the read-ahead ]).
 *
 * NOTE [ Read-ahead mechanism ]
 * Blocking reads on a pool of native threads, not io_uring, by measurement
 * (benchmarks/io_mechanism.py: 1,024 files of 47 KiB through the latency filesystem at 4 ms
 * per file, files/s at D reads in flight):
 *
 *     D    threads   io_uring   io_uring + IOSQE_ASYNC   + raised io-wq worker limits
 *     16     3,560        426                    3,290                          3,298
 *     64    11,943        407                    2,803                         11,068
 *     256   14,841        306                    2,778                         16,458
 *
 * Plain io_uring serialises the opens on a FUSE mount once its entries are cached; forced
 * async it runs each request on io-wq's capped worker pool; only with the limits raised does
 * it match the threads, as a kernel-managed thread pool at equal or higher CPU per file (33 +
 * 66 us of reader + daemon CPU per file for the threads at D = 256, 35 + 70 for io_uring) and
 * with a liburing dependency the wheel would have to bundle. On warm local files both cost
 * 9-18 us of CPU per file. A thread costs a 256 KiB stack; the depth is capped at
 * LL_READER_MAX_THREADS.
 */
#ifndef LL_READAHEAD_H
#define LL_READAHEAD_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifndef _WIN32
#include <sys/resource.h> /* getrusage(RUSAGE_THREAD): voluntary context switches */
#endif

#include "ll_chain.h"
#include "ll_common.h" /* ll_now_ns */
#include "ll_pool.h"
#include "ll_read.h"

#define LL_READER_MAX_THREADS 1024
#define LL_LAT_BINS 96 /* latency histogram: bin b holds [2^(b/4), 2^((b+1)/4)) microseconds */

enum { LL_RQ_FREE = 0, LL_RQ_QUEUED = 1, LL_RQ_READING = 2, LL_RQ_DONE = 3 };

struct ll_rwait;

typedef struct ll_rreq {
    int64_t pos;        /* stream position */
    int state;
    int orphan;         /* its item gave up waiting: free the slot when the read returns */
    int fd;             /* >= 0: ``size`` bytes at ``off`` of this open file; -1: the file ``path`` */
    long long off;
    size_t size;
    ll_buf path;        /* NUL-terminated */
    ll_buf data;
    size_t n;           /* bytes read */
    int status;
    char msg[LL_MSG_LEN];
    int64_t t_queued;
    struct ll_rwait *waiter;   /* the batch waiting for it, or NULL */
    int64_t item;
    struct ll_rreq *qnext;
} ll_rreq;

/* One batch's items, in the order their bytes became ready (NOTE [ Read-ahead ]). */
typedef struct ll_rwait {
    int64_t n, nready;
    int64_t t_first;    /* when a kernel thread first waited on this batch (0: none yet) */
    int64_t *order;     /* n entries: item numbers, in the order they became ready */
    int64_t *slot;      /* n entries: the item's slot; -1: read in the pass; -2: gave up */
} ll_rwait;

typedef struct {
    ll_mutex mu;
    ll_cond work;       /* a read was queued, the depth changed, or stop */
    ll_cond arrived;    /* a read finished, or stop */
    ll_rreq *slots;     /* cap entries, touched lazily (NOTE [ Read slots are touched lazily ]) */
    int64_t cap;
    int64_t fresh;      /* slots handed out at least once: slots[fresh..cap) were never touched */
    int64_t *freelist;  /* free slots among the first ``fresh``, the most recently freed last */
    int64_t nfree;
    int64_t *map;       /* map[pos % mapn]: 1 + the slot holding position pos, or 0 */
    int64_t mapn;
    int64_t limit;      /* slots in use at most */
    ll_rreq *qhead, *qtail;
    int depth;          /* IO threads that may read at once */
    int nthreads;       /* started */
    int alive;          /* started and not yet past their last use of the reader's state */
    ll_cond gone;       /* an IO thread is about to exit */
#ifndef _WIN32
    pthread_t *tids;    /* the threads not yet joined or detached (ntids of them) */
    int ntids, tidcap;
#endif
    int reading;        /* reads in progress now */
    int stop;
    int refs;           /* the owner and each thread */
    int64_t floor;      /* positions below it are never queued again */
    ll_pid pid;
    /* counters, under mu */
    int64_t reads, failures, bytes, lat_ns, cpu_ns, queue_ns, queued;
    int64_t blocked;    /* reads during which the IO thread slept (-1: not measurable here) */
    int64_t taken, wait_ns;   /* items the kernel threads took, and how long they waited for bytes */
    uint32_t hist[LL_LAT_BINS];
} ll_reader;

/* Voluntary context switches of the calling thread so far, -1 where not measurable. A read
 * served from the page cache never sleeps; one that waits for storage does, however busy the
 * cores are, where CPU time against wall time cannot tell a wait for storage from a wait for a
 * core (NOTE [ Reads that are work ]). */
static int64_t ll_thread_vcsw(void) {
#if defined(RUSAGE_THREAD)
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) != 0) return -1;
    return (int64_t)ru.ru_nvcsw;
#else
    return -1;
#endif
}

static int64_t ll_thread_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The histogram bin of a latency: 4 bins per octave of microseconds (no libm). */
static int ll_lat_bin(int64_t ns) {
    const double us = (double)ns / 1000.0;
    const double step = 1.189207115002721; /* 2^(1/4) */
    double edge = step;
    int b = 0;
    while (b < LL_LAT_BINS - 1 && us >= edge) {
        edge *= step;
        b++;
    }
    return b;
}

/* NOTE [ Read slots are touched lazily ]
 * A reader is sized for the deepest read-ahead it may be asked for (the batches queued plus
 * twice LL_READER_MAX_THREADS: 2,112 slots of about 320 bytes for batches of 32), but a
 * loader over a small dataset, a short-lived loader or one reading inline uses a few dozen.
 * Writing every slot, map entry and free-list entry when the reader opens made each reader
 * resident for about 0.66 MB whatever it read. So the three tables are zero pages until
 * used: they are anonymous mappings (calloc elsewhere), the map stores 1 + the slot (0 is
 * empty, which is what a fresh page holds), slots are handed out from ``fresh`` upwards before
 * any freed one is reused, and the free list only ever holds slots that were handed out. A
 * reader's resident tables grow with the slots it has actually used (``fresh``, the
 * ``slots_touched`` counter) and the positions it has mapped. */
static void *ll_lazy_zalloc(size_t n) {
#ifndef _WIN32
    if (n == 0) n = 1;
    void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return m == MAP_FAILED ? NULL : m;
#else
    return calloc(1, n);
#endif
}

static void ll_lazy_free(void *p, size_t n) {
    if (p == NULL) return;
#ifndef _WIN32
    munmap(p, n == 0 ? 1 : n);
#else
    (void)n;
    free(p);
#endif
}

/* NOTE [ Every read counts ]
 * The reader's counters cover the reads of its IO threads. A sample whose read was not queued
 * (reading inline on warm files, NOTE [ Reads that are work ] in _extract/readahead.py, or the
 * slots were full, or there is no read-ahead stage) is read by the kernel thread that decodes
 * it, and those reads are counted per batch here: the kernel threads add to the batch's tally
 * with relaxed atomics (three adds and one histogram bin per sample, no lock), and the owner
 * reads it once the batch has finished. So the Extract figures (reads, bytes/s, latency) count
 * every byte the loader read, not only the read-ahead's. */
typedef struct {
    int64_t reads, bytes, ns;
    uint32_t hist[LL_LAT_BINS];
} ll_inline_reads;

static void ll_inline_count(ll_inline_reads *c, int64_t nbytes, int64_t ns) {
    __atomic_fetch_add(&c->reads, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&c->bytes, nbytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&c->ns, ns, __ATOMIC_RELAXED);
    __atomic_fetch_add(&c->hist[ll_lat_bin(ns)], 1u, __ATOMIC_RELAXED);
}

static void ll_reader_free_mem(ll_reader *r) {
    if (r->slots) {
        for (int64_t i = 0; i < r->fresh; i++) {
            ll_buf_free(&r->slots[i].path);
            ll_buf_free(&r->slots[i].data);
        }
    }
    ll_lazy_free(r->slots, (size_t)r->cap * sizeof(ll_rreq));
    ll_lazy_free(r->freelist, (size_t)r->cap * sizeof(int64_t));
    ll_lazy_free(r->map, (size_t)r->mapn * sizeof(int64_t));
#ifndef _WIN32
    free(r->tids);
#endif
    free(r);
}

/* The slot holding stream position ``pos``, or -1 (caller holds mu). */
static int64_t ll_reader_slot_of(const ll_reader *r, int64_t pos) {
    return pos >= 0 ? r->map[pos % r->mapn] - 1 : -1;
}

/* Give slot ``s`` back (caller holds mu). */
static void ll_reader_free_slot(ll_reader *r, int64_t s) {
    ll_rreq *q = &r->slots[s];
    if (q->state == LL_RQ_FREE && q->pos < 0) return; /* already on the free list */
    if (q->pos >= 0 && ll_reader_slot_of(r, q->pos) == s) r->map[q->pos % r->mapn] = 0;
    q->state = LL_RQ_FREE;
    q->waiter = NULL;
    q->orphan = 0;
    q->pos = -1;
    r->freelist[r->nfree++] = s;
}

/* Drop one reference; the last one frees the reader (caller does not hold mu). */
static void ll_reader_unref(ll_reader *r) {
    ll_mutex_lock(&r->mu);
    int last = --r->refs == 0;
    ll_mutex_unlock(&r->mu);
    if (last) {
        ll_cond_destroy(&r->work);
        ll_cond_destroy(&r->arrived);
        ll_cond_destroy(&r->gone);
        ll_mutex_destroy(&r->mu);
        ll_reader_free_mem(r);
    }
}

typedef struct {
    ll_reader *r;
    int id;
} ll_reader_arg;

/* Perform one read into q (no lock held: q is this thread's until it is marked done). */
static void ll_reader_do(ll_rreq *q) {
    size_t n = 0;
    q->msg[0] = 0;
    if (q->fd < 0) {
        q->status = ll_read_file((const char *)q->path.p, &q->data, &n, q->msg);
    } else if (ll_buf_reserve(&q->data, q->size > 0 ? q->size : 1) != 0) {
        snprintf(q->msg, LL_MSG_LEN, "out of memory reading %zu bytes", q->size);
        q->status = LL_ERR_NOMEM;
    } else {
        q->status = ll_pread_all(q->fd, q->data.p, q->size, q->off, q->msg);
        n = q->size;
    }
    q->n = q->status == LL_OK ? n : 0;
}

static LL_THREAD_RET ll_reader_thread(void *arg) {
    ll_reader_arg a = *(ll_reader_arg *)arg;
    free(arg);
    ll_reader *r = a.r;
    ll_name_thread("ll-io", a.id);   /* NOTE [ Thread names ] in ll_pool.h */
    ll_mutex_lock(&r->mu);
    for (;;) {
        if (r->stop) break;
        if (a.id >= r->depth || r->qhead == NULL) {
            ll_cond_wait(&r->work, &r->mu);
            continue;
        }
        ll_rreq *q = r->qhead;
        r->qhead = q->qnext;
        if (r->qhead == NULL) r->qtail = NULL;
        q->qnext = NULL;
        q->state = LL_RQ_READING;
        r->reading++;
        ll_mutex_unlock(&r->mu);

        const int64_t t0 = ll_now_ns(), c0 = ll_thread_cpu_ns(), v0 = ll_thread_vcsw();
        ll_reader_do(q);
        const int64_t t1 = ll_now_ns(), c1 = ll_thread_cpu_ns(), v1 = ll_thread_vcsw();

        ll_mutex_lock(&r->mu);
        r->reading--;
        r->reads++;
        if (q->status != LL_OK) r->failures++;
        r->bytes += (int64_t)q->n;
        r->lat_ns += t1 - t0;
        r->cpu_ns += c1 - c0;
        if (v0 < 0 || v1 < 0) r->blocked = -1;
        else if (r->blocked >= 0 && v1 > v0) r->blocked++;
        r->queue_ns += t0 - q->t_queued;
        r->hist[ll_lat_bin(t1 - t0)]++;
        if (q->orphan) {
            ll_reader_free_slot(r, q - r->slots);
        } else {
            q->state = LL_RQ_DONE;
            ll_rwait *w = q->waiter;
            if (w != NULL) w->order[w->nready++] = q->item;
        }
        ll_cond_broadcast(&r->arrived);
    }
    r->alive--;
    ll_cond_broadcast(&r->gone);
    ll_mutex_unlock(&r->mu);
    ll_reader_unref(r);
    return 0;
}

/* Start IO threads up to the depth (caller holds mu). Returns the threads running. The
 * threads are joinable: ll_reader_join joins them, or detaches those still in a read when
 * its bound runs out (NOTE [ Closing the read-ahead ]). */
static int ll_reader_grow(ll_reader *r) {
#ifndef _WIN32
    while (!r->stop && r->nthreads < r->depth && r->nthreads < LL_READER_MAX_THREADS) {
        if (r->ntids == r->tidcap) {
            const int cap = r->tidcap ? 2 * r->tidcap : 16;
            pthread_t *t = (pthread_t *)realloc(r->tids, (size_t)cap * sizeof(pthread_t));
            if (t == NULL) break;
            r->tids = t;
            r->tidcap = cap;
        }
        ll_reader_arg *a = (ll_reader_arg *)malloc(sizeof(ll_reader_arg));
        if (a == NULL) break;
        a->r = r;
        a->id = r->nthreads;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        sigset_t old;
        LL_BLOCK_SIGNALS(old);
        pthread_t t;
        int failed = pthread_create(&t, &attr, ll_reader_thread, a);
        LL_RESTORE_SIGNALS(old);
        pthread_attr_destroy(&attr);
        if (failed) {
            free(a);
            break;
        }
#if defined(__linux__)
        {   /* named by its creator too, so the name is there as soon as this returns */
            char name[32];
            snprintf(name, sizeof name, "ll-io-%d", r->nthreads);
            name[15] = 0; /* the kernel keeps 15 characters */
            pthread_setname_np(t, name);
        }
#endif
        r->tids[r->ntids++] = t;
        r->nthreads++;
        r->alive++;
        r->refs++;
    }
#endif
    return r->nthreads;
}

static int ll_clamp_depth(int depth) {
    return depth < 1 ? 1 : depth > LL_READER_MAX_THREADS ? LL_READER_MAX_THREADS : depth;
}

/* A reader with ``cap`` slots and ``depth`` IO threads, or NULL (no memory). */
static ll_reader *ll_reader_new(int64_t cap, int depth) {
    if (cap < 1) return NULL;
    ll_reader *r = (ll_reader *)calloc(1, sizeof(ll_reader));
    if (r == NULL) return NULL;
    r->cap = cap;
    r->mapn = 4 * cap;
    /* Zero pages until used (NOTE [ Read slots are touched lazily ]). */
    r->slots = (ll_rreq *)ll_lazy_zalloc((size_t)cap * sizeof(ll_rreq));
    r->freelist = (int64_t *)ll_lazy_zalloc((size_t)cap * sizeof(int64_t));
    r->map = (int64_t *)ll_lazy_zalloc((size_t)r->mapn * sizeof(int64_t));
    if (r->slots == NULL || r->freelist == NULL || r->map == NULL || ll_mutex_init(&r->mu) != 0) {
        ll_lazy_free(r->slots, (size_t)cap * sizeof(ll_rreq));
        ll_lazy_free(r->freelist, (size_t)cap * sizeof(int64_t));
        ll_lazy_free(r->map, (size_t)r->mapn * sizeof(int64_t));
        free(r);
        return NULL;
    }
    ll_cond_init(&r->work);
    ll_cond_init(&r->arrived);
    ll_cond_init(&r->gone);
    r->limit = cap;
    r->refs = 1;
    r->pid = ll_getpid();
    r->depth = ll_clamp_depth(depth);
    ll_mutex_lock(&r->mu);
    ll_reader_grow(r);
    ll_mutex_unlock(&r->mu);
    return r;
}

static int ll_reader_usable(const ll_reader *r) { return r != NULL && r->pid == ll_getpid(); }

/* Use at most ``limit`` slots from now on (1 to cap). */
static void ll_reader_set_limit(ll_reader *r, int64_t limit) {
    ll_mutex_lock(&r->mu);
    r->limit = limit < 1 ? 1 : limit > r->cap ? r->cap : limit;
    ll_mutex_unlock(&r->mu);
}

/* Free the buffers of the slots not in use, and the allocator's free pages with them: the
 * read-ahead holds few bytes from now on (NOTE [ Read-ahead memory ]). A slot taken again
 * grows its buffer again. */
static void ll_reader_trim(ll_reader *r) {
    ll_mutex_lock(&r->mu);
    for (int64_t i = 0; i < r->nfree; i++) {
        ll_rreq *q = &r->slots[r->freelist[i]];
        ll_buf_free(&q->data);
        ll_buf_free(&q->path);
    }
    ll_mutex_unlock(&r->mu);
    ll_release_free_memory(); /* the buffers sit in the IO threads' arenas, below LL_BUF_MAP_MIN */
}

/* Set the number of reads in flight; returns the IO threads running. */
static int ll_reader_set_depth(ll_reader *r, int depth) {
    ll_mutex_lock(&r->mu);
    r->depth = ll_clamp_depth(depth);
    int n = ll_reader_grow(r);
    ll_cond_broadcast(&r->work);
    ll_mutex_unlock(&r->mu);
    return n;
}

/* Queue reads for stream positions pos[0..n) (increasing; files: paths[k], NUL-terminated;
 * ranges: fds[k], offs[k], sizes[k]). Positions below the floor are passed over; queuing
 * stops when ``limit`` slots are in use. Returns how many positions were handled (queued or
 * passed over). */
static int64_t ll_reader_queue(ll_reader *r, const int64_t *pos, int64_t n, const char *const *paths,
                               const int32_t *fds, const int64_t *offs, const int64_t *sizes) {
    int64_t k = 0, queued = 0;
    const int64_t now = ll_now_ns();
    ll_mutex_lock(&r->mu);
    for (; k < n && !r->stop; k++) {
        if (pos[k] < r->floor || pos[k] < 0) continue;
        if ((r->nfree == 0 && r->fresh == r->cap) || r->fresh - r->nfree >= r->limit
            || ll_reader_slot_of(r, pos[k]) >= 0)
            break;
        /* A freed slot first (its buffers are warm), else the next never-touched one. */
        const int64_t s = r->nfree > 0 ? r->freelist[r->nfree - 1] : r->fresh;
        ll_rreq *q = &r->slots[s];
        if (paths != NULL) {
            size_t len = strlen(paths[k]);
            if (ll_buf_reserve(&q->path, len + 1) != 0) break;
            memcpy(q->path.p, paths[k], len + 1);
            q->fd = -1;
        } else {
            q->fd = fds[k];
            q->off = offs[k];
            q->size = (size_t)sizes[k];
        }
        if (r->nfree > 0) r->nfree--;
        else r->fresh++;
        r->map[pos[k] % r->mapn] = s + 1;
        q->pos = pos[k];
        q->state = LL_RQ_QUEUED;
        q->orphan = 0;
        q->waiter = NULL;
        q->status = LL_OK;
        q->t_queued = now;
        q->qnext = NULL;
        if (r->qtail) r->qtail->qnext = q;
        else r->qhead = q;
        r->qtail = q;
        r->queued++;
        queued++;
    }
    if (queued) ll_cond_broadcast(&r->work);
    ll_mutex_unlock(&r->mu);
    return k;
}

/* Attach a batch's items (stream positions pos[0..n)) to their reads; w->order and w->slot
 * must hold n entries. Items already read are ready at once; items never queued are ready at
 * once too, and read in the pass (w->slot[i] = -1). Raises the floor past the batch. */
static void ll_reader_attach(ll_reader *r, ll_rwait *w, const int64_t *pos, int64_t n) {
    w->n = n;
    w->nready = 0;
    w->t_first = 0;
    ll_mutex_lock(&r->mu);
    for (int64_t i = 0; i < n; i++) {
        const int64_t s = ll_reader_slot_of(r, pos[i]);
        ll_rreq *q = s >= 0 ? &r->slots[s] : NULL;
        if (q != NULL && q->state != LL_RQ_FREE && q->pos == pos[i] && q->waiter == NULL && !q->orphan) {
            /* The batch owns the slot from now on, read or not: a second batch with the same
             * position (an on_error="skip" fill takes samples a queued batch holds) reads
             * it in its pass instead, so each slot is consumed and freed exactly once. */
            w->slot[i] = s;
            q->waiter = w;
            q->item = i;
            if (q->state == LL_RQ_DONE) w->order[w->nready++] = i;
        } else {
            w->slot[i] = -1;
            w->order[w->nready++] = i;
        }
        if (pos[i] + 1 > r->floor) r->floor = pos[i] + 1;
    }
    ll_mutex_unlock(&r->mu);
}

/* Nobody waits for slot ``s`` any more (caller holds mu): a read not started leaves the queue
 * and frees the slot, one in progress frees it when it returns (orphan), one dropped by
 * ll_reader_stop stays as it is. */
static void ll_reader_abandon(ll_reader *r, int64_t s) {
    ll_rreq *q = &r->slots[s];
    q->waiter = NULL;
    if (q->state == LL_RQ_QUEUED) {
        ll_rreq *prev = NULL;
        for (ll_rreq *x = r->qhead; x != NULL; prev = x, x = x->qnext) {
            if (x != q) continue;
            if (prev) prev->qnext = x->qnext;
            else r->qhead = x->qnext;
            if (r->qtail == x) r->qtail = prev;
            break;
        }
        q->qnext = NULL;
        ll_reader_free_slot(r, s);
    } else if (q->state == LL_RQ_READING) {
        q->orphan = 1;
    }
}

/* Batch ``w`` will not run (a gated job taken back, NOTE [ Batches in memory ]): every slot it
 * owns is given up, read or not; a later pass reads those positions itself (they are below
 * ``floor``, so they are never queued again). */
static void ll_reader_detach(ll_reader *r, ll_rwait *w) {
    ll_mutex_lock(&r->mu);
    for (int64_t i = 0; i < w->n; i++) {
        const int64_t s = w->slot[i];
        if (s < 0) continue;
        ll_rreq *q = &r->slots[s];
        if (q->waiter != w || q->item != i) continue;
        if (q->state == LL_RQ_DONE) {
            q->waiter = NULL;
            ll_reader_free_slot(r, s);
        } else {
            ll_reader_abandon(r, s);
        }
        w->slot[i] = -1;
    }
    ll_mutex_unlock(&r->mu);
}

/* Wait (caller holds mu) until a read finishes, the reader stops, or 0.1 s passes, so the
 * caller rechecks its stop flag and its deadline. */
static void ll_reader_wait_arrival(ll_reader *r) {
#ifdef _WIN32
    ll_cond_wait(&r->arrived, &r->mu);
#else
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const long long step = 100000000LL;
    ts.tv_sec += (time_t)((ts.tv_nsec + step) / 1000000000LL);
    ts.tv_nsec = (long)((ts.tv_nsec + step) % 1000000000LL);
    pthread_cond_timedwait(&r->arrived, &r->mu, &ts);
#endif
}

/* Give up on one item of ``w`` whose read has not arrived (caller holds mu): it becomes
 * ready with slot -2 (the caller fails it). Returns 0 when there is none. */
static int ll_rwait_give_up(ll_reader *r, ll_rwait *w) {
    for (int64_t i = 0; i < w->n; i++) {
        const int64_t s = w->slot[i];
        if (s < 0) continue;
        ll_rreq *q = &r->slots[s];
        if (q->waiter != w || q->item != i || q->state == LL_RQ_DONE) continue;
        ll_reader_abandon(r, s);
        w->slot[i] = -2;
        w->order[w->nready++] = i;
        return 1;
    }
    return 0;
}

/* The item to run for claim ``k`` of batch ``w``: the k-th whose bytes arrived, waiting
 * while none is. ``*waited`` gets the nanoseconds waited. Once ``timeout_ns`` (0: no limit)
 * has passed since the batch's first wait, or once the reader stopped, an item still being
 * read is given up (its slot becomes -2: the caller fails it): the limit is the batch's, so a
 * batch whose reads all hang fails within one timeout, not one per item. */
static int64_t ll_rwait_next(ll_reader *r, ll_rwait *w, int64_t k, int64_t timeout_ns, int64_t *waited) {
    int64_t t0 = 0;
    ll_mutex_lock(&r->mu);
    while (w->nready <= k) {
        const int64_t now = ll_now_ns();
        if (!t0) t0 = now;
        if (!w->t_first) w->t_first = now;
        if ((r->stop || (timeout_ns > 0 && now - w->t_first >= timeout_ns)) && ll_rwait_give_up(r, w)) continue;
        ll_reader_wait_arrival(r);
    }
    const int64_t item = w->order[k];
    *waited = t0 ? ll_now_ns() - t0 : 0;
    r->taken++;
    r->wait_ns += *waited;
    ll_mutex_unlock(&r->mu);
    return item;
}

/* The slot holding stream position ``pos`` once its read completed, for a reader outside the
 * kernel passes (the Python engines' samples, NOTE [ Read-ahead for Python reads ]): waits at
 * most ``timeout_ns`` (0: no limit). Returns the slot (the caller copies its bytes and
 * releases it), -1 when ``pos`` was never queued (the caller reads it itself; it will never
 * be queued now), or -2 when the wait timed out or the reader stopped (the slot is given up). */
static int64_t ll_reader_take(ll_reader *r, int64_t pos, int64_t timeout_ns, int64_t *waited) {
    int64_t t0 = ll_now_ns(), s;
    *waited = 0;
    ll_mutex_lock(&r->mu);
    if (pos + 1 > r->floor) r->floor = pos + 1;
    s = ll_reader_slot_of(r, pos);
    if (s < 0 || r->slots[s].pos != pos || r->slots[s].waiter != NULL || r->slots[s].orphan) {
        ll_mutex_unlock(&r->mu);
        return -1;
    }
    ll_rreq *q = &r->slots[s];
    while (q->state != LL_RQ_DONE) {
        const int64_t now = ll_now_ns();
        if (r->stop || (timeout_ns > 0 && now - t0 >= timeout_ns)) {
            ll_reader_abandon(r, s);
            *waited = ll_now_ns() - t0;
            ll_mutex_unlock(&r->mu);
            return -2;
        }
        ll_reader_wait_arrival(r);
    }
    *waited = ll_now_ns() - t0;
    r->taken++;
    r->wait_ns += *waited;
    ll_mutex_unlock(&r->mu);
    return s;
}

/* The slot's bytes are no longer needed: it is free for the next queued position. */
static void ll_reader_release(ll_reader *r, int64_t slot) {
    ll_mutex_lock(&r->mu);
    ll_reader_free_slot(r, slot);
    ll_mutex_unlock(&r->mu);
}

/* Stop: queued reads are dropped, waiting items give up, IO threads exit once their read
 * returns. The reader stays valid for the batches that hold it (ll_reader_close frees it). */
static void ll_reader_stop(ll_reader *r) {
    if (!ll_reader_usable(r)) return;
    ll_mutex_lock(&r->mu);
    r->stop = 1;
    /* Dropped reads keep their waiter: a batch waiting on one gives it up (ll_rwait_give_up). */
    for (ll_rreq *q = r->qhead; q != NULL; q = q->qnext) q->state = LL_RQ_FREE;
    r->qhead = r->qtail = NULL;
    ll_cond_broadcast(&r->work);
    ll_cond_broadcast(&r->arrived);
    ll_mutex_unlock(&r->mu);
}

/* NOTE [ Closing the read-ahead ]
 * ``loader.close()`` promises that no read is in flight, no file of the dataset is open and
 * no IO thread runs once it returns: a mount unmounted, a folder deleted or a file replaced
 * right after it must not race a read still going (at 64 ms per file, 82-94 files were still
 * open and about 50 threads ran right after the old close(), and unmounting failed with
 * "Device or resource busy"). A blocking read cannot be called back, so ll_reader_join stops
 * the reader (queued reads are dropped at once), then waits for the IO threads to leave: each
 * is in at most one read, so the wait lasts at most one read's latency. The threads are
 * joinable and are joined, so none is left in the thread list either. The wait is bounded
 * (``timeout_ns``): a read that never returns (a hung mount) must not hang close(); its
 * thread is detached then, holds a reference that keeps only the reader's memory alive, and
 * the caller is told how many threads were left (it warns). In a child after fork() there is
 * nothing to wait for. */

/* Stop, then wait at most ``timeout_ns`` (0: no limit) for every IO thread to finish its read
 * and exit, and join them (NOTE [ Closing the read-ahead ]); those still in a read then are
 * detached. Returns how many were left running. Safe to call more than once. */
static int ll_reader_join(ll_reader *r, int64_t timeout_ns) {
    if (!ll_reader_usable(r)) return 0;
    ll_reader_stop(r);
#ifdef _WIN32
    (void)timeout_ns;
    return 0;
#else
    const int64_t deadline = timeout_ns > 0 ? ll_now_ns() + timeout_ns : 0;
    ll_mutex_lock(&r->mu);
    while (r->alive > 0) {
        if (deadline && ll_now_ns() >= deadline) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const long long step = 50000000LL; /* recheck the deadline every 50 ms */
        ts.tv_sec += (time_t)((ts.tv_nsec + step) / 1000000000LL);
        ts.tv_nsec = (long)((ts.tv_nsec + step) % 1000000000LL);
        pthread_cond_timedwait(&r->gone, &r->mu, &ts);
    }
    const int left = r->alive;
    pthread_t *tids = r->tids;
    const int n = r->ntids;
    r->tids = NULL;
    r->ntids = r->tidcap = 0;
    ll_mutex_unlock(&r->mu);
    for (int i = 0; i < n; i++) {
        /* With none left every thread is past its last use of the reader: the join is
         * immediate. Otherwise detach all (a finished one is released by it). */
        if (left == 0) pthread_join(tids[i], NULL);
        else pthread_detach(tids[i]);
    }
    free(tids);
    return left;
#endif
}

/* Stop and drop the owner's reference: the last reference (the owner's, or that of an IO
 * thread still in a read) frees the reader. Threads not joined yet are detached first (the
 * owner calls ll_reader_join to wait for them). In a child after fork() only the memory is
 * freed (no thread of the parent's exists here). */
static void ll_reader_close(ll_reader *r) {
    if (r == NULL) return;
    if (!ll_reader_usable(r)) {
        ll_reader_free_mem(r);
        return;
    }
    ll_reader_stop(r);
#ifndef _WIN32
    ll_mutex_lock(&r->mu);
    pthread_t *tids = r->tids;
    const int n = r->ntids;
    r->tids = NULL;
    r->ntids = r->tidcap = 0;
    ll_mutex_unlock(&r->mu);
    for (int i = 0; i < n; i++) pthread_detach(tids[i]);
    free(tids);
#endif
    ll_reader_unref(r);
}

/* Bytes the used slots' buffers hold. */
static int64_t ll_reader_buffer_bytes(ll_reader *r) {
    int64_t total = 0;
    ll_mutex_lock(&r->mu);
    for (int64_t i = 0; i < r->fresh; i++) total += (int64_t)(r->slots[i].data.cap + r->slots[i].path.cap);
    ll_mutex_unlock(&r->mu);
    return total;
}

#endif
