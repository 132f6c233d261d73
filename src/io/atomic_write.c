/* io/atomic_write.c — crash-safe file replacement (see loom/io_write.h): write a
 * "<path>.tmp-<pid>" sibling, fsync it, rename it over path, fsync the directory.
 * Every failure removes the temporary file and names the path and errno text.
 * lm_atomic_file_inject_fault makes writes fail on purpose, so tests can show what a
 * full disk does to the callers; its counters are atomics, off (-1) by default.
 */
#include "io/internal.h"
#include "loom/io_write.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

struct lm_atomic_file {
    int fd;
    char *path; /* final name */
    char *tmp;  /* temporary sibling */
};

static lm_status io_fail(const char *what, const char *path) {
    return lm__error(LM_IO_ERROR, "%s '%s': %s", what, path, strerror(errno));
}

lm_status lm_atomic_file_open(const char *path, lm_atomic_file **out) {
    if (!path || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_atomic_file_open: NULL argument");
    *out = NULL;
    lm_atomic_file *f = lm__calloc(1, sizeof *f);
    size_t n = strlen(path) + 32;
    char *tmp = lm__alloc(n, 1);
    char *dup = lm__strdup(path);
    if (!f || !tmp || !dup) {
        lm__free(f), lm__free(tmp), lm__free(dup);
        return LM_OUT_OF_MEMORY;
    }
    snprintf(tmp, n, "%s.tmp-%ld", path, (long)getpid());
    f->fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (f->fd < 0) {
        lm_status st = io_fail("cannot create", tmp);
        lm__free(f), lm__free(tmp), lm__free(dup);
        return st;
    }
    f->path = dup;
    f->tmp = tmp;
    *out = f;
    return LM_OK;
}

static _Atomic int64_t g_fault_after = -1; /* successful writes allowed; -1: no injection */
static _Atomic int64_t g_fault_count;      /* writes since lm_atomic_file_inject_fault */
static _Atomic int g_fault_errno;

void lm_atomic_file_inject_fault(int64_t after, int err) {
    atomic_store(&g_fault_after, -1); /* off while the other fields change */
    atomic_store(&g_fault_count, 0);
    atomic_store(&g_fault_errno, err);
    atomic_store(&g_fault_after, after < 0 ? -1 : after);
}

lm_status lm_atomic_file_write(lm_atomic_file *f, const void *data, size_t n) {
    int64_t after = atomic_load(&g_fault_after);
    if (after >= 0 && atomic_fetch_add(&g_fault_count, 1) >= after) {
        errno = atomic_load(&g_fault_errno);
        return io_fail("cannot write", f->tmp);
    }
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(f->fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return io_fail("cannot write", f->tmp);
        p += w;
        n -= (size_t)w;
    }
    return LM_OK;
}

static void release(lm_atomic_file *f) {
    lm__free(f->path);
    lm__free(f->tmp);
    lm__free(f);
}

void lm_atomic_file_abort(lm_atomic_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    unlink(f->tmp);
    release(f);
}

/* The directory part of path ("." when there is none), into buf. */
static void dir_of(const char *path, char *buf, size_t size) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(buf, size, ".");
    else if (slash == path) snprintf(buf, size, "/");
    else snprintf(buf, size, "%.*s", (int)(slash - path), path);
}

lm_status lm_dir_sync(const char *dir) {
    int fd = open(dir, O_RDONLY);
    if (fd < 0) return io_fail("cannot open directory", dir);
    int rc = fsync(fd);
    int saved = errno;
    close(fd);
    errno = saved;
    /* some filesystems refuse fsync on directories; the rename is still atomic */
    if (rc != 0 && errno != EINVAL && errno != EBADF) return io_fail("cannot fsync directory", dir);
    return LM_OK;
}

lm_status lm_atomic_file_commit(lm_atomic_file *f) {
    if (!f) return lm__error(LM_INVALID_ARGUMENT, "lm_atomic_file_commit: NULL file");
    lm_status st = LM_OK;
    if (fsync(f->fd) != 0) st = io_fail("cannot fsync", f->tmp);
    if (close(f->fd) != 0 && st == LM_OK) st = io_fail("cannot close", f->tmp);
    f->fd = -1;
    if (st == LM_OK && rename(f->tmp, f->path) != 0) st = io_fail("cannot rename into place", f->path);
    if (st != LM_OK) {
        lm_atomic_file_abort(f);
        return st;
    }
    char dir[4096];
    dir_of(f->path, dir, sizeof dir);
    release(f);
    return lm_dir_sync(dir);
}

lm_status lm_file_write_atomic(const char *path, const void *data, size_t n) {
    lm_atomic_file *f = NULL;
    LM_TRY(lm_atomic_file_open(path, &f));
    lm_status st = lm_atomic_file_write(f, data, n);
    if (st != LM_OK) {
        lm_atomic_file_abort(f);
        return st;
    }
    return lm_atomic_file_commit(f);
}
