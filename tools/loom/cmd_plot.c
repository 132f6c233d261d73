/* tools/loom/cmd_plot.c — `loom plot-loss LOG -o loss.svg`: draws the training loss
 * (and the validation loss, when the log has it) of a `loom train` log.jsonl as a
 * self-contained SVG line chart: axes with round tick values (steps of 1, 2 or 5
 * times a power of ten), grid lines, one polyline per series, markers on the
 * validation points, a legend and a title. Lines that are not JSON objects with a
 * numeric "step" are skipped, so a log cut short by a crash still plots. Any finite
 * losses plot (up to +-1e308, or all equal): every coordinate written is finite.
 */
#include "args.h"
#include "commands.h"
#include "common.h"

#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct series {
    double *x, *y;
    int n, cap;
} series;

static int push(series *s, double x, double y) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        double *nx = realloc(s->x, sizeof(double) * (size_t)cap), *ny = nx ? realloc(s->y, sizeof(double) * (size_t)cap) : NULL;
        if (nx) s->x = nx;
        if (!nx || !ny) return 0;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
    return 1;
}

static int read_log(const char *path, series *train, series *val) {
    char *text = NULL;
    size_t len = 0;
    lm_status st = lm_file_read_all(path, &text, &len); /* refuses a FIFO or directory instead of blocking */
    if (st != LM_OK) {
        char what[1100];
        snprintf(what, sizeof what, "cannot read the log '%s'", path);
        cli_fail("plot-loss", what, st);
        return 0;
    }
    int ok = 1;
    for (char *line = text, *end; ok && line < text + len; line = end + 1) {
        end = memchr(line, '\n', (size_t)(text + len - line));
        if (!end) end = text + len;
        json_t *j = json_loadb(line, (size_t)(end - line), 0, NULL), *step = j ? json_object_get(j, "step") : NULL;
        json_t *loss = j ? json_object_get(j, "loss") : NULL, *vl = j ? json_object_get(j, "val_loss") : NULL;
        if (step && json_is_number(step) && isfinite(json_number_value(step))) {
            if (loss && json_is_number(loss) && isfinite(json_number_value(loss)))
                ok = push(train, json_number_value(step), json_number_value(loss));
            if (ok && vl && json_is_number(vl) && isfinite(json_number_value(vl)))
                ok = push(val, json_number_value(step), json_number_value(vl));
        }
        json_decref(j);
    }
    lm_free(text);
    if (!ok) fprintf(stderr, "loom plot-loss: out of memory\n");
    return ok;
}

/* A round tick step (1, 2 or 5 times a power of ten) giving about `want` ticks over a
 * span given as half (so a span of up to 2 * DBL_MAX is representable); 0 when no such
 * step is a finite positive double. */
static double nice_step(double half, int want) {
    double raw = half / want * 2, mag = pow(10, floor(log10(raw))), r = raw / mag;
    double step = (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
    return isfinite(step) && step > 0 ? step : 0;
}

/* Data ranges and their pixel mapping. The spans are kept as halves, x1 / 2 - x0 / 2,
 * which cannot overflow for finite ends (a full span of losses near +-1e308 would be
 * inf, and every coordinate NaN); all coordinates are then finite. */
typedef struct frame {
    double x0, x1, y0, y1; /* data range, finite, x0 < x1, y0 < y1 */
    double left, top, w, h; /* plot area in pixels */
} frame;

static double half_span(double lo, double hi) { return hi / 2 - lo / 2; }
static double px(const frame *f, double x) {
    return f->left + half_span(f->x0, x) / half_span(f->x0, f->x1) * f->w;
}
static double py(const frame *f, double y) {
    return f->top + (1 - half_span(f->y0, y) / half_span(f->y0, f->y1)) * f->h;
}

/* At most this many ticks per axis: a guard against a step too small to advance. */
enum { MAX_TICKS = 64 };
/* The largest image side accepted, in pixels. */
enum { MAX_PIXELS = 100000 };

static void axes(FILE *o, const frame *f) {
    double ys = nice_step(half_span(f->y0, f->y1), 6), xs = nice_step(half_span(f->x0, f->x1), 8);
    fprintf(o, "<g font-family=\"sans-serif\" font-size=\"12\" fill=\"#444\">\n");
    double y = ys > 0 ? ceil(f->y0 / ys) * ys : INFINITY;
    for (int n = 0; n < MAX_TICKS && isfinite(y) && y <= f->y1 + 1e-9 * ys; n++, y += ys) {
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", f->left, py(f, y),
                f->left + f->w, py(f, y));
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", f->left - 6, py(f, y) + 4, y);
    }
    double x = xs > 0 ? ceil(f->x0 / xs) * xs : INFINITY;
    for (int n = 0; n < MAX_TICKS && isfinite(x) && x <= f->x1 + 1e-9 * xs; n++, x += xs) {
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", px(f, x), f->top,
                px(f, x), f->top + f->h);
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", px(f, x), f->top + f->h + 18, x);
    }
    fprintf(o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#888\"/>\n", f->left,
            f->top, f->w, f->h);
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", f->left + f->w / 2, f->top + f->h + 38);
    fprintf(o, "<text transform=\"translate(%.1f %.1f) rotate(-90)\" text-anchor=\"middle\">loss</text>\n</g>\n",
            f->left - 48, f->top + f->h / 2);
}

static void line(FILE *o, const frame *f, const series *s, const char *color, int markers) {
    fprintf(o, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\" stroke-linejoin=\"round\" points=\"", color);
    for (int i = 0; i < s->n; i++) fprintf(o, "%s%.1f,%.1f", i ? " " : "", px(f, s->x[i]), py(f, s->y[i]));
    fprintf(o, "\"/>\n");
    for (int i = 0; markers && i < s->n; i++)
        fprintf(o, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", px(f, s->x[i]), py(f, s->y[i]), color);
}

static void legend(FILE *o, const frame *f, int with_val) {
    double x = f->left + f->w - 150, y = f->top + 12;
    fprintf(o, "<g font-family=\"sans-serif\" font-size=\"12\" fill=\"#222\">\n");
    fprintf(o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"140\" height=\"%d\" fill=\"white\" stroke=\"#ccc\"/>\n", x, y,
            with_val ? 44 : 24);
    fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#1f77b4\" stroke-width=\"2\"/>", x + 8, y + 12,
            x + 32, y + 12);
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\">training loss</text>\n", x + 40, y + 16);
    if (with_val) {
        fprintf(o, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"#ff7f0e\"/>", x + 20, y + 32);
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\">validation loss</text>\n", x + 40, y + 36);
    }
    fprintf(o, "</g>\n");
}

static void range(const series *s, double *lo, double *hi, int use_x) {
    for (int i = 0; i < s->n; i++) {
        double v = use_x ? s->x[i] : s->y[i];
        *lo = v < *lo ? v : *lo;
        *hi = v > *hi ? v : *hi;
    }
}

/* text with the XML special characters escaped */
static void xml_text(FILE *o, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", o);
        else if (*s == '>') fputs("&gt;", o);
        else if (*s == '&') fputs("&amp;", o);
        else fputc(*s, o);
    }
}

static int write_svg(const char *path, const char *title, int width, int height, const series *tr, const series *va) {
    frame f = {INFINITY, -INFINITY, INFINITY, -INFINITY, 70, 40, width - 100.0, height - 100.0};
    range(tr, &f.x0, &f.x1, 1), range(va, &f.x0, &f.x1, 1);
    range(tr, &f.y0, &f.y1, 0), range(va, &f.y0, &f.y1, 0);
    if (f.x1 <= f.x0) { /* one step: one unit wide (or wide enough to differ at the step's magnitude) */
        double d = fmax(1, fabs(f.x0) * 1e-12);
        if (f.x0 + d <= DBL_MAX) f.x1 = f.x0 + d;
        else f.x0 -= d;
    }
    /* 5% of the span above and below; equal losses get 5% of their value (at least 1e-6),
     * so that the range stays wider than the rounding at their magnitude */
    double half = half_span(f.y0, f.y1), pad = half > 0 ? half * 0.1 + 1e-6 : fmax(fabs(f.y0) * 0.05, 1e-6);
    f.y0 = fmax(f.y0 - pad, -DBL_MAX), f.y1 = fmin(f.y1 + pad, DBL_MAX);
    FILE *o = fopen(path, "w");
    if (!o) {
        fprintf(stderr, "loom plot-loss: cannot write '%s': %s\n", path, strerror(errno));
        return 1;
    }
    fprintf(o, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n", width, height,
            width, height);
    fprintf(o, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(o, "<text x=\"%d\" y=\"24\" font-family=\"sans-serif\" font-size=\"15\" text-anchor=\"middle\" fill=\"#222\">",
            width / 2);
    xml_text(o, title);
    fprintf(o, "</text>\n");
    axes(o, &f);
    line(o, &f, tr, "#1f77b4", 0);
    if (va->n) line(o, &f, va, "#ff7f0e", 1);
    legend(o, &f, va->n > 0);
    fprintf(o, "</svg>\n");
    return fclose(o) == 0 ? 0 : 1;
}

int cmd_plot(int argc, char **argv) {
    const char *out = NULL, *title = "loss";
    int width = 800, height = 480;
    const cli_opt opts[] = {{"out", CLI_STRING, &out, "FILE: the SVG to write (also -o; required)"},
                            {"title", CLI_STRING, &title, "TEXT: chart title (default: loss)"},
                            {"width", CLI_INT, &width, "PX: image width, 200 to 100000 (default 800)"},
                            {"height", CLI_INT, &height, "PX: image height, 150 to 100000 (default 480)"},
                            {NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos = 0;
    int rc = cli_parse("plot-loss", "LOG.jsonl -o loss.svg [--title T]", opts, argc, argv, pos, 1, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (npos != 1 || !out) {
        fprintf(stderr, "loom plot-loss: give one log file and -o FILE\n");
        return 2;
    }
    if (width < 200 || width > MAX_PIXELS || height < 150 || height > MAX_PIXELS) {
        fprintf(stderr, "loom plot-loss: --width %d x --height %d: the size must be at least 200 x 150 and at most "
                        "%d x %d\n", width, height, MAX_PIXELS, MAX_PIXELS);
        return 2;
    }
    struct stat sb;
    if (stat(out, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "loom plot-loss: -o '%s' is a directory\n", out);
        return 2;
    }
    series tr = {0}, va = {0};
    rc = read_log(pos[0], &tr, &va) ? 0 : 1;
    if (!rc && tr.n == 0) {
        fprintf(stderr, "loom plot-loss: '%s' has no training loss lines\n", pos[0]);
        rc = 1;
    }
    if (!rc) rc = write_svg(out, title, width, height, &tr, &va);
    free(tr.x), free(tr.y), free(va.x), free(va.y);
    return rc;
}
