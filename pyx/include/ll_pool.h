/* A persistent OpenMP team fed by a queue of jobs: the fused chain's executor.
 *
 * NOTE [ One queue across batches ]
 * An OpenMP ``prange`` per batch ends with a barrier: every thread waits for the batch's
 * slowest image, then for the Python code that starts the next pass. At 2 threads the
 * bubble is a few per cent; at 64 threads with batches of 64 each thread gets one image and
 * the batch lasts as long as the slowest of 64, so most of the machine idles. Here a batch is
 * a job: its items are claimed one at a time (the dynamic schedule of NOTE [ Dynamic
 * schedule ]) by whichever team thread is free, and a thread that finds the oldest job fully
 * claimed goes straight on to the next queued job. The engine keeps the next batch queued
 * (``lookahead = 2``), so threads flow from batch to batch without a barrier, and the Python
 * work between batches runs beside the kernels instead of between them. A job completes when
 * its last item does; its submitter waits for that alone.
 *
 * - The team is one OpenMP parallel region that lasts as long as the team, opened by one
 *   native thread of its own (ll_pool_main), so it is an OpenMP team like any other:
 *   OMP_PROC_BIND and OMP_PLACES pin it, and its threads' first touch of their scratch
 *   places that memory on their NUMA node (NOTE [ Per-thread entries own their cache lines ]).
 * - Thread ``t`` owns entry ``t`` of the team's per-thread pool (NOTE [ One per-thread pool ]):
 *   items of different jobs on one thread run one after the other, never at once.
 * - A job carries a thread limit (the run's ``num_threads``, which AUTOTUNE may lower):
 *   thread ``t`` takes items only from jobs whose limit is above ``t``.
 * - No lock per item: a thread attaches to a job under the team's mutex once, then claims its
 *   items with an atomic add; it takes the mutex again to detach when the job runs out (and
 *   wakes the submitter). A job is finished when every item is claimed and no thread is
 *   attached. The mutex is taken twice per batch and thread, not per image.
 * - The threads block every signal (they run no Python; signals go to the interpreter's
 *   threads) and wait on a condition variable when idle (no spinning, whatever
 *   OMP_WAIT_POLICY says).
 * - A team belongs to the process that made it: after fork() the child has the structure
 *   but not the threads, so ll_pool_usable() tells the owner to make a new team.
 * - A job may be queued behind a closed gate (``gated``): no thread claims its items until
 *   ll_pool_open(), and ll_pool_withdraw() takes it back unrun while the gate is still closed.
 *   The batch cap queues the next batch this way, aimed at the slot the user still holds,
 *   and the slot's release opens the gate (NOTE [ Batches in memory ] in
 *   loaderlib/_engines/depth.py).
 *
 * NOTE [ Staged items ]
 * With one batch ahead the team still idled at each batch's end: a thread that claimed its
 * last item waits while the others finish theirs (the tail), and then every thread waits
 * while the batch is handed over and the user gives back the slot that opens the next
 * batch's gate. A job may let an idle thread *stage* some of its items while its gate is
 * closed: the thread claims the item (under the mutex: no other claim happens before the
 * gate opens), runs it into scratch of its own (``stage``: the read, the decode and the whole
 * chain; the output the user still holds is not touched), and at the opening copies it into
 * place (``flush``) before claiming the rest as usual. A thread holds at most
 * LL_STAGE_PER_THREAD staged items, a job at most ``stage_max``, and only the first
 * ``stage_max / LL_STAGE_PER_THREAD`` threads stage, so the scratch that stays allocated is
 * ``stage_max`` items' worth whatever the team's size (an eighth of a batch in _chain.pyx).
 * The float RN50 bench at 2 threads (benchmarks/scaling.py, which reports the team's idle
 * share, ll_pool_idle_ns) had its kernel threads idle 4.0-5.9% of the time without staging,
 * 1.7-1.8% with one item a thread, 1.3-1.6% with two and 0.5-1.2% with four (``prefetch=2``:
 * 0.0-0.2%); the CPU per image was the same in the medians of one such run (1.29 ms for both,
 * --repeat 3 --epochs 3), and differed by a few per cent either way between the two in single
 * rounds, so the copies cost little against the run-to-run noise. A thread holding
 * staged items still runs any open job's items (a batch that must finish before the gate can open, a fill
 * after failures, may be queued after it staged); ll_pool_withdraw drops staged items and
 * waits for their threads to let go of the job (at most the item it is running). Whether the
 * bytes of an item were staged is invisible in the output: the same claim runs the same
 * chain into another buffer, and the copy is exact.
 */
#ifndef LL_POOL_H
#define LL_POOL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ll_common.h" /* ll_now_ns */
#ifdef _OPENMP
#include <omp.h>
#endif

/* The few primitives the team needs: POSIX threads, or their Win32 equivalents (Windows has
 * no fork(), so a team there is always usable). */
#ifdef _WIN32
#include <windows.h>
typedef SRWLOCK ll_mutex;
typedef CONDITION_VARIABLE ll_cond;
typedef HANDLE ll_thread;
typedef DWORD ll_pid;
#define LL_THREAD_RET DWORD WINAPI
static int ll_mutex_init(ll_mutex *m) { InitializeSRWLock(m); return 0; }
static void ll_mutex_destroy(ll_mutex *m) { (void)m; }
static void ll_mutex_lock(ll_mutex *m) { AcquireSRWLockExclusive(m); }
static void ll_mutex_unlock(ll_mutex *m) { ReleaseSRWLockExclusive(m); }
static void ll_cond_init(ll_cond *c) { InitializeConditionVariable(c); }
static void ll_cond_destroy(ll_cond *c) { (void)c; }
static void ll_cond_wait(ll_cond *c, ll_mutex *m) { SleepConditionVariableSRW(c, m, INFINITE, 0); }
static void ll_cond_broadcast(ll_cond *c) { WakeAllConditionVariable(c); }
static int ll_thread_start(ll_thread *t, LPTHREAD_START_ROUTINE fn, void *arg) {
    *t = CreateThread(NULL, 0, fn, arg, 0, NULL);
    return *t == NULL;
}
static void ll_thread_join(ll_thread t) { WaitForSingleObject(t, INFINITE); CloseHandle(t); }
static ll_pid ll_getpid(void) { return GetCurrentProcessId(); }
#define LL_BLOCK_SIGNALS(old) ((void)0)
#define LL_RESTORE_SIGNALS(old) ((void)0)
#else
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
typedef pthread_mutex_t ll_mutex;
typedef pthread_cond_t ll_cond;
typedef pthread_t ll_thread;
typedef pid_t ll_pid;
#define LL_THREAD_RET void *
static int ll_mutex_init(ll_mutex *m) { return pthread_mutex_init(m, NULL); }
static void ll_mutex_destroy(ll_mutex *m) { pthread_mutex_destroy(m); }
static void ll_mutex_lock(ll_mutex *m) { pthread_mutex_lock(m); }
static void ll_mutex_unlock(ll_mutex *m) { pthread_mutex_unlock(m); }
static void ll_cond_init(ll_cond *c) { pthread_cond_init(c, NULL); }
static void ll_cond_destroy(ll_cond *c) { pthread_cond_destroy(c); }
static void ll_cond_wait(ll_cond *c, ll_mutex *m) { pthread_cond_wait(c, m); }
static void ll_cond_broadcast(ll_cond *c) { pthread_cond_broadcast(c); }
static int ll_thread_start(ll_thread *t, void *(*fn)(void *), void *arg) { return pthread_create(t, NULL, fn, arg); }
static void ll_thread_join(ll_thread t) { pthread_join(t, NULL); }
static ll_pid ll_getpid(void) { return getpid(); }
/* New threads inherit the creator's mask: block everything around their creation, so that
 * signals sent to the process (Ctrl-C, SIGTERM) reach the Python threads, except the faults a
 * thread raises itself.
 * NOTE [ Fault signals reach the handler ]
 * A SIGSEGV, SIGBUS, SIGFPE or SIGILL that a thread raises while it has that signal blocked
 * is not delivered: the kernel kills the process at once, and no handler runs. With them
 * blocked, a crash in a kernel thread printed nothing but the shell's "Segmentation fault",
 * and Python's faulthandler (which pytest enables) never said where. Left unblocked, the
 * process's handler runs in the faulting thread; tests/kernels/fault_signal.c checks that. */
#define LL_BLOCK_SIGNALS(old) do { sigset_t all_; sigfillset(&all_); sigdelset(&all_, SIGSEGV); \
    sigdelset(&all_, SIGBUS); sigdelset(&all_, SIGFPE); sigdelset(&all_, SIGILL); \
    pthread_sigmask(SIG_SETMASK, &all_, &(old)); } while (0)
#define LL_RESTORE_SIGNALS(old) pthread_sigmask(SIG_SETMASK, &(old), NULL)
#endif

/* NOTE [ Thread names ]
 * Every native thread of a loader carries a name of at most 15 characters ("ll-io-3",
 * "ll-team-0"; the driver, a Python thread, is "ll-driver"), so ``top -H``, py-spy, gdb and
 * /proc/PID/task/TID/comm show whose thread it is; unnamed, each inherits the interpreter's
 * "python". Set with prctl(PR_SET_NAME) on Linux, pthread_setname_np on macOS, nothing
 * elsewhere. */
#if defined(__linux__)
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <errno.h>
#include <time.h>
#endif
#include <stdio.h>

static void ll_name_thread(const char *prefix, int id) {
    char name[48];
    if (id >= 0) snprintf(name, sizeof name, "%.30s-%d", prefix, id);
    else snprintf(name, sizeof name, "%.30s", prefix);
    name[15] = 0; /* the kernel keeps 15 characters */
#if defined(__linux__)
    prctl(PR_SET_NAME, (unsigned long)name, 0, 0, 0);
#elif defined(__APPLE__)
    pthread_setname_np(name);
#else
    (void)name;
#endif
}

/* Atomic read-modify-write of the claim and completion counters (NOTE [ One queue across
 * batches ]: no lock per item). */
#if defined(_MSC_VER)
#define LL_FETCH_ADD(p, v) InterlockedExchangeAdd64((volatile LONG64 *)(p), (v))
#define LL_LOAD(p) InterlockedCompareExchange64((volatile LONG64 *)(p), 0, 0)
#else
#define LL_FETCH_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_ACQ_REL)
#define LL_LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#endif

typedef void (*ll_job_fn)(void *ctx, int64_t i, int tid);
/* NOTE [ Staged items ]: run claim ``i`` into scratch ``slot`` (0 .. LL_STAGE_PER_THREAD - 1)
 * of thread ``tid`` instead of the job's output (1), or do nothing (0: no memory; the claim
 * then runs as usual at the gate's opening); and write that staged item into the output. */
typedef int (*ll_job_stage_fn)(void *ctx, int64_t i, int tid, int slot);
typedef void (*ll_job_flush_fn)(void *ctx, int tid, int slot);

typedef struct ll_job {
    ll_job_fn fn;
    void *ctx;
    int64_t n;       /* items */
    int64_t next;    /* next item to claim (atomic): all are claimed once next >= n */
    int limit;       /* threads with tid < limit take items */
    int attached;    /* threads claiming from it now (under the team's mutex); a thread runs
                      * every item it claimed before it detaches, so the job is finished
                      * once all are claimed and none is attached */
    int gated;       /* 1: queued behind a closed gate, no item may be claimed (under the mutex) */
    int withdrawn;   /* taken back unrun (ll_pool_withdraw): a staged item is dropped */
    ll_job_stage_fn stage;   /* NULL: no item of it is staged (NOTE [ Staged items ]) */
    ll_job_flush_fn flush;
    int64_t stage_max;       /* the most items staged in all (LL_STAGE_PER_THREAD a thread) */
    int64_t staged;          /* items staged so far (under the mutex) */
    struct ll_job *qnext;
} ll_job;

typedef struct ll_pool ll_pool;

struct ll_pool {
    ll_mutex mu;
    ll_cond work;  /* a job was queued, or stop */
    ll_cond fin;   /* a thread detached from a job, or the team started */
    ll_job *head, *tail;  /* jobs with unclaimed items, oldest first */
    int want;             /* threads asked for */
    int nthreads;         /* threads in the team (0 until it has started) */
    int started;          /* threads that have named themselves and entered the work loop */
    int stop;
    ll_pid pid;
    ll_thread main;       /* the thread that opened the team's parallel region */
    long *tids;           /* want entries: each team thread's kernel id (0: none), for ll_pool_free */
    int64_t idle_ns;      /* summed over the threads: time waiting with nothing to run (under mu) */
};

/* The oldest job with unclaimed items that thread ``tid`` may work on; caller holds mu. */
static ll_job *ll_pool_find(ll_pool *p, int tid) {
    for (ll_job *j = p->head; j != NULL; j = j->qnext)
        if (j->limit > tid && !j->gated && LL_LOAD(&j->next) < j->n) return j;
    return NULL;
}

/* The oldest gated job with an unclaimed item that thread ``tid`` may stage (NOTE [ Staged
 * items ]); caller holds mu. */
static ll_job *ll_pool_find_stage(ll_pool *p, int tid) {
    for (ll_job *j = p->head; j != NULL; j = j->qnext)
        if (j->gated && j->stage != NULL && j->limit > tid && j->staged < j->stage_max && j->next < j->n
            && (int64_t)tid * LL_STAGE_PER_THREAD < j->stage_max)
            return j;
    return NULL;
}

/* Remove a fully claimed job from the queue; caller holds mu. */
static void ll_pool_unlink(ll_pool *p, ll_job *job) {
    ll_job *prev = NULL;
    for (ll_job *j = p->head; j != NULL; prev = j, j = j->qnext) {
        if (j != job) continue;
        if (prev) prev->qnext = j->qnext;
        else p->head = j->qnext;
        if (p->tail == j) p->tail = prev;
        j->qnext = NULL;
        return;
    }
}

/* Run ``job``'s items as thread ``tid`` claims them (an atomic add each) until all are claimed,
 * then detach from it; called with the mutex released, returns holding it. The thread is
 * attached: the submitter frees a job only once every item is claimed and no thread is
 * attached (ll_pool_wait), so a claim that comes back past the end still touches live memory. */
static void ll_pool_drain(ll_pool *p, ll_job *job, int tid) {
    for (;;) {
        const int64_t i = LL_FETCH_ADD(&job->next, 1);
        if (i >= job->n) break;
        job->fn(job->ctx, i, tid);
    }
    ll_mutex_lock(&p->mu);
    ll_pool_unlink(p, job);   /* fully claimed (a no-op when another thread unlinked it) */
    if (--job->attached == 0) ll_cond_broadcast(&p->fin);   /* the job may be finished */
}

/* The work loop of team thread ``tid``, until stop. */
static void ll_pool_loop(ll_pool *p, int tid) {
    ll_name_thread("ll-team", tid);   /* NOTE [ Thread names ] */
#if defined(__linux__)
    if (p->tids != NULL && tid < p->want) p->tids[tid] = (long)syscall(SYS_gettid);
#endif
    ll_mutex_lock(&p->mu);
    p->started++;   /* ll_pool_new returns once every thread is named and recorded */
    ll_cond_broadcast(&p->fin);
    ll_job *held = NULL;   /* the gated job of this thread's staged claims (NOTE [ Staged items ]) */
    int nheld = 0;
    int64_t held_k[LL_STAGE_PER_THREAD];
    int held_staged[LL_STAGE_PER_THREAD];
    for (;;) {
        if (held != NULL && !held->gated) {   /* its gate opened, or it was withdrawn */
            ll_job *j = held;
            const int m = nheld;
            held = NULL;
            nheld = 0;
            if (j->withdrawn) {
                if (--j->attached == 0) ll_cond_broadcast(&p->fin);
                continue;
            }
            ll_mutex_unlock(&p->mu);
            for (int h = 0; h < m; h++) {
                if (held_staged[h]) j->flush(j->ctx, tid, h);
                else j->fn(j->ctx, held_k[h], tid);
            }
            ll_pool_drain(p, j, tid);   /* still attached since it staged */
            continue;
        }
        if (p->stop) break;
        ll_job *j = ll_pool_find(p, tid);
        if (j == NULL) {
            if (nheld < LL_STAGE_PER_THREAD && (j = ll_pool_find_stage(p, tid)) != NULL
                && (held == NULL || held == j)) {
                /* A gated job's items are claimed only here, under the mutex, until it opens;
                 * the thread stays attached (once) until it has written what it staged. */
                if (held == NULL) j->attached++;
                held = j;
                const int h = nheld++;
                held_k[h] = LL_FETCH_ADD(&j->next, 1);
                j->staged++;
                ll_mutex_unlock(&p->mu);
                held_staged[h] = j->stage(j->ctx, held_k[h], tid, h);
                ll_mutex_lock(&p->mu);
                continue;
            }
            const int64_t t0 = ll_now_ns();
            ll_cond_wait(&p->work, &p->mu);
            p->idle_ns += ll_now_ns() - t0;
            continue;
        }
        /* Attached, the thread claims items until the job runs out: the mutex is taken once
         * per job, not per item. */
        j->attached++;
        ll_mutex_unlock(&p->mu);
        ll_pool_drain(p, j, tid);
    }
    if (held != NULL && --held->attached == 0) ll_cond_broadcast(&p->fin);   /* stop: never opened */
    ll_mutex_unlock(&p->mu);
}

/* The team's one native thread: it opens one OpenMP parallel region of ``want`` threads that
 * lasts as long as the team, and every thread of it runs the work loop (so OMP_PROC_BIND and
 * OMP_PLACES place the kernel threads as they place any OpenMP team). Without OpenMP it is
 * the team's only thread. */
static LL_THREAD_RET ll_pool_main(void *arg) {
    ll_pool *p = (ll_pool *)arg;
#ifdef _OPENMP
#pragma omp parallel num_threads(p->want)
    {
        if (omp_get_thread_num() == 0) {
            ll_mutex_lock(&p->mu);
            p->nthreads = omp_get_num_threads();
            ll_cond_broadcast(&p->fin);
            ll_mutex_unlock(&p->mu);
        }
        ll_pool_loop(p, omp_get_thread_num());
    }
#else
    ll_mutex_lock(&p->mu);
    p->nthreads = 1;
    ll_cond_broadcast(&p->fin);
    ll_mutex_unlock(&p->mu);
    ll_pool_loop(p, 0);
#endif
    return 0;
}

/* A team of up to ``n`` threads (fewer when the OpenMP runtime grants fewer, one without
 * OpenMP), or NULL (no memory, or the system refused a thread). */
static ll_pool *ll_pool_new(int n) {
    if (n < 1) return NULL;
    ll_pool *p = (ll_pool *)calloc(1, sizeof(ll_pool));
    if (p == NULL) return NULL;
    if (ll_mutex_init(&p->mu) != 0) {
        free(p);
        return NULL;
    }
    ll_cond_init(&p->work);
    ll_cond_init(&p->fin);
    p->pid = ll_getpid();
    p->want = n;
    p->tids = (long *)calloc((size_t)n, sizeof(long));   /* NULL: the exit wait is skipped */
#ifndef _WIN32
    sigset_t old;
#endif
    LL_BLOCK_SIGNALS(old);
    int failed = ll_thread_start(&p->main, ll_pool_main, p);
    LL_RESTORE_SIGNALS(old);
    if (failed) {
        ll_cond_destroy(&p->work);
        ll_cond_destroy(&p->fin);
        ll_mutex_destroy(&p->mu);
        free(p->tids);
        free(p);
        return NULL;
    }
    ll_mutex_lock(&p->mu);   /* until the team's size is known and all its threads run */
    while (p->nthreads == 0 || p->started < p->nthreads) ll_cond_wait(&p->fin, &p->mu);
    ll_mutex_unlock(&p->mu);
    return p;
}

/* Whether this process's threads serve the team (false in a child after fork()). */
static int ll_pool_usable(const ll_pool *p) { return p != NULL && p->pid == ll_getpid(); }

/* Queue ``job`` (fn, ctx, n and limit set by the caller; n >= 1), behind a closed gate when
 * ``gated`` (ll_pool_open starts it). */
static void ll_pool_submit_gated(ll_pool *p, ll_job *job, int gated) {
    job->next = 0;
    job->attached = 0;
    job->qnext = NULL;
    job->gated = gated ? 1 : 0;
    job->withdrawn = 0;
    job->staged = 0;
    if (job->limit > p->nthreads) job->limit = p->nthreads;
    if (job->limit < 1) job->limit = 1;
    ll_mutex_lock(&p->mu);
    if (p->tail) p->tail->qnext = job;
    else p->head = job;
    p->tail = job;
    ll_cond_broadcast(&p->work);
    ll_mutex_unlock(&p->mu);
}

/* Queue ``job`` (fn, ctx, n and limit set by the caller; n >= 1). */
static void ll_pool_submit(ll_pool *p, ll_job *job) { ll_pool_submit_gated(p, job, 0); }

/* Whether every item of ``job`` has run and no thread holds it; caller holds mu. */
static int ll_pool_finished(ll_job *job) { return LL_LOAD(&job->next) >= job->n && job->attached == 0; }

/* Block until every item of a submitted ``job`` has finished and no thread is attached to
 * it (then the caller may free it). */
static void ll_pool_wait(ll_pool *p, ll_job *job) {
    ll_mutex_lock(&p->mu);
    while (!ll_pool_finished(job)) ll_cond_wait(&p->fin, &p->mu);
    ll_mutex_unlock(&p->mu);
}

/* Open the gate of a gated ``job``: its items may be claimed from now on (a no-op when it is
 * open). Never blocks for long: it takes the team's mutex, which no thread holds across an
 * item, so it may run with the interpreter's lock held. */
static void ll_pool_open(ll_pool *p, ll_job *job) {
    ll_mutex_lock(&p->mu);
    if (job->gated) {
        job->gated = 0;
        ll_cond_broadcast(&p->work);
    }
    ll_mutex_unlock(&p->mu);
}

/* Take back a job whose gate is still closed: it leaves the queue with no item written to its
 * output and counts as finished (ll_pool_wait returns at once). Items staged in the team's
 * scratch are dropped: it waits until their threads let go of the job (NOTE [ Staged items ];
 * at most the item each is running), so the caller may free it. Returns 0, changing nothing,
 * when the gate was opened (then the job runs and is waited for as any other). */
static int ll_pool_withdraw(ll_pool *p, ll_job *job) {
    int taken = 0;
    ll_mutex_lock(&p->mu);
    if (job->gated) {
        ll_pool_unlink(p, job);
        job->gated = 0;
        job->withdrawn = 1;
        job->next = job->n;
        ll_cond_broadcast(&p->work);   /* a thread holding a staged item waits there */
        while (job->attached > 0) ll_cond_wait(&p->fin, &p->mu);
        taken = 1;
    }
    ll_mutex_unlock(&p->mu);
    return taken;
}

/* Wait until ``job``'s gate opens or ``timeout_ns`` passes; returns whether it is still closed.
 * (The gate's opening broadcasts ``work``, which the waiter shares with the team's threads.) */
static int ll_pool_wait_open(ll_pool *p, ll_job *job, int64_t timeout_ns) {
    ll_mutex_lock(&p->mu);
#ifdef _WIN32
    if (job->gated) SleepConditionVariableSRW(&p->work, &p->mu, (DWORD)(timeout_ns / 1000000), 0);
#else
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const long long t = (long long)ts.tv_nsec + timeout_ns;
    ts.tv_sec += (time_t)(t / 1000000000LL);
    ts.tv_nsec = (long)(t % 1000000000LL);
    while (job->gated) {
        if (pthread_cond_timedwait(&p->work, &p->mu, &ts) != 0) break;
    }
#endif
    int g = job->gated;
    ll_mutex_unlock(&p->mu);
    return g;
}

/* Nanoseconds the team's threads have waited with nothing to run, summed over the threads
 * (a thread holding a staged item counts while it waits for the gate). */
static int64_t ll_pool_idle_ns(ll_pool *p) {
    ll_mutex_lock(&p->mu);
    int64_t n = p->idle_ns;
    ll_mutex_unlock(&p->mu);
    return n;
}

/* Items of ``job`` staged so far while its gate was closed (NOTE [ Staged items ]). */
static int64_t ll_pool_staged(ll_pool *p, ll_job *job) {
    ll_mutex_lock(&p->mu);
    int64_t n = job->staged;
    ll_mutex_unlock(&p->mu);
    return n;
}

/* Whether ``job``'s gate is closed. */
static int ll_pool_gated(ll_pool *p, ll_job *job) {
    ll_mutex_lock(&p->mu);
    int g = job->gated;
    ll_mutex_unlock(&p->mu);
    return g;
}

/* Whether ll_pool_wait would return at once (does not block). */
static int ll_pool_done(ll_pool *p, ll_job *job) {
    ll_mutex_lock(&p->mu);
    int d = ll_pool_finished(job);
    ll_mutex_unlock(&p->mu);
    return d;
}

/* NOTE [ A closed team has no threads ]
 * The team's OpenMP threads other than its first belong to libgomp's thread pool of the
 * team's native thread. When that thread ends (joined by ll_pool_free), libgomp releases
 * them from a destructor and they exit detached: without a wait, a few of them are still in
 * /proc/self/task, and still named "ll-team-N", when ll_pool_free returns, so "close() leaves
 * no native thread" would hold only eventually. ll_pool_free therefore waits until each
 * thread recorded in ``tids`` is gone (tgkill with signal 0 answers ESRCH), at most
 * LL_POOL_EXIT_WAIT_NS: the threads have nothing left to do but exit, so the wait is
 * microseconds; the bound only keeps a runtime that parks them instead from blocking. */
#define LL_POOL_EXIT_WAIT_NS 2000000000LL

static void ll_pool_wait_gone(ll_pool *p) {
#if defined(__linux__)
    if (p->tids == NULL) return;
    const long pid = (long)getpid();
    struct timespec step = {0, 100000}; /* 0.1 ms */
    long long waited = 0;
    for (int t = 1; t < p->want; t++) {
        if (p->tids[t] <= 0) continue;
        while (waited < LL_POOL_EXIT_WAIT_NS && syscall(SYS_tgkill, pid, p->tids[t], 0) == 0) {
            nanosleep(&step, NULL);
            waited += step.tv_nsec;
        }
    }
#else
    (void)p;
#endif
}

/* Stop the team and join its thread (the parallel region has ended when it returns), wait
 * for its other threads to be gone (NOTE [ A closed team has no threads ]), then free it.
 * Every submitted job must have been waited for. In a child after fork() the threads do not
 * exist: only the memory is freed (the mutex, copied in whatever state the fork found it, is
 * not touched). */
static void ll_pool_free(ll_pool *p) {
    if (p == NULL) return;
    if (ll_pool_usable(p)) {
        ll_mutex_lock(&p->mu);
        p->stop = 1;
        ll_cond_broadcast(&p->work);
        ll_mutex_unlock(&p->mu);
        ll_thread_join(p->main);
        ll_pool_wait_gone(p);
        ll_cond_destroy(&p->work);
        ll_cond_destroy(&p->fin);
        ll_mutex_destroy(&p->mu);
    }
    free(p->tids);
    free(p);
}

#endif
