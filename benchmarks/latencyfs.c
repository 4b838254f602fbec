/* latencyfs: a read-only passthrough FUSE filesystem that charges every file a latency.
 *
 *   latencyfs [--latency-ms=L] [--jitter=J] [--where=MODE] [--threads=N] [--die-with-parent]
 *             SOURCE MOUNTPOINT
 *
 * Serves SOURCE read-only at MOUNTPOINT (in the foreground, until unmounted or signalled).
 * Each charge sleeps L ms times a uniform factor in [1 - J, 1 + J] (J = 0.5: +-50%), drawn
 * per charge. MODE says where the per-file latency is charged:
 *   split       (default) L/2 at open and L/2 at the first read of each open file: a
 *               metadata round trip, then time to first byte; one L per file whatever the
 *               reader's buffer size;
 *   open        all of L at open;
 *   first-read  all of L at the first read of each open file;
 *   every-read  L at every read request the kernel sends (requests are at most 128 KiB;
 *               a reader with a small buffer pays many times, a model of per-RPC latency).
 * Pages are never cached (direct_io), so every read of every epoch reaches this daemon;
 * entries and attributes are cached, so path lookups cost nothing. Requests are served by
 * up to N threads (default 512) that each sleep independently: the filesystem adds latency,
 * not a concurrency limit. On exit it prints what it served to stderr.
 *
 * Build: cc -O2 -Wall latencyfs.c -o latencyfs $(pkg-config --cflags --libs fuse3)
 * Unmount: fusermount3 -u MOUNTPOINT (or SIGINT/SIGTERM to the daemon).
 */
#define FUSE_USE_VERSION 312
#define _GNU_SOURCE

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

enum where { WHERE_SPLIT, WHERE_OPEN, WHERE_FIRST_READ, WHERE_EVERY_READ };

static struct {
    int src_fd;
    double latency_ns;
    double jitter;
    enum where where;
    /* What was served, printed at exit: shows the latency was charged and how many requests
     * overlapped (a peak near --threads would mean the daemon, not the latency, limited). */
    atomic_llong opens, reads, bytes, slept_ns;
    atomic_int sleeping, peak_sleeping;
} g;

/* One open file: its descriptor and whether its first read has been charged. */
struct handle {
    int fd;
    atomic_int charged;
};

/* Per-thread xorshift64*, seeded from the thread's id and the clock: independent jitter
 * per request with no shared state. */
static double uniform01(void) {
    static __thread uint64_t s;
    if (s == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        s = ((uint64_t)gettid() << 32) ^ (uint64_t)ts.tv_nsec ^ 0x9E3779B97F4A7C15ull;
        if (s == 0) s = 1;
    }
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return (double)((s * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

static void charge(double fraction) {
    double ns = g.latency_ns * fraction * (1.0 + g.jitter * (2.0 * uniform01() - 1.0));
    if (ns <= 0) return;
    int now = atomic_fetch_add(&g.sleeping, 1) + 1;
    int peak = atomic_load(&g.peak_sleeping);
    while (now > peak && !atomic_compare_exchange_weak(&g.peak_sleeping, &peak, now)) {
    }
    struct timespec ts = {(time_t)(ns / 1e9), (long)((long long)ns % 1000000000LL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR) {
    }
    atomic_fetch_sub(&g.sleeping, 1);
    atomic_fetch_add(&g.slept_ns, (long long)ns);
}

/* FUSE paths start with '/'; they are looked up relative to the source folder. */
static const char *rel(const char *path) {
    while (*path == '/') path++;
    return *path ? path : ".";
}

static unsigned max_threads;

static void *lfs_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    /* Asynchronous reads (io_uring, aio) travel as FUSE background requests, which the kernel
     * caps at max_background (default 12) per mount: raise it to the thread count. */
    conn->max_background = max_threads > 65535 ? 65535 : max_threads;
    conn->congestion_threshold = conn->max_background * 3 / 4;
    cfg->direct_io = 1;          /* no page cache: every read reaches the daemon */
    cfg->kernel_cache = 0;
    cfg->entry_timeout = 86400;  /* the tree is read-only: cache lookups */
    cfg->attr_timeout = 86400;
    cfg->negative_timeout = 86400;
    cfg->use_ino = 1;
    return NULL;
}

static int lfs_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    /* Directories are opened without a handle (fh 0): they are looked up by path. */
    int r = fi && fi->fh ? fstat(((struct handle *)(uintptr_t)fi->fh)->fd, st)
                         : fstatat(g.src_fd, rel(path), st, AT_SYMLINK_NOFOLLOW);
    return r == 0 ? 0 : -errno;
}

static int lfs_readlink(const char *path, char *buf, size_t size) {
    ssize_t n = readlinkat(g.src_fd, rel(path), buf, size - 1);
    if (n < 0) return -errno;
    buf[n] = 0;
    return 0;
}

static int lfs_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off, struct fuse_file_info *fi,
                       enum fuse_readdir_flags flags) {
    (void)off, (void)fi, (void)flags;
    int fd = openat(g.src_fd, rel(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        return -e;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        struct stat st = {0};
        st.st_ino = e->d_ino;
        st.st_mode = (mode_t)DTTOIF(e->d_type);
        if (fill(buf, e->d_name, &st, 0, 0)) break;
    }
    closedir(d);
    return 0;
}

static int lfs_open(const char *path, struct fuse_file_info *fi) {
    if ((fi->flags & O_ACCMODE) != O_RDONLY) return -EROFS;
    if (g.where == WHERE_OPEN) charge(1.0);
    else if (g.where == WHERE_SPLIT) charge(0.5);
    struct handle *h = malloc(sizeof *h);
    if (!h) return -ENOMEM;
    h->fd = openat(g.src_fd, rel(path), O_RDONLY | O_CLOEXEC | (fi->flags & O_NONBLOCK));
    if (h->fd < 0) {
        int e = errno;
        free(h);
        return -e;
    }
    atomic_init(&h->charged, 0);
    fi->direct_io = 1;
    fi->fh = (uint64_t)(uintptr_t)h;
    atomic_fetch_add(&g.opens, 1);
    return 0;
}

static int lfs_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)path;
    struct handle *h = (struct handle *)(uintptr_t)fi->fh;
    if (g.where == WHERE_EVERY_READ) charge(1.0);
    else if (g.where != WHERE_OPEN && atomic_exchange(&h->charged, 1) == 0)
        charge(g.where == WHERE_SPLIT ? 0.5 : 1.0);
    size_t got = 0;
    while (got < size) {
        ssize_t n = pread(h->fd, buf + got, size - got, off + (off_t)got);
        if (n < 0) {
            if (errno == EINTR) continue;
            return got ? (int)got : -errno;
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    atomic_fetch_add(&g.reads, 1);
    atomic_fetch_add(&g.bytes, (long long)got);
    return (int)got;
}

static int lfs_release(const char *path, struct fuse_file_info *fi) {
    (void)path;
    struct handle *h = (struct handle *)(uintptr_t)fi->fh;
    close(h->fd);
    free(h);
    return 0;
}

static int lfs_statfs(const char *path, struct statvfs *st) {
    (void)path;
    return fstatvfs(g.src_fd, st) == 0 ? 0 : -errno;
}

static const struct fuse_operations ops = {
    .init = lfs_init,
    .getattr = lfs_getattr,
    .readlink = lfs_readlink,
    .readdir = lfs_readdir,
    .open = lfs_open,
    .read = lfs_read,
    .release = lfs_release,
    .statfs = lfs_statfs,
};

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [--latency-ms=L] [--jitter=J] [--where=split|open|first-read|every-read]\n"
            "          [--threads=N] [--die-with-parent] [--debug] SOURCE MOUNTPOINT\n",
            argv0);
}

int main(int argc, char **argv) {
    double latency_ms = 0, jitter = 0.5;
    unsigned threads = 512;
    int die_with_parent = 0, debug = 0;
    const char *pos[2] = {NULL, NULL};
    int npos = 0;
    g.where = WHERE_SPLIT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strncmp(a, "--latency-ms=", 13)) latency_ms = atof(a + 13);
        else if (!strncmp(a, "--jitter=", 9)) jitter = atof(a + 9);
        else if (!strncmp(a, "--threads=", 10)) threads = (unsigned)atoi(a + 10);
        else if (!strcmp(a, "--die-with-parent")) die_with_parent = 1;
        else if (!strcmp(a, "--debug")) debug = 1;
        else if (!strncmp(a, "--where=", 8)) {
            const char *w = a + 8;
            if (!strcmp(w, "split")) g.where = WHERE_SPLIT;
            else if (!strcmp(w, "open")) g.where = WHERE_OPEN;
            else if (!strcmp(w, "first-read")) g.where = WHERE_FIRST_READ;
            else if (!strcmp(w, "every-read")) g.where = WHERE_EVERY_READ;
            else {
                fprintf(stderr, "latencyfs: unknown --where=%s\n", w);
                return 2;
            }
        } else if (a[0] == '-' || npos == 2) {
            usage(argv[0]);
            return 2;
        } else pos[npos++] = a;
    }
    if (npos != 2 || latency_ms < 0 || jitter < 0 || jitter > 1 || threads < 1) {
        usage(argv[0]);
        return 2;
    }
    /* Started by a script: if the script dies, SIGTERM ends the loop and unmounts. */
    if (die_with_parent && prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) perror("latencyfs: prctl");
    max_threads = threads;
    g.latency_ns = latency_ms * 1e6;
    g.jitter = jitter;
    g.src_fd = open(pos[0], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (g.src_fd < 0) {
        fprintf(stderr, "latencyfs: cannot open source folder %s: %s\n", pos[0], strerror(errno));
        return 1;
    }

    char fsname[4096];
    snprintf(fsname, sizeof fsname, "ro,default_permissions,subtype=latencyfs,fsname=%s", pos[0]);
    /* fsname is a comma-separated option value: a source path with a comma would break it. */
    if (strchr(pos[0], ',')) snprintf(fsname, sizeof fsname, "ro,default_permissions,subtype=latencyfs");
    char *fargv[] = {argv[0], "-o", fsname, debug ? "-d" : NULL, NULL};
    struct fuse_args args = FUSE_ARGS_INIT(debug ? 4 : 3, fargv);
    struct fuse *f = fuse_new(&args, &ops, sizeof ops, NULL);
    if (!f) {
        fprintf(stderr, "latencyfs: fuse_new failed\n");
        return 1;
    }
    if (fuse_mount(f, pos[1]) != 0) {
        fprintf(stderr, "latencyfs: cannot mount on %s (is /dev/fuse usable and fuse3 installed?)\n", pos[1]);
        fuse_destroy(f);
        return 1;
    }
    struct fuse_session *se = fuse_get_session(f);
    if (fuse_set_signal_handlers(se) != 0) {
        fuse_unmount(f);
        fuse_destroy(f);
        return 1;
    }
    struct fuse_loop_config *cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_clone_fd(cfg, 1);        /* one /dev/fuse fd per thread: no shared read lock */
    fuse_loop_cfg_set_max_threads(cfg, threads);
    fuse_loop_cfg_set_idle_threads(cfg, threads);  /* keep threads: no create/exit churn per burst */
    int rc = fuse_loop_mt(f, cfg);
    fuse_loop_cfg_destroy(cfg);
    fuse_remove_signal_handlers(se);
    fuse_unmount(f);
    fuse_destroy(f);
    close(g.src_fd);
    fprintf(stderr,
            "latencyfs: served %lld opens, %lld reads, %lld bytes; slept %.3f s in total; "
            "at most %d requests sleeping at once (of %u threads)\n",
            (long long)g.opens, (long long)g.reads, (long long)g.bytes, (double)g.slept_ns / 1e9,
            (int)g.peak_sleeping, threads);
    return rc < 0 ? 1 : 0;
}
