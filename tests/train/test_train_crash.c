/* Crash safety of `loom train` checkpoints as a tested property. The real loom binary
 * trains the tiny tests/data/train/loom_checkpoint model for 3 steps with --save-every
 * 1 (three saves: checkpoint-000001, checkpoint-000002, final) and is killed with
 * SIGKILL at every phase of a save (the LOOM_TEST_KILL_AT hook of src/train/trainer.c):
 * on new checkpoint names, and on names that already hold a checkpoint of another run,
 * through the atomic exchange and through the fallback renames
 * (LOOM_TEST_NO_RENAME_EXCHANGE). After every kill:
 *   - every directory under a checkpoint name is complete (lm_train_checkpoint_check)
 *     and holds, bit for bit, the old or the new checkpoint as the phase implies; the
 *     one moment the name is missing, the old checkpoint is complete in NAME.old-PID;
 *   - partial leftovers are refused as checkpoints (also by `loom train --resume`);
 *   - the next run restores NAME.old-PID and removes every leftover, one stderr line
 *     each, resumes from the newest complete checkpoint and ends with the weights and
 *     the log (every step once, same losses) of an uninterrupted run.
 * Also `loom train`'s start-up checks: every input before the first step (tokenizer,
 * token ids against the model's vocabulary, a writable output directory; the last
 * skipped as root), and --steps at or below a resumed checkpoint's step (exit 2).
 * LM_TEST_LABELS: unit model
 */
#include "harness.h"
#include "loom/train.h"

#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define LOOM LOOM_BINARY_DIR "/loom"
#define MODEL LOOM_SOURCE_DIR "/tests/data/train/loom_checkpoint"
#define TOKENIZER LOOM_SOURCE_DIR "/tests/data/train/tokenizer.json"
#define SHARD LOOM_BINARY_DIR "/train_crash.bin"
#define STDERR_FILE LOOM_BINARY_DIR "/train_crash_stderr.txt"
#define WORK LOOM_BINARY_DIR "/train_crash"

/* The checkpoints of a 3-step run with --save-every 1, in save order, and their steps. */
static const char *const k_names[3] = {"checkpoint-000001", "checkpoint-000002", "final"};

/* Save phases in protocol order; from "after-swap" on the new checkpoint has its name. */
static const char *const k_phases[] = {"after-weights", "after-state",       "before-swap",   "after-move-aside",
                                       "after-swap",    "before-remove-old", "mid-remove-old"};
enum { AFTER_MOVE_ASIDE = 3, AFTER_SWAP = 4, NPHASES = 7 };

typedef struct proc {
    long pid;
    int killed; /* died of SIGKILL */
    int status; /* exit status, -1 when killed */
    char *err;  /* its stderr */
} proc;

static void proc_free(proc *p) { lm_free(p->err); }

/* Runs `loom train` with the common options plus extra (NULL-terminated), the kill
 * hook set to kill_at (NULL: none) and the fallback scheme forced when no_exchange. */
static proc train(const char *out, const char *kill_at, int no_exchange, const char *const *extra) {
    const char *argv[48] = {LOOM,          "train",      "--data",     SHARD, "--out", out, "--steps", "3", "--batch", "2",
                            "--seq",       "16",         "--threads",  "1",   "--save-every", "1", "--tokenizer",
                            TOKENIZER};
    int n = 18;
    for (; *extra && n < 47; extra++) argv[n++] = *extra;
    argv[n] = NULL;
    proc p = {0, 0, -1, NULL};
    pid_t pid = fork();
    if (pid == 0) {
        int err = open(STDERR_FILE, O_WRONLY | O_CREAT | O_TRUNC, 0644), null = open("/dev/null", O_WRONLY);
        if (err < 0 || null < 0 || dup2(null, 1) < 0 || dup2(err, 2) < 0) _exit(126);
        if (kill_at) setenv("LOOM_TEST_KILL_AT", kill_at, 1);
        else unsetenv("LOOM_TEST_KILL_AT");
        if (no_exchange) setenv("LOOM_TEST_NO_RENAME_EXCHANGE", "1", 1);
        else unsetenv("LOOM_TEST_NO_RENAME_EXCHANGE");
        execv(LOOM, (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) {
        LT_CHECK_MSG(0, "cannot run %s", LOOM);
        return p;
    }
    p.pid = pid;
    p.killed = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
    p.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    size_t len = 0;
    if (lm_file_read_all(STDERR_FILE, &p.err, &len) != LM_OK) p.err = NULL;
    return p;
}

static int sh(const char *fmt, const char *a, const char *b) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    return system(cmd);
}

static int remove_tree(const char *path) { return sh("rm -rf '%s'%s", path, ""); }

static int exists(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0;
}

/* The model.safetensors bytes of checkpoint name in dir (NULL when absent). */
static char *weights(const char *dir, const char *name, size_t *n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, name);
    char *data = NULL;
    *n = 0;
    if (lm_file_read_all(path, &data, n) != LM_OK) return NULL;
    return data;
}

/* The weights of the three checkpoints of a finished run. */
typedef struct ckset {
    char *w[3];
    size_t n[3];
} ckset;

static void ckset_load(ckset *s, const char *dir) {
    for (int i = 0; i < 3; i++) {
        s->w[i] = weights(dir, k_names[i], &s->n[i]);
        LT_CHECK_MSG(s->w[i] != NULL, "%s/%s has no weights", dir, k_names[i]);
    }
}

static void ckset_free(ckset *s) {
    for (int i = 0; i < 3; i++) lm_free(s->w[i]);
}

static int same_weights(const char *dir, const char *name, const ckset *s, int i) {
    size_t n = 0;
    char *w = weights(dir, name, &n);
    int same = w && s->w[i] && n == s->n[i] && memcmp(w, s->w[i], n) == 0;
    lm_free(w);
    return same;
}

/* The (step, loss) lines of dir/log.jsonl; returns how many (at most max). */
static int log_steps(const char *dir, long long *steps, double *losses, int max) {
    char path[1024], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/log.jsonl", dir);
    if (lm_file_read_all(path, &text, &len) != LM_OK) return 0;
    int n = 0;
    for (char *line = strtok(text, "\n"); line && n < max; line = strtok(NULL, "\n")) {
        json_t *j = json_loads(line, 0, NULL), *loss = j ? json_object_get(j, "loss") : NULL;
        if (loss) {
            steps[n] = json_integer_value(json_object_get(j, "step"));
            losses[n++] = json_number_value(loss);
        }
        json_decref(j);
    }
    lm_free(text);
    return n;
}

/* Reference runs: A, fresh with the default lr; B, fresh with --lr 1e-3 (the run whose
 * checkpoints the overwrite cases replace); C, B resumed from its checkpoint-000001
 * with the default lr (what an overwriting run must end with). */
static ckset g_a, g_b, g_c;
static long long g_a_steps[3], g_c_steps[3];
static double g_a_loss[3], g_c_loss[3];

static int prepare(void) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s data prepare --tokenizer %s %s/tests/data/train/corpus.txt -o %s >/dev/null", LOOM,
             TOKENIZER, LOOM_SOURCE_DIR, SHARD);
    LT_CHECK(system(cmd) == 0);
    LT_CHECK(sh("rm -rf '%s' && mkdir -p '%s'", WORK, WORK) == 0);
    const char *fresh[] = {"--model", MODEL, NULL}, *fast[] = {"--model", MODEL, "--lr", "1e-3", NULL};
    const char *resume[] = {"--resume", WORK "/c/checkpoint-000001", NULL};
    proc a = train(WORK "/a", NULL, 0, fresh), b = train(WORK "/b", NULL, 0, fast);
    LT_CHECK_MSG(a.status == 0 && b.status == 0, "reference runs: exit %d, %d: %s", a.status, b.status,
                 a.err ? a.err : "");
    LT_CHECK(sh("cp -r '%s' '%s'", WORK "/b", WORK "/c") == 0);
    proc c = train(WORK "/c", NULL, 0, resume);
    LT_CHECK_MSG(c.status == 0, "resumed reference run: exit %d: %s", c.status, c.err ? c.err : "");
    /* the resumed run's log: steps 2 and 3 of B replaced, not repeated */
    LT_CHECK_MSG(c.err && strstr(c.err, "dropped 2 lines logged after step 1"), "stderr: %s", c.err ? c.err : "");
    proc_free(&a), proc_free(&b), proc_free(&c);
    ckset_load(&g_a, WORK "/a"), ckset_load(&g_b, WORK "/b"), ckset_load(&g_c, WORK "/c");
    LT_CHECK(log_steps(WORK "/a", g_a_steps, g_a_loss, 3) == 3);
    LT_CHECK(log_steps(WORK "/c", g_c_steps, g_c_loss, 3) == 3);
    for (int i = 0; i < 3; i++) LT_CHECK(g_a_steps[i] == i + 1 && g_c_steps[i] == i + 1);
    /* the overwrite cases can tell the old checkpoint from the new one */
    LT_CHECK(g_b.w[1] && g_c.w[1] && g_b.n[1] == g_c.n[1] && memcmp(g_b.w[1], g_c.w[1], g_b.n[1]) != 0);
    LT_CHECK(same_weights(WORK "/c", k_names[0], &g_b, 0));
    return lt_failures_in_test == 0;
}

typedef struct scenario {
    int phase;       /* index into k_phases */
    int save;        /* 1-based save of the killed process */
    int overwrite;   /* the killed run resumes B's checkpoint-000001 in a copy of B */
    int no_exchange; /* fallback renames */
} scenario;

/* Which run's checkpoint name i must hold right after the kill: 'A', 'B', 'C' or 0
 * (absent, or for AFTER_MOVE_ASIDE only under NAME.old-PID). */
static char expected_after_kill(const scenario *s, int i) {
    int replaced = s->phase >= AFTER_SWAP; /* the save's new checkpoint has its name */
    if (!s->overwrite) {
        int save = i + 1; /* fresh run: save k writes k_names[k - 1] */
        return save < s->save || (save == s->save && replaced) ? 'A' : 0;
    }
    if (i == 0) return 'B'; /* resumed from, never written */
    if (i < s->save) return 'C';
    if (i > s->save) return 'B';
    return replaced ? 'C' : s->phase == AFTER_MOVE_ASIDE ? 0 : 'B';
}

static const ckset *set_of(char c) { return c == 'A' ? &g_a : c == 'B' ? &g_b : &g_c; }

static int g_cli_partial_checked;

/* The output directory right after the kill: names hold complete checkpoints as
 * expected, leftovers belong to the killed process and partial ones are refused.
 * Returns the index of the newest checkpoint name present, -1 for none. */
static int check_after_kill(const char *out, const scenario *s, long pid, const char *what) {
    int newest = -1;
    for (int i = 0; i < 3; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", out, k_names[i]);
        char want = expected_after_kill(s, i);
        if (!want) {
            LT_CHECK_MSG(!exists(path), "%s: %s exists", what, k_names[i]);
            continue;
        }
        int64_t step = -1;
        LT_CHECK_MSG(lm_train_checkpoint_check(path, &step) == LM_OK && step == i + 1, "%s: %s: %s", what, k_names[i],
                     lm_last_error());
        LT_CHECK_MSG(same_weights(out, k_names[i], set_of(want), i), "%s: %s is not run %c's", what, k_names[i], want);
        lm_train_model *m = NULL;
        LT_CHECK_OK(lm_train_model_load(path, lm_device_cpu(), &m));
        lm_train_model_destroy(m);
        newest = i;
    }
    if (s->phase == AFTER_MOVE_ASIDE) { /* the old checkpoint, complete, where recovery finds it */
        char old[1024];
        snprintf(old, sizeof old, "%s/%s.old-%ld", out, k_names[s->save], pid);
        LT_CHECK_MSG(lm_train_checkpoint_check(old, NULL) == LM_OK, "%s: %s", what, lm_last_error());
        LT_CHECK_MSG(same_weights(out, strrchr(old, '/') + 1, &g_b, s->save), "%s: %s is not the old checkpoint", what,
                     old);
        /* recovery (in a copy: the next run must still find the leftovers) puts it back */
        const char *copy = WORK "/recovered";
        LT_CHECK(remove_tree(copy) == 0 && sh("cp -r '%s' '%s'", out, copy) == 0);
        LT_CHECK_OK(lm_train_checkpoints_recover(copy, NULL, NULL));
        LT_CHECK_MSG(same_weights(copy, k_names[s->save], &g_b, s->save), "%s: recovery did not restore %s", what,
                     k_names[s->save]);
    }
    DIR *d = opendir(out);
    struct dirent *e;
    char suffix[32];
    snprintf(suffix, sizeof suffix, "-%ld", pid);
    while (d && (e = readdir(d)) != NULL) {
        if (!strstr(e->d_name, ".tmp-") && !strstr(e->d_name, ".old-")) continue;
        size_t n = strlen(e->d_name), k = strlen(suffix);
        LT_CHECK_MSG(n > k && !strcmp(e->d_name + n - k, suffix), "%s: a leftover of another process: %s", what,
                     e->d_name);
        char path[1024], state[1100];
        snprintf(path, sizeof path, "%s/%s", out, e->d_name);
        snprintf(state, sizeof state, "%s/train_state.bin", path);
        if (exists(state) || (!strstr(e->d_name, "checkpoint") && strncmp(e->d_name, "final", 5))) continue;
        /* partial: not a checkpoint, for the library and for `loom train --resume` */
        LT_CHECK_STATUS(lm_train_checkpoint_check(path, NULL), LM_NOT_FOUND);
        LT_CHECK_MSG(strstr(lm_last_error(), "train_state.bin") != NULL, "%s", lm_last_error());
        if (g_cli_partial_checked++) continue;
        const char *extra[] = {"--resume", path, NULL};
        proc r = train(WORK "/other", NULL, 0, extra);
        LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, "incomplete") && strstr(r.err, "train_state.bin") &&
                         !strstr(r.err, "step 1/"),
                     "--resume %s: exit %d: %s", path, r.status, r.err ? r.err : "");
        proc_free(&r);
    }
    if (d) closedir(d);
    return newest;
}

/* Every .tmp-/.old- entry of out, as "out/name" lines in buf. */
static void leftovers(const char *out, char *buf, size_t size) {
    buf[0] = '\0';
    DIR *d = opendir(out);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".tmp-") || strstr(e->d_name, ".old-"))
            snprintf(buf + strlen(buf), size - strlen(buf), "%s/%s\n", out, e->d_name);
    if (d) closedir(d);
}

static void run_scenario(const scenario *s) {
    const char *out = WORK "/out";
    char what[160], kill_at[64];
    snprintf(what, sizeof what, "%s, save %d, %s%s", k_phases[s->phase], s->save,
             s->overwrite ? "over existing checkpoints" : "new names", s->no_exchange ? ", fallback renames" : "");
    snprintf(kill_at, sizeof kill_at, "%s:%d", k_phases[s->phase], s->save);
    LT_CHECK(remove_tree(out) == 0);
    if (s->overwrite) LT_CHECK(sh("cp -r '%s' '%s'", WORK "/b", out) == 0);
    const char *from_model[] = {"--model", MODEL, NULL}, *from_b1[] = {"--resume", WORK "/out/checkpoint-000001", NULL};
    proc k = train(out, kill_at, s->no_exchange, s->overwrite ? from_b1 : from_model);
    LT_CHECK_MSG(k.killed, "%s: not killed (exit %d): %s", what, k.status, k.err ? k.err : "");
    int newest = check_after_kill(out, s, k.pid, what);

    /* the next run: recovery, then on from the newest complete checkpoint to the end */
    char left[4096], resume_dir[1024];
    leftovers(out, left, sizeof left);
    snprintf(resume_dir, sizeof resume_dir, "%s/%s", out, k_names[s->overwrite ? 0 : newest < 0 ? 0 : newest]);
    const char *resume[] = {"--resume", resume_dir, NULL};
    int final_done = !s->overwrite && newest == 2;
    proc r = train(out, NULL, 0, s->overwrite || newest >= 0 ? resume : from_model);
    if (final_done) /* nothing left to train: refused, naming both numbers, after the clean-up */
        LT_CHECK_MSG(r.status == 2 && r.err && strstr(r.err, "--steps 3 is not beyond step 3"), "%s: exit %d: %s", what,
                     r.status, r.err ? r.err : "");
    else
        LT_CHECK_MSG(r.status == 0, "%s: the next run: exit %d: %s", what, r.status, r.err ? r.err : "");
    for (char *line = strtok(left, "\n"); line; line = strtok(NULL, "\n")) {
        LT_CHECK_MSG(!exists(line), "%s: %s was not cleaned up", what, line);
        char removed[1100];
        snprintf(removed, sizeof removed, "'%s'", line);
        LT_CHECK_MSG(r.err && strstr(r.err, removed) && (strstr(r.err, "removed") || strstr(r.err, "restored")),
                     "%s: no line about %s in: %s", what, line, r.err ? r.err : "");
    }
    if (s->phase == AFTER_MOVE_ASIDE)
        LT_CHECK_MSG(r.err && strstr(r.err, "restored"), "%s: stderr: %s", what, r.err ? r.err : "");
    /* the same checkpoints and log as an uninterrupted run */
    const ckset *want = s->overwrite ? &g_c : &g_a;
    for (int i = 0; i < 3; i++)
        LT_CHECK_MSG(same_weights(out, k_names[i], i == 0 && s->overwrite ? &g_b : want, i), "%s: %s differs from "
                                                                                              "the uninterrupted run's",
                     what, k_names[i]);
    long long steps[8];
    double losses[8];
    int n = log_steps(out, steps, losses, 8);
    const double *want_loss = s->overwrite ? g_c_loss : g_a_loss;
    LT_CHECK_MSG(n == 3, "%s: %d step lines in log.jsonl", what, n);
    for (int i = 0; i < n && i < 3; i++)
        LT_CHECK_MSG(steps[i] == i + 1 && losses[i] == want_loss[i], "%s: log line %d: step %lld loss %.9g", what, i,
                     steps[i], losses[i]);
    proc_free(&k), proc_free(&r);
}

static void test_a_killed_save_never_loses_a_checkpoint(void) {
    if (!prepare()) return;
    int runs = 0;
    /* new names: saves 1 (the first checkpoint) and 3 (final after two others) */
    static const int fresh_phases[] = {0, 1, 2, 4, 5};
    for (int save = 1; save <= 3; save += 2)
        for (size_t p = 0; p < sizeof fresh_phases / sizeof fresh_phases[0]; p++, runs++)
            run_scenario(&(scenario){fresh_phases[p], save, 0, 0});
    /* replacing B's checkpoint-000002 (save 1) and final (save 2), both schemes */
    for (int no_exchange = 0; no_exchange <= 1; no_exchange++)
        for (int save = 1; save <= 2; save++)
            for (int p = 0; p < NPHASES; p++) {
                if (p == AFTER_MOVE_ASIDE && !no_exchange) continue; /* only the fallback moves aside */
                run_scenario(&(scenario){p, save, 1, no_exchange});
                runs++;
            }
    printf("  %d saves killed, each recovered and resumed to the uninterrupted run's weights and log\n", runs);
    LT_CHECK_MSG(g_cli_partial_checked > 0, "no partial leftover was seen");
    ckset_free(&g_a), ckset_free(&g_b), ckset_free(&g_c);
}

/* Each bad input is refused before the first step (nothing trained, nothing saved),
 * with a message naming it. */
static void test_inputs_are_checked_before_the_first_step(void) {
    const char *out = WORK "/inputs";
    int32_t ids[64];
    for (int i = 0; i < 64; i++) ids[i] = i == 40 ? 400 : i % 50; /* 400: beyond the model's 385 ids */
    LT_CHECK_OK(lm_token_shard_write(WORK "/no_vocab.bin", ids, 64, 0));
    ids[40] = 7;
    LT_CHECK_OK(lm_token_shard_write(WORK "/big_vocab.bin", ids, 64, 999));
    struct {
        const char *opt, *value;
        int status;
        const char *needle;
    } cases[] = {
        {"--tokenizer", "/nonexistent.json", 1, "'/nonexistent.json': No such file or directory"},
        {"--tokenizer", LOOM_SOURCE_DIR, 1, "is not a regular file"},
        {"--tokenizer", MODEL "/config.json", 1, "--tokenizer does not load"},
        {"--data", WORK "/no_vocab.bin", 1, "holds token id 400 (at index 40), outside the model's vocabulary of 385"},
        {"--val-data", WORK "/no_vocab.bin", 1, "holds token id 400"},
        {"--data", WORK "/big_vocab.bin", 1, "vocabulary of 999 ids, but the model has 385"},
        {"--resume", WORK "/a/checkpoint-000002", 2, "--steps 1 is not beyond step 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        LT_CHECK(remove_tree(out) == 0);
        int resume = !strcmp(cases[i].opt, "--resume");
        const char *extra[] = {resume ? "--steps" : "--model", resume ? "1" : MODEL, cases[i].opt, cases[i].value, NULL};
        proc r = train(out, NULL, 0, extra);
        LT_CHECK_MSG(r.status == cases[i].status && r.err && strstr(r.err, cases[i].needle) && !strstr(r.err, "step 1/"),
                     "%s %s: exit %d: %s", cases[i].opt, cases[i].value, r.status, r.err ? r.err : "");
        char final[1024];
        snprintf(final, sizeof final, "%s/final", out);
        LT_CHECK(!exists(final));
        proc_free(&r);
    }
    if (geteuid() == 0) {
        printf("  (running as root, which ignores permissions: the read-only output directory part is skipped)\n");
        return;
    }
    LT_CHECK(sh("rm -rf '%s' && mkdir -p '%s'", out, out) == 0);
    LT_CHECK(chmod(out, 0555) == 0);
    const char *extra[] = {"--model", MODEL, NULL};
    proc r = train(out, NULL, 0, extra);
    LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, "not writable") && strstr(r.err, "Permission denied") &&
                     !strstr(r.err, "step 1/"),
                 "read-only --out: exit %d: %s", r.status, r.err ? r.err : "");
    proc_free(&r);
    chmod(out, 0755);
}

int main(void) {
    LT_RUN(test_a_killed_save_never_loses_a_checkpoint);
    LT_RUN(test_inputs_are_checked_before_the_first_step);
    return lt_finish();
}
