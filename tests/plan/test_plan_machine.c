/* Machine descriptions: the ipu21 preset's sourced constants, the small presets,
 * JSON loading with a base preset and overrides, the JSON round trip, and every
 * malformed-description error with a message naming the source and the field.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "loom/plan.h"

#include <stdio.h>
#include <string.h>

static void test_ipu21_preset_has_the_documented_constants(void) {
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_preset("ipu21", &m));
    LT_CHECK(!strcmp(lm_plan_machine_name(m), "ipu21"));
    LT_CHECK(lm_plan_machine_tiles(m) == 1472);
    LT_CHECK(lm_plan_machine_sram_bytes(m) == 624 * 1024);
    LT_CHECK(lm_plan_machine_clock_hz(m) == 1.5e9);
    LT_CHECK(lm_plan_machine_matmul_flops(m, LM_F16) == 128);
    LT_CHECK(lm_plan_machine_matmul_flops(m, LM_F32) == 32);
    LT_CHECK(lm_plan_machine_matmul_flops(m, LM_BF16) == 0);
    /* the peak rate the constants imply: 1472 x 128 x 1.5 GHz = 282.6 TFLOPS (C600: 280) */
    double tflops = 1472.0 * 128 * 1.5e9 / 1e12;
    LT_CHECK(tflops > 270 && tflops < 290);
    lm_plan_machine_destroy(m);
}

static void test_small_presets_and_unknown_names(void) {
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_preset("small16", &m));
    LT_CHECK(lm_plan_machine_tiles(m) == 16 && lm_plan_machine_sram_bytes(m) == 64 * 1024);
    LT_CHECK(lm_plan_machine_matmul_flops(m, LM_F16) == 128);
    lm_plan_machine_destroy(m);
    LT_CHECK_OK(lm_plan_machine_preset("small4", &m));
    LT_CHECK(lm_plan_machine_tiles(m) == 4);
    lm_plan_machine_destroy(m);
    m = (lm_plan_machine *)1;
    LT_CHECK_STATUS(lm_plan_machine_preset("ipu99", &m), LM_NOT_FOUND);
    LT_CHECK(m == NULL);
    LT_CHECK(strstr(lm_last_error(), "ipu99") != NULL);
    LT_CHECK_STATUS(lm_plan_machine_preset(NULL, &m), LM_INVALID_ARGUMENT);
    lm_plan_machine_destroy(NULL);
}

static void test_json_overrides_a_base_preset(void) {
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_parse("{\"base\":\"small16\",\"name\":\"mine\",\"tiles\":32,\"sram_bytes\":131072,"
                                      "\"exch_bytes_per_cycle\":8.5}",
                                      "inline", &m));
    LT_CHECK(!strcmp(lm_plan_machine_name(m), "mine"));
    LT_CHECK(lm_plan_machine_tiles(m) == 32 && lm_plan_machine_sram_bytes(m) == 131072);
    char *js = NULL;
    LT_CHECK_OK(lm_plan_machine_to_json(m, &js));
    LT_CHECK(js && strstr(js, "\"exch_bytes_per_cycle\":8.5") && strstr(js, "\"tiles\":32"));
    /* the dump parses back to the same machine */
    lm_plan_machine *m2 = NULL;
    LT_CHECK_OK(lm_plan_machine_parse(js, "dump", &m2));
    char *js2 = NULL;
    LT_CHECK_OK(lm_plan_machine_to_json(m2, &js2));
    LT_CHECK(js2 && !strcmp(js, js2));
    lm_free(js);
    lm_free(js2);
    lm_plan_machine_destroy(m);
    lm_plan_machine_destroy(m2);
    /* no base: ipu21 */
    LT_CHECK_OK(lm_plan_machine_parse("{\"sync_cycles\":100}", "x", &m));
    LT_CHECK(lm_plan_machine_tiles(m) == 1472);
    lm_plan_machine_destroy(m);
}

static void expect_parse_error(const char *json, const char *needle) {
    lm_plan_machine *m = (lm_plan_machine *)1;
    LT_CHECK_STATUS(lm_plan_machine_parse(json, "bad.json", &m), LM_PARSE_ERROR);
    LT_CHECK(m == NULL);
    LT_CHECK_MSG(strstr(lm_last_error(), needle) && strstr(lm_last_error(), "bad.json"),
                 "error '%s' should mention '%s' and the source", lm_last_error(), needle);
}

static void test_malformed_json_gives_clear_errors(void) {
    expect_parse_error("{\"tiles\":", "invalid JSON");
    expect_parse_error("[1,2]", "not an object");
    expect_parse_error("{\"tilez\":4}", "unknown field \"tilez\"");
    expect_parse_error("{\"tiles\":\"many\"}", "\"tiles\" is not a number");
    expect_parse_error("{\"tiles\":2.5}", "\"tiles\" must be an integer");
    expect_parse_error("{\"tiles\":0}", "\"tiles\" = 0 is outside");
    expect_parse_error("{\"clock_hz\":-1}", "\"clock_hz\"");
    expect_parse_error("{\"align\":12}", "not a power of two");
    expect_parse_error("{\"sram_bytes\":1001}", "not a multiple of align");
    expect_parse_error("{\"base\":\"nope\"}", "\"base\"");
    expect_parse_error("{\"base\":3}", "\"base\" is not a string");
    expect_parse_error("{\"name\":\"\"}", "\"name\"");
    expect_parse_error("{\"tiles\":4,\"tiles\":5}", "invalid JSON");
}

static void test_load_from_file_and_missing_file(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/plan_machine_test.json", LOOM_BINARY_DIR);
    FILE *f = fopen(path, "w");
    LT_CHECK(f != NULL);
    if (!f) return;
    fputs("{\"base\":\"small4\",\"sram_bytes\":16384}", f);
    fclose(f);
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_load(path, &m));
    LT_CHECK(lm_plan_machine_tiles(m) == 4 && lm_plan_machine_sram_bytes(m) == 16384);
    lm_plan_machine_destroy(m);
    remove(path);
    LT_CHECK_STATUS(lm_plan_machine_load("/nonexistent/machine.json", &m), LM_IO_ERROR);
    LT_CHECK(strstr(lm_last_error(), "/nonexistent/machine.json") != NULL);
}

static void test_allocation_failures_leak_nothing(void) {
    for (int k = 1; k <= 4; k++) {
        lt_alloc_track(k);
        lm_plan_machine *m = NULL;
        lm_status st = lm_plan_machine_parse("{\"tiles\":8}", "x", &m);
        LT_CHECK(st == LM_OK || st == LM_OUT_OF_MEMORY);
        lm_plan_machine_destroy(m);
        LT_CHECK(lt_alloc_live() == 0);
        lt_alloc_untrack();
    }
}

int main(void) {
    LT_RUN(test_ipu21_preset_has_the_documented_constants);
    LT_RUN(test_small_presets_and_unknown_names);
    LT_RUN(test_json_overrides_a_base_preset);
    LT_RUN(test_malformed_json_gives_clear_errors);
    LT_RUN(test_load_from_file_and_missing_file);
    LT_RUN(test_allocation_failures_leak_nothing);
    return lt_finish();
}
