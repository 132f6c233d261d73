/* tests/fuzz/fuzz_util.h — helpers shared by the libFuzzer targets: parsers that take a
 * path get the input through a per-process scratch file. */
#ifndef LOOM_FUZZ_UTIL_H
#define LOOM_FUZZ_UTIL_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Writes data to a scratch file named after the target and this process (in /dev/shm
 * when it exists, else /tmp) and returns its path (a static buffer). */
static inline const char *fuzz_scratch_file(const char *target, const char *suffix, const uint8_t *data, size_t size) {
    static char path[256];
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(path, sizeof path, "%s/loom-fuzz-%s-%d%s", dir, target, (int)getpid(), suffix);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) abort();
    for (size_t off = 0; off < size;) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) abort();
        off += (size_t)w;
    }
    close(fd);
    return path;
}

#endif
