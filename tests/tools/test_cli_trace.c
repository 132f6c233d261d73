/* Step traces from the loom CLI (docs/TIMELINES.md, "Step traces"), run as a user would run them:
 * `loom generate` with --trace and with LOOM_TRACE, `loom bench prefill`, two steps of
 * `loom train` on the test checkpoint and `loom serve` answering one completion. Each
 * file is checked by tests/tools/validate_trace.py (phases, nesting, matching begin /
 * end, monotonic times; skipped without /usr/bin/python3) and for the span names each
 * command promises (prefill, decode step, sample, operators, backward, optimizer,
 * checkpoint save, request phases...). Also: a trace survives an error exit, an
 * unwritable --trace path fails before any work, and without either no file appears.
 * `loom trace view` turns the generate trace into a self-contained page, refuses a
 * malformed trace (exit 1, naming the file and the event) and bad usage (exit 2).
 * LM_TEST_LABELS: unit model
 */
#include "harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LOOM LOOM_BINARY_DIR "/loom"
#define MODEL LOOM_SOURCE_DIR "/models/default"
#define OUT LOOM_BINARY_DIR "/cli_trace_"

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* The trace at path is valid and names every span in expect (comma-separated); also
 * checked here without python: the file is complete and holds each name. */
static void check_trace(const char *what, const char *path, const char *expect) {
    char *text = NULL;
    size_t n = 0;
    LT_CHECK_MSG(lm_file_read_all(path, &text, &n) == LM_OK, "%s: no trace file %s", what, path);
    if (!text) return;
    LT_CHECK_MSG(!strncmp(text, "{\"traceEvents\":[", 16) && strstr(text, "\"otherData\""), "%s: incomplete trace", what);
    char names[512];
    snprintf(names, sizeof names, "%s", expect);
    for (char *save = NULL, *nm = strtok_r(names, ",", &save); nm; nm = strtok_r(NULL, ",", &save)) {
        char key[160];
        snprintf(key, sizeof key, "{\"name\":\"%s\"", nm);
        LT_CHECK_MSG(strstr(text, key) != NULL, "%s: no event named '%s' in %s", what, nm, path);
    }
    lm_free(text);
    if (access("/usr/bin/python3", X_OK) != 0) return;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/tools/validate_trace.py '%s' --expect '%s'", LOOM_SOURCE_DIR,
             path, expect);
    lt_cmd_result r = lt_run_cmd(cmd);
    LT_CHECK_MSG(r.status == 0, "%s: validate_trace.py: exit %d\n%s%s", what, r.status, r.out ? r.out : "",
                 r.err ? r.err : "");
    lt_cmd_free(&r);
}

static void run_ok(const char *cmd) {
    lt_cmd_result r = lt_run_cmd(cmd);
    LT_CHECK_MSG(r.status == 0, "'%s': exit %d: %s", cmd, r.status, r.err ? r.err : "");
    lt_cmd_free(&r);
}

#define GEN_SPANS "tokenize,prefill,decode step,sample,detokenize,generate,matmul,attention_cache,thread_name"

static void test_generate_with_option_and_environment(void) {
    remove(OUT "gen.json");
    remove(OUT "gen_env.json");
    run_ok(LOOM " generate --model " MODEL " --prompt 'Once upon a time' --max-new 8 --threads 2 --trace " OUT "gen.json");
    check_trace("generate --trace", OUT "gen.json", GEN_SPANS);
    run_ok("LOOM_TRACE=" OUT "gen_env.json " LOOM " generate --model " MODEL " --prompt 'Hi' --max-new 4 --greedy --threads 2");
    check_trace("LOOM_TRACE generate", OUT "gen_env.json", GEN_SPANS);
    /* neither: no file (the earlier one removed first) */
    remove(OUT "gen_env.json");
    run_ok(LOOM " generate --model " MODEL " --prompt 'Hi' --max-new 2 --threads 2 > /dev/null");
    LT_CHECK(!exists(OUT "gen_env.json"));
}

/* `loom trace view` on the trace test_generate_with_option_and_environment made. */
static void test_trace_view(void) {
    remove(OUT "gen.html");
    run_ok(LOOM " trace view " OUT "gen.json -o " OUT "gen.html > /dev/null");
    char *text = NULL;
    size_t n = 0;
    LT_CHECK_MSG(lm_file_read_all(OUT "gen.html", &text, &n) == LM_OK, "no page");
    LT_CHECK(text && !strncmp(text, "<!DOCTYPE html>", 15) && strstr(text, "\"decode step\"") && !strstr(text, "https://"));
    lm_free(text);
    FILE *f = fopen(OUT "bad.json", "w");
    if (f) fputs("{\"traceEvents\":[{\"ph\":\"X\",\"ts\":1,\"dur\":1},{\"ph\":\"E\",\"ts\":3}]}", f), fclose(f);
    lt_cmd_result r = lt_run_cmd(LOOM " trace view " OUT "bad.json -o " OUT "bad.html");
    LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, "bad.json") && strstr(r.err, "event 1"), "exit %d: %s", r.status,
                 r.err ? r.err : "");
    lt_cmd_free(&r);
    const char *usage[] = {LOOM " trace", LOOM " trace show x.json", LOOM " trace view", LOOM " trace view --bogus " OUT "gen.json",
                           LOOM " trace view " OUT "gen.json -o " OUT "gen.json"};
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        r = lt_run_cmd(usage[i]);
        LT_CHECK_MSG(r.status == 2, "'%s': exit %d: %s", usage[i], r.status, r.err ? r.err : "");
        lt_cmd_free(&r);
    }
    r = lt_run_cmd(LOOM " trace view --help");
    LT_CHECK_MSG(r.status == 0 && r.out && strstr(r.out, "trace view"), "exit %d", r.status);
    lt_cmd_free(&r);
}

static void test_error_exits_and_bad_paths(void) {
    remove(OUT "err.json");
    lt_cmd_result r = lt_run_cmd(LOOM " generate --model /nonexistent/model --prompt x --trace " OUT "err.json");
    LT_CHECK_MSG(r.status == 1, "exit %d: %s", r.status, r.err ? r.err : "");
    lt_cmd_free(&r);
    check_trace("generate error exit", OUT "err.json", "process_name");
    r = lt_run_cmd(LOOM " generate --model " MODEL " --prompt x --trace /nonexistent-dir/t.json");
    LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, "cannot start the trace") && strstr(r.err, "/nonexistent-dir/t.json"),
                 "exit %d: %s", r.status, r.err ? r.err : "");
    LT_CHECK_MSG(r.out && !r.out[0], "it generated anyway: %s", r.out ? r.out : "");
    lt_cmd_free(&r);
}

static void test_bench(void) {
    remove(OUT "bench.json");
    run_ok(LOOM " bench prefill --model " MODEL " --prompt 8 --repeat 1 --threads 2 --trace " OUT "bench.json");
    check_trace("bench prefill", OUT "bench.json", "prefill,matmul,add_rmsnorm");
}

static void test_train(void) {
    remove(OUT "train.json");
    run_ok(LOOM " data prepare --tokenizer " LOOM_SOURCE_DIR "/tests/data/train/tokenizer.json " LOOM_SOURCE_DIR
                "/tests/data/train/corpus.txt -o " OUT "train.bin > /dev/null");
    run_ok("rm -rf " OUT "train_out && " LOOM " train --model " LOOM_SOURCE_DIR "/tests/data/train/loom_checkpoint --data " OUT
           "train.bin --out " OUT "train_out --steps 2 --batch 2 --seq 16 --threads 2 --save-every 1 --trace " OUT "train.json");
    check_trace("train", OUT "train.json",
                "train step,zero grad,data,forward,backward,grad norm,optimizer,checkpoint save,linear,embedding");
}

/* ---- serve: one completion over HTTP, then SIGINT ------------------------------------------- */

/* The port `loom serve` printed to its stderr file, 0 until it has. */
static int listening_port(const char *log) {
    char *text = NULL;
    size_t n = 0;
    if (lm_file_read_all(log, &text, &n) != LM_OK) {
        lm_clear_error();
        return 0;
    }
    const char *at = strstr(text, "listening on http://127.0.0.1:");
    int port = at ? atoi(at + strlen("listening on http://127.0.0.1:")) : 0;
    lm_free(text);
    return port;
}

/* POSTs body to path on 127.0.0.1:port; returns the response (malloc'd) or NULL. */
static char *http_post(int port, const char *path, const char *body) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    char req[1024];
    int len = snprintf(req, sizeof req,
                       "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
                       "Content-Length: %zu\r\n\r\n%s",
                       path, strlen(body), body);
    if (write(fd, req, (size_t)len) != len) {
        close(fd);
        return NULL;
    }
    size_t cap = 65536, got = 0;
    char *resp = malloc(cap);
    ssize_t k;
    while (resp && got + 1 < cap && (k = read(fd, resp + got, cap - 1 - got)) > 0) got += (size_t)k;
    if (resp) resp[got] = '\0';
    close(fd);
    return resp;
}

static void test_serve_one_request(void) {
    const char *log = OUT "serve.log", *trace = OUT "serve.json";
    remove(log);
    remove(trace);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(log, "w", stderr);
        (void)f;
        execl(LOOM, LOOM, "serve", "--model", MODEL, "--port", "0", "--slots", "2", "--context", "64", "--threads", "2",
              "--trace", trace, (char *)NULL);
        _exit(127);
    }
    LT_CHECK(pid > 0);
    if (pid <= 0) return;
    int port = 0;
    for (int i = 0; i < 300 && !(port = listening_port(log)); i++) {
        struct timespec t = {0, 50 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
    LT_CHECK_MSG(port > 0, "loom serve did not start listening (see %s)", log);
    if (port > 0) {
        char *resp = http_post(port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":4}");
        LT_CHECK_MSG(resp && strstr(resp, "200 OK") && strstr(resp, "\"choices\""), "response: %s", resp ? resp : "(none)");
        free(resp);
    }
    kill(pid, SIGINT);
    int status = 0;
    waitpid(pid, &status, 0);
    LT_CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "loom serve ended with status %d (see %s)", status, log);
    check_trace("serve", trace,
                "request,queue,prefill,decode,finish,prefill step,decode step,sample,tokenize,matmul");
}

int main(void) {
    if (!exists(LOOM)) lt_skip("the loom binary is not built");
    LT_RUN(test_generate_with_option_and_environment);
    LT_RUN(test_trace_view);
    LT_RUN(test_error_exits_and_bad_paths);
    LT_RUN(test_bench);
    LT_RUN(test_train);
    LT_RUN(test_serve_one_request);
    return lt_finish();
}
