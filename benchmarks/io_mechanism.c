/* io_mechanism: read whole files with D requests in flight, by one of three mechanisms, and
 * report files/s and CPU time per file. It answers one question for a read-ahead stage:
 * blocking reads on a pool of native threads, or io_uring?
 *
 *   io_mechanism --mode=MODE --depth=D [--force-async] [--iowq-max=W] [--files=N] LIST
 *
 * LIST names one file per line; N files are read (the list is cycled; default: all of it),
 * each completely: open + fstat + read to its size + close, as a loader's reader does.
 *   threads        D pthreads, each taking the next file and running the four blocking calls.
 *   uring          one thread, one io_uring, D files in flight: IORING_OP_OPENAT, then fstat
 *                  (a synchronous call: attributes are cached), IORING_OP_READ to the size
 *                  (again while short), IORING_OP_CLOSE; each completion submits the next step.
 *   uring-linked   one submission per file: OPENAT into a direct (registered) descriptor,
 *                  linked to a READ of up to 1 MiB and a CLOSE of that descriptor; no fstat
 *                  (a file that fills the buffer is finished with blocking calls, and counted).
 * --force-async sets IOSQE_ASYNC on every request: the kernel queues it to the ring's worker
 * threads at once, instead of first trying it inline in the submitting thread (where a
 * filesystem that does not honour non-blocking attempts, FUSE among them, blocks the submitter).
 * --iowq-max=W raises io_uring's worker limits (IORING_REGISTER_IOWQ_MAX_WORKERS) to W bounded
 * and W unbounded workers. Reads of regular files that cannot complete at once (FUSE, a cold
 * disk) run on the ring's *bounded* workers, which the kernel caps at min(ring size, 4 x CPUs).
 *
 * Prints one JSON line: files, bytes, wall seconds, files/s, user and system CPU seconds of
 * this process (all its threads, io_uring's workers included: they belong to it) and CPU
 * microseconds per file.
 *
 * Build: cc -O2 -Wall io_mechanism.c -o io_mechanism -lpthread $(pkg-config --cflags --libs liburing)
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LINKED_CAP (1u << 20)

static char **paths;
static size_t npaths, nfiles;
static atomic_size_t next_file;
static atomic_llong total_bytes;

static void die(const char *what, const char *path, int err) {
    fprintf(stderr, "io_mechanism: %s%s%s: %s\n", what, path ? " " : "", path ? path : "", strerror(err));
    exit(1);
}

static const char *path_of(size_t i) { return paths[i % npaths]; }

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) die("out of memory", NULL, ENOMEM);
    return p;
}

/* ---------------------------------------------------------------- blocking calls */

/* open + fstat + read to the size + close; *buf grows geometrically and is reused. */
static long long read_blocking(const char *path, unsigned char **buf, size_t *cap) {
    int fd;
    do { fd = open(path, O_RDONLY | O_CLOEXEC); } while (fd < 0 && errno == EINTR);
    if (fd < 0) die("cannot open", path, errno);
    struct stat st;
    if (fstat(fd, &st) != 0) die("cannot stat", path, errno);
    size_t size = (size_t)st.st_size, got = 0;
    if (size > *cap) {
        *cap = size > 2 * *cap ? size : 2 * *cap;
        *buf = xrealloc(*buf, *cap);
    }
    while (got < size) {
        ssize_t r = pread(fd, *buf + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) die("cannot read", path, errno);
        if (r == 0) die("file shrank while read", path, EIO);
        got += (size_t)r;
    }
    close(fd);
    return (long long)size;
}

static void *pool_worker(void *arg) {
    (void)arg;
    unsigned char *buf = NULL;
    size_t cap = 0;
    long long bytes = 0;
    for (;;) {
        size_t i = atomic_fetch_add(&next_file, 1);
        if (i >= nfiles) break;
        bytes += read_blocking(path_of(i), &buf, &cap);
    }
    atomic_fetch_add(&total_bytes, bytes);
    free(buf);
    return NULL;
}

static void run_threads(int depth) {
    pthread_t *t = xrealloc(NULL, sizeof *t * (size_t)depth);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 << 10);
    for (int k = 0; k < depth; k++)
        if ((errno = pthread_create(&t[k], &attr, pool_worker, NULL)) != 0) die("pthread_create", NULL, errno);
    for (int k = 0; k < depth; k++) pthread_join(t[k], NULL);
    pthread_attr_destroy(&attr);
    free(t);
}

/* ---------------------------------------------------------------- io_uring */

enum step { OPEN, READ, CLOSE };

struct slot {
    size_t file;
    int fd;
    enum step step;
    size_t size, got, cap;
    unsigned char *buf;
};

static struct io_uring ring;
static unsigned sqe_flags;   /* IOSQE_ASYNC with --force-async */

/* Each step is one request whose user_data is its slot. */
static struct io_uring_sqe *next_sqe(struct slot *s, enum step step) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    if (!sqe) die("submission queue full", NULL, EBUSY);
    s->step = step;
    return sqe;
}

static void finish_sqe(struct io_uring_sqe *sqe, struct slot *s) {
    io_uring_sqe_set_data(sqe, s);
    sqe->flags |= sqe_flags;   /* after io_uring_prep_*, which clears the flags */
}

static void submit_open(struct slot *s) {
    struct io_uring_sqe *sqe = next_sqe(s, OPEN);
    io_uring_prep_openat(sqe, AT_FDCWD, path_of(s->file), O_RDONLY | O_CLOEXEC, 0);
    finish_sqe(sqe, s);
}

static void submit_read(struct slot *s) {
    struct io_uring_sqe *sqe = next_sqe(s, READ);
    io_uring_prep_read(sqe, s->fd, s->buf + s->got, (unsigned)(s->size - s->got), s->got);
    finish_sqe(sqe, s);
}

static void submit_close(struct slot *s) {
    struct io_uring_sqe *sqe = next_sqe(s, CLOSE);
    io_uring_prep_close(sqe, s->fd);
    finish_sqe(sqe, s);
}

static int start_file(struct slot *s) {
    size_t i = atomic_fetch_add(&next_file, 1);
    if (i >= nfiles) return 0;
    s->file = i;
    s->got = 0;
    submit_open(s);
    return 1;
}

static void run_uring(int depth) {
    struct slot *slots = calloc((size_t)depth, sizeof *slots);
    if (!slots) die("out of memory", NULL, ENOMEM);
    int inflight = 0;
    for (int k = 0; k < depth; k++) inflight += start_file(&slots[k]);
    while (inflight > 0) {
        int r = io_uring_submit_and_wait(&ring, 1);
        if (r < 0 && r != -EINTR) die("io_uring_submit_and_wait", NULL, -r);
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
            seen++;
            struct slot *s = io_uring_cqe_get_data(cqe);
            int res = cqe->res;
            const char *path = path_of(s->file);
            if (res == -EINTR || res == -EAGAIN) {   /* retry the same step */
                if (s->step == OPEN) submit_open(s);
                else if (s->step == READ) submit_read(s);
                else submit_close(s);
                continue;
            }
            if (res < 0) die(s->step == OPEN ? "cannot open" : s->step == READ ? "cannot read" : "cannot close",
                             path, -res);
            if (s->step == OPEN) {
                s->fd = res;
                struct stat st;
                if (fstat(s->fd, &st) != 0) die("cannot stat", path, errno);
                s->size = (size_t)st.st_size;
                if (s->size > s->cap) {
                    s->cap = s->size > 2 * s->cap ? s->size : 2 * s->cap;
                    s->buf = xrealloc(s->buf, s->cap);
                }
                if (s->size == 0) submit_close(s);
                else submit_read(s);
            } else if (s->step == READ) {
                if (res == 0) die("file shrank while read", path, EIO);
                s->got += (size_t)res;
                if (s->got < s->size) submit_read(s);
                else submit_close(s);
            } else {
                atomic_fetch_add(&total_bytes, (long long)s->size);
                if (!start_file(s)) inflight--;
            }
        }
        io_uring_cq_advance(&ring, seen);
    }
    for (int k = 0; k < depth; k++) free(slots[k].buf);
    free(slots);
}

/* uring-linked: slot k owns direct descriptor k and a LINKED_CAP buffer; the three linked
 * requests complete in order, and only the CLOSE's completion (or a failure) moves the slot on.
 * user_data: slot index * 4 + step. */
static long long linked_fallbacks;

static int start_linked(int k, unsigned char *buf) {
    size_t i = atomic_fetch_add(&next_file, 1);
    if (i >= nfiles) return 0;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    io_uring_prep_openat_direct(sqe, AT_FDCWD, path_of(i), O_RDONLY, 0, (unsigned)k);   /* direct: no O_CLOEXEC */
    sqe->flags |= IOSQE_IO_LINK | sqe_flags;
    sqe->user_data = (uint64_t)k * 4 + OPEN;
    sqe = io_uring_get_sqe(&ring);
    io_uring_prep_read(sqe, k, buf, LINKED_CAP, 0);
    sqe->flags |= IOSQE_FIXED_FILE | IOSQE_IO_HARDLINK | sqe_flags;   /* a short read (every file under 1 MiB) must not cancel the CLOSE */
    sqe->user_data = (uint64_t)k * 4 + READ;
    sqe = io_uring_get_sqe(&ring);
    io_uring_prep_close_direct(sqe, (unsigned)k);
    sqe->flags |= sqe_flags;
    sqe->user_data = (uint64_t)k * 4 + CLOSE;
    return 1;
}

static void run_uring_linked(int depth) {
    unsigned char *bufs = xrealloc(NULL, (size_t)depth * LINKED_CAP);
    size_t *file = calloc((size_t)depth, sizeof *file);
    if (!file) die("out of memory", NULL, ENOMEM);
    unsigned char *spill = NULL;
    size_t spill_cap = 0;
    int r = io_uring_register_files_sparse(&ring, (unsigned)depth);
    if (r < 0) die("io_uring_register_files_sparse", NULL, -r);
    int inflight = 0;
    for (int k = 0; k < depth; k++) {
        file[k] = atomic_load(&next_file);
        inflight += start_linked(k, bufs + (size_t)k * LINKED_CAP);
    }
    while (inflight > 0) {
        r = io_uring_submit_and_wait(&ring, 1);
        if (r < 0 && r != -EINTR) die("io_uring_submit_and_wait", NULL, -r);
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
            seen++;
            int k = (int)(cqe->user_data / 4), step = (int)(cqe->user_data % 4), res = cqe->res;
            const char *path = path_of(file[k]);
            if (step == OPEN && res < 0) die("cannot open", path, -res);
            if (step == READ) {
                if (res < 0) die("cannot read", path, -res);
                if (res == (int)LINKED_CAP) {   /* larger than the buffer: the rest the slow way */
                    linked_fallbacks++;
                    total_bytes += read_blocking(path, &spill, &spill_cap) - LINKED_CAP;
                }
                total_bytes += res;
            }
            if (step == CLOSE) {
                if (res < 0 && res != -ECANCELED) die("cannot close", path, -res);
                file[k] = atomic_load(&next_file);
                if (!start_linked(k, bufs + (size_t)k * LINKED_CAP)) inflight--;
            }
        }
        io_uring_cq_advance(&ring, seen);
    }
    free(spill);
    free(file);
    free(bufs);
}

/* ---------------------------------------------------------------- main */

static double seconds(struct timeval tv) { return (double)tv.tv_sec + (double)tv.tv_usec / 1e6; }

int main(int argc, char **argv) {
    const char *mode = NULL, *list = NULL;
    int depth = 1, iowq_max = 0;
    long long files = -1;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--mode=", 7)) mode = argv[i] + 7;
        else if (!strncmp(argv[i], "--depth=", 8)) depth = atoi(argv[i] + 8);
        else if (!strncmp(argv[i], "--iowq-max=", 11)) iowq_max = atoi(argv[i] + 11);
        else if (!strncmp(argv[i], "--files=", 8)) files = atoll(argv[i] + 8);
        else if (!strcmp(argv[i], "--force-async")) sqe_flags = IOSQE_ASYNC;
        else if (argv[i][0] != '-' && !list) list = argv[i];
        else mode = NULL, i = argc;
    }
    int threads = mode && !strcmp(mode, "threads"), uring = mode && !strcmp(mode, "uring"),
        linked = mode && !strcmp(mode, "uring-linked");
    if (!(threads || uring || linked) || !list || depth < 1) {
        fprintf(stderr, "usage: %s --mode=threads|uring|uring-linked --depth=D [--force-async] [--iowq-max=W] [--files=N] LIST\n",
                argv[0]);
        return 2;
    }
    FILE *f = fopen(list, "r");
    if (!f) die("cannot open", list, errno);
    char *line = NULL;
    size_t len = 0, cap = 0;
    ssize_t n;
    while ((n = getline(&line, &len, f)) > 0) {
        if (line[n - 1] == '\n') line[--n] = 0;
        if (!n) continue;
        if (npaths == cap) paths = xrealloc(paths, (cap = cap ? 2 * cap : 1024) * sizeof *paths);
        paths[npaths++] = strdup(line);
    }
    free(line);
    fclose(f);
    if (!npaths) die("no paths in", list, EINVAL);
    nfiles = files > 0 ? (size_t)files : npaths;

    if (uring || linked) {
        /* Each file has at most one request in flight in "uring" and three in "uring-linked". */
        unsigned entries = (unsigned)depth * (linked ? 3u : 1u);
        struct io_uring_params p = {0};
        p.flags = IORING_SETUP_CQSIZE;
        p.cq_entries = 2 * entries;
        int r = io_uring_queue_init_params(entries, &ring, &p);
        if (r < 0) die("io_uring_queue_init", NULL, -r);
        if (iowq_max > 0) {
            unsigned w[2] = {(unsigned)iowq_max, (unsigned)iowq_max};
            r = io_uring_register_iowq_max_workers(&ring, w);
            if (r < 0) die("io_uring_register_iowq_max_workers", NULL, -r);
        }
    }
    struct rusage r0, r1;
    struct timespec t0, t1;
    getrusage(RUSAGE_SELF, &r0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (threads) run_threads(depth);
    else if (uring) run_uring(depth);
    else run_uring_linked(depth);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    getrusage(RUSAGE_SELF, &r1);
    if (uring || linked) io_uring_queue_exit(&ring);

    double wall = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    double user = seconds(r1.ru_utime) - seconds(r0.ru_utime), sys = seconds(r1.ru_stime) - seconds(r0.ru_stime);
    printf("{\"mode\": \"%s\", \"depth\": %d, \"force_async\": %s, \"iowq_max\": %d, \"files\": %zu, \"bytes\": %lld, "
           "\"wall_s\": %.6f, \"files_per_s\": %.1f, \"user_s\": %.6f, \"sys_s\": %.6f, "
           "\"cpu_us_per_file\": %.2f, \"linked_fallbacks\": %lld}\n",
           mode, depth, sqe_flags ? "true" : "false", iowq_max, nfiles, (long long)total_bytes, wall, (double)nfiles / wall, user, sys,
           (user + sys) * 1e6 / (double)nfiles, linked_fallbacks);
    for (size_t i = 0; i < npaths; i++) free(paths[i]);
    free(paths);
    return 0;
}
