/* POSIX reads inside the nogil pass: whole files (open/fstat/read) and records (pread).
 *
 * Both read into a per-thread ll_buf that grows to fit (NOTE [ Scratch grows to fit ]) and
 * is reused, so steady state allocates nothing. Failures return LL_ERR_READ with the
 * system's reason (strerror) in msg; the Python owner adds the path or record key.
 */
#ifndef LL_READ_H
#define LL_READ_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "ll_common.h"

static void ll_errno_msg(char *msg, const char *what, int err) {
    char tmp[128];
    tmp[0] = 0;
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
    const char *s = strerror_r(err, tmp, sizeof(tmp));
#else
    const char *s = strerror_r(err, tmp, sizeof(tmp)) == 0 ? tmp : "unknown error";
#endif
    if (msg) snprintf(msg, LL_MSG_LEN, "%s: %s (errno %d)", what, s, err);
}

/* Read exactly size bytes at offset (pread loop; EINTR retried). */
static int ll_pread_all(int fd, unsigned char *dst, size_t size, long long offset, char *msg) {
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, dst + got, size - got, (off_t)(offset + (long long)got));
        if (r < 0) {
            if (errno == EINTR) continue;
            ll_errno_msg(msg, "read failed", errno);
            return LL_ERR_READ;
        }
        if (r == 0) {
            if (msg) snprintf(msg, LL_MSG_LEN, "unexpected end of file: wanted %zu bytes at offset %lld, got %zu",
                              size, offset, got);
            return LL_ERR_READ;
        }
        got += (size_t)r;
    }
    return LL_OK;
}

/* Read a whole file into b; *size gets its length. */
/* NOTE [ One sample's file size limit ]
 * A path that names a huge file (a disk image mislabelled .jpg, a sparse file) would
 * otherwise be read whole into memory by whichever thread meets it. No image a loader
 * trains on comes near 1 GiB, so both readers (this one and datasets._read_file, which
 * tests hold to the same value) refuse larger files from their size, before reading. */
#define LL_MAX_FILE_BYTES (1LL << 30)

static int ll_read_file(const char *path, ll_buf *b, size_t *size, char *msg) {
    int fd;
    /* O_NONBLOCK: opening a FIFO (or a device) must never block the kernel; anything that
     * is not a regular file is refused below. It changes nothing for regular files. */
    do { fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        ll_errno_msg(msg, "cannot open", errno);
        return LL_ERR_READ;
    }
    struct stat stbuf;
    if (fstat(fd, &stbuf) != 0) {
        ll_errno_msg(msg, "cannot stat", errno);
        close(fd);
        return LL_ERR_READ;
    }
    if (!S_ISREG(stbuf.st_mode)) {
        if (msg) snprintf(msg, LL_MSG_LEN, "not a regular file");
        close(fd);
        return LL_ERR_READ;
    }
    if ((long long)stbuf.st_size > LL_MAX_FILE_BYTES) {
        if (msg) snprintf(msg, LL_MSG_LEN, "file of %lld bytes is larger than the %lld-byte limit for one sample",
                          (long long)stbuf.st_size, (long long)LL_MAX_FILE_BYTES);
        close(fd);
        return LL_ERR_READ;
    }
    size_t n = (size_t)stbuf.st_size;
    if (ll_buf_reserve(b, n + 1) != 0) {
        if (msg) snprintf(msg, LL_MSG_LEN, "out of memory reading %zu bytes", n);
        close(fd);
        return LL_ERR_NOMEM;
    }
    /* NOTE [ Files that change while read ]
     * One byte more than fstat's size is asked for: a regular file read to its end returns
     * short, so the usual read costs no extra call (on a FUSE mount each call is a round
     * trip), and a file that grew since fstat fills the extra byte. A file that shrank ends
     * early. Either way the bytes are not the file fstat described (a writer is replacing
     * it): the item fails with both sizes, never decoding a mix of old and new bytes. */
    size_t got = 0;
    while (got <= n) {
        ssize_t r = pread(fd, b->p + got, n + 1 - got, (off_t)got);
        if (r < 0) {
            if (errno == EINTR) continue;
            ll_errno_msg(msg, "read failed", errno);
            close(fd);
            return LL_ERR_READ;
        }
        if (r == 0) break;
        got += (size_t)r;
        if (got == n) break; /* a short read at the size fstat gave: the end of the file */
    }
    close(fd);
    *size = n;
    if (got != n) {
        if (msg) snprintf(msg, LL_MSG_LEN, "the file changed size while being read: fstat gave %zu bytes, the read %s",
                          n, got > n ? "found more" : "ended early");
        if (msg && got < n) {
            size_t len = strlen(msg);
            snprintf(msg + len, LL_MSG_LEN - len, " (at %zu bytes)", got);
        }
        return LL_ERR_READ;
    }
    return LL_OK;
}

#endif
