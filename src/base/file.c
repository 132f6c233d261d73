/* base/file.c — read-only whole-file mapping (mmap) and whole-file reads.
 *
 * Mapped memory is shared read-only; a zero-length file maps to data == NULL,
 * size == 0 (mmap rejects length 0). Errors name the path and the system reason.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

lm_status lm_file_map_open(const char *path, lm_file_map *map) {
    if (!path || !map) return lm__error(LM_INVALID_ARGUMENT, "lm_file_map_open: NULL argument");
    *map = (lm_file_map){0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return lm__error(LM_IO_ERROR, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return lm__error(LM_IO_ERROR, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return lm__error(LM_IO_ERROR, "'%s' is not a regular file", path);
    }
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
    FILE *f = fopen(path, "rb");
    if (!f) return lm__error(LM_IO_ERROR, "cannot open '%s': %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0;
    int64_t cap = 0;
    lm_status st;
    /* room for at least one more byte and the NUL; the first buffer is 4 KiB */
    while ((st = lm__reserve((void **)&buf, &cap, LM_MAX((int64_t)len + 2, 4096), 1)) == LM_OK) {
        size_t n = fread(buf + len, 1, (size_t)cap - 1 - len, f);
        len += n;
        if (n == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (st != LM_OK || err) {
        lm__free(buf);
        return st != LM_OK ? st : lm__error(LM_IO_ERROR, "read error on '%s'", path);
    }
    buf[len] = '\0';
    *out = buf;
    if (size) *size = len;
    return LM_OK;
}
