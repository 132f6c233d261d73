/* base/file.c — read-only whole-file mapping (mmap) and whole-file reads.
 *
 * Mapped memory is shared read-only; a zero-length file maps to data == NULL,
 * size == 0 (mmap rejects length 0). Both take only regular files: a path is opened
 * with O_NONBLOCK (so a FIFO without a writer, or a device, cannot block the open)
 * and checked with fstat on the descriptor before anything is read; a directory, FIFO,
 * socket or device is refused with a message saying what it is. Errors name the path
 * and the system reason.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* What a file that is not a regular one is, for messages ("'x' is a FIFO, ..."). */
static const char *kind_of(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    return "a special file";
}

/* Opens path read-only as a regular file: *fd and its fstat in *st. O_NONBLOCK only
 * protects the open; it is cleared again for the reads (stdio-like callers expect
 * blocking descriptors, and a regular file never blocks anyway). */
static lm_status open_regular(const char *path, int *fd, struct stat *st) {
    *fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (*fd < 0) return lm__error(LM_IO_ERROR, "cannot open '%s': %s", path, strerror(errno));
    int flags = 0, e = 0;
    if (fstat(*fd, st) != 0) e = errno;
    else if (S_ISREG(st->st_mode) &&
             ((flags = fcntl(*fd, F_GETFL)) < 0 || fcntl(*fd, F_SETFL, flags & ~O_NONBLOCK) < 0))
        e = errno;
    if (e == 0 && S_ISREG(st->st_mode)) return LM_OK;
    close(*fd);
    *fd = -1;
    if (e) return lm__error(LM_IO_ERROR, "cannot open '%s': %s", path, strerror(e));
    return lm__error(LM_IO_ERROR, "'%s' is %s, not a regular file", path, kind_of(st->st_mode));
}

lm_status lm_file_map_open(const char *path, lm_file_map *map) {
    if (!path || !map) return lm__error(LM_INVALID_ARGUMENT, "lm_file_map_open: NULL argument");
    *map = (lm_file_map){0};
    int fd;
    struct stat st;
    LM_TRY(open_regular(path, &fd, &st));
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return lm__error(LM_IO_ERROR, "cannot map '%s': %s", path, strerror(e));
        }
        map->data = p;
        map->size = (size_t)st.st_size;
    }
    close(fd); /* the mapping keeps its own reference to the file */
    return LM_OK;
}

void lm_file_map_close(lm_file_map *map) {
    if (!map) return;
    if (map->data) munmap((void *)map->data, map->size);
    *map = (lm_file_map){0};
}

lm_status lm_file_read_all(const char *path, char **out, size_t *size) {
    if (!path || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_file_read_all: NULL argument");
    *out = NULL;
    if (size) *size = 0;
    int fd;
    struct stat sb;
    LM_TRY(open_regular(path, &fd, &sb));
    /* One byte more than fstat reported, and the NUL: a file that does not change is
     * read into one allocation, its end seen as a read of 0 into the spare byte. A file
     * that grows (or reports size 0, as /proc files do) doubles the buffer as it goes. */
    int64_t cap = sb.st_size < INT64_MAX - 2 ? (int64_t)sb.st_size + 2 : INT64_MAX; /* (then the allocation fails) */
    char *buf = lm__alloc((size_t)cap, 1);
    size_t len = 0;
    lm_status st = buf ? LM_OK : LM_OUT_OF_MEMORY;
    int err = 0;
    while (st == LM_OK) {
        if ((int64_t)len + 1 == cap && (st = lm__reserve((void **)&buf, &cap, (int64_t)len + 2, 1)) != LM_OK) break;
        ssize_t n = read(fd, buf + len, (size_t)cap - 1 - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) err = errno;
        if (n <= 0) break;
        len += (size_t)n;
    }
    close(fd);
    if (st != LM_OK || err) {
        lm__free(buf);
        return st != LM_OK ? lm__error_context(st, "reading '%s' (%lld bytes)", path, (long long)sb.st_size)
                           : lm__error(LM_IO_ERROR, "cannot read '%s': %s", path, strerror(err));
    }
    buf[len] = '\0';
    *out = buf;
    if (size) *size = len;
    return LM_OK;
}
