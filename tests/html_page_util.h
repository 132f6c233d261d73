/* tests/html_page_util.h — checks of loom's self-contained HTML pages (the plan timeline,
 * tests/plan/test_plan_timeline.c, and the step-trace page, tests/base/test_trace_view.c). */
#ifndef LOOM_TESTS_HTML_PAGE_UTIL_H
#define LOOM_TESTS_HTML_PAGE_UTIL_H

#include "harness.h"

#include <jansson.h>
#include <string.h>

/* A whole page that loads nothing: no network reference, no external script, link or import. */
static void check_self_contained(const char *html) {
    LT_CHECK(!strncmp(html, "<!DOCTYPE html>", 15));
    LT_CHECK(strstr(html, "</html>") != NULL);
    LT_CHECK_MSG(!strstr(html, "http://") && !strstr(html, "https://"), "the page references the network");
    LT_CHECK(!strstr(html, "<script src") && !strstr(html, "<link") && !strstr(html, "@import"));
}

/* The JSON object embedded in the page's <script type="application/json" id="ID">
 * (NULL, and a failure, when it is missing or does not parse). */
static json_t *page_data(const char *html, const char *id) {
    char open[96];
    snprintf(open, sizeof open, "<script type=\"application/json\" id=\"%s\">", id);
    const char *a = strstr(html, open);
    LT_CHECK_MSG(a != NULL, "no data element '%s' in the page", id);
    if (!a) return NULL;
    a += strlen(open);
    const char *b = strstr(a, "</script>");
    LT_CHECK(b != NULL);
    if (!b) return NULL;
    json_error_t err;
    json_t *d = json_loadb(a, (size_t)(b - a), 0, &err);
    LT_CHECK_MSG(d != NULL, "embedded JSON: %s (line %d)", err.text, err.line);
    return d;
}

#endif
