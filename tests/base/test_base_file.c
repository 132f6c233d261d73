/* Tests for read-only file mapping and whole-file reads: contents equal what was
 * written (including NUL bytes and sizes around the read buffer's growth points), an
 * empty file maps to {NULL, 0}, the mapping outlives the file's name, and missing
 * files and directories fail with LM_IO_ERROR naming the path. Reads leak nothing
 * when an allocation fails.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Writes n pattern bytes (with NULs) to a new temp file; path receives its name. */
static int write_temp(char *path, size_t n) {
    strcpy(path, "/tmp/loom_test_fileXXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) return 0;
    unsigned char *buf = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(i * 131 + (i >> 8));
    int ok = write(fd, buf, n) == (ssize_t)n;
    free(buf);
    close(fd);
    return ok;
}

static int pattern_matches(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 131 + (i >> 8))) return 0;
    return 1;
}

static void test_map_equals_file_contents(void) {
    const size_t sizes[] = {1, 4095, 4096, 4097, 100000};
    for (int i = 0; i < 5; i++) {
        char path[64];
        LT_CHECK(write_temp(path, sizes[i]));
        lm_file_map map;
        LT_CHECK_OK(lm_file_map_open(path, &map));
        LT_CHECK(map.size == sizes[i] && map.data != NULL);
        if (map.data) LT_CHECK_MSG(pattern_matches(map.data, map.size), "mapping of %zu bytes differs", sizes[i]);
        /* the mapping stays valid after the name is gone (the descriptor is closed) */
        unlink(path);
        if (map.data) LT_CHECK(pattern_matches(map.data, map.size));
        lm_file_map_close(&map);
        LT_CHECK(map.data == NULL && map.size == 0);
        lm_file_map_close(&map); /* a zeroed map closes again */
    }
    lm_file_map_close(NULL);
}

static void test_empty_file_maps_to_null(void) {
    char path[64];
    LT_CHECK(write_temp(path, 0));
    lm_file_map map = {(const uint8_t *)path, 77};
    LT_CHECK_OK(lm_file_map_open(path, &map));
    LT_CHECK(map.data == NULL && map.size == 0);
    lm_file_map_close(&map);
    unlink(path);
}

static void test_missing_file_and_directory_fail_naming_path(void) {
    lm_file_map map = {(const uint8_t *)"x", 5};
    const char *missing = "/tmp/loom_no_such_dir/missing-file.safetensors";
    LT_CHECK_STATUS(lm_file_map_open(missing, &map), LM_IO_ERROR);
    LT_CHECK(strstr(lm_last_error(), missing) != NULL);
    LT_CHECK(map.data == NULL && map.size == 0);
    LT_CHECK_STATUS(lm_file_map_open("/tmp", &map), LM_IO_ERROR);
    LT_CHECK(strstr(lm_last_error(), "/tmp") != NULL);
    LT_CHECK(map.data == NULL && map.size == 0);
    LT_CHECK_STATUS(lm_file_map_open(NULL, &map), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_file_map_open(missing, NULL), LM_INVALID_ARGUMENT);

    char *buf = (char *)missing;
    size_t size = 9;
    LT_CHECK_STATUS(lm_file_read_all(missing, &buf, &size), LM_IO_ERROR);
    LT_CHECK(strstr(lm_last_error(), missing) != NULL);
    LT_CHECK(buf == NULL && size == 0);
    LT_CHECK_STATUS(lm_file_read_all("/tmp", &buf, &size), LM_IO_ERROR);
    LT_CHECK(strstr(lm_last_error(), "/tmp") != NULL);
    LT_CHECK(buf == NULL);
    LT_CHECK_STATUS(lm_file_read_all(NULL, &buf, &size), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_file_read_all(missing, NULL, &size), LM_INVALID_ARGUMENT);
}

static void test_read_all_returns_terminated_contents(void) {
    const size_t sizes[] = {0, 1, 4094, 4095, 4096, 8191, 8192, 70000};
    for (int i = 0; i < 8; i++) {
        char path[64];
        LT_CHECK(write_temp(path, sizes[i]));
        char *buf = NULL;
        size_t size = 12345;
        LT_CHECK_OK(lm_file_read_all(path, &buf, &size));
        LT_CHECK_MSG(buf && size == sizes[i], "read %zu bytes of %zu", size, sizes[i]);
        if (buf) {
            LT_CHECK(pattern_matches((const uint8_t *)buf, size));
            LT_CHECK(buf[size] == '\0');
        }
        lm_free(buf);
        buf = NULL;
        LT_CHECK_OK(lm_file_read_all(path, &buf, NULL)); /* size is optional */
        lm_free(buf);
        unlink(path);
    }
}

static void test_read_all_leaks_nothing_when_allocation_fails(void) {
    char path[64];
    LT_CHECK(write_temp(path, 20000)); /* read into one buffer of the size fstat gives */
    /* /proc files say size 0: their buffer grows as they are read, several times */
    const char *paths[2] = {path, "/proc/self/status"};
    for (int p = 0; p < 2; p++) {
        int k = 1;
        for (;; k++) {
            char *buf = NULL;
            lt_alloc_track(k);
            lm_status st = lm_file_read_all(paths[p], &buf, NULL);
            int64_t attempts = lt_alloc_count();
            if (st == LM_OK) {
                LT_CHECK(attempts < k && (p == 1 || pattern_matches((const uint8_t *)buf, 20000)));
                lm_free(buf);
            } else {
                LT_CHECK_STATUS(st, LM_OUT_OF_MEMORY);
                LT_CHECK(buf == NULL);
            }
            LT_CHECK_MSG(lt_alloc_live() == 0, "fail_at %d: %lld allocations leaked", k, (long long)lt_alloc_live());
            lt_alloc_untrack();
            if (st == LM_OK || k > 100) break;
        }
        LT_CHECK_MSG(p == 0 ? k == 2 : k >= 4, "%s: %d allocation attempts", paths[p], k);
    }
    unlink(path);
}

int main(void) {
    LT_RUN(test_map_equals_file_contents);
    LT_RUN(test_empty_file_maps_to_null);
    LT_RUN(test_missing_file_and_directory_fail_naming_path);
    LT_RUN(test_read_all_returns_terminated_contents);
    LT_RUN(test_read_all_leaks_nothing_when_allocation_fails);
    return lt_finish();
}
