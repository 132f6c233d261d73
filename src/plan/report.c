/* plan/report.c — human and machine readable reports of a plan and its simulation:
 * the mid program listing, a text summary, a JSON object and an SVG timeline.
 *
 * All outputs are built in memory (lm__plan_sbuf) and handed to the caller; the library
 * never prints. The SVG draws one bar per simulated phase on a cycle axis: compute
 * supersteps, exchange phases (sync drawn separately) and their labels.
 */
#include "plan/low.h"

#include <math.h>
#include <stdio.h>

static void layout_str(const lm__plan_layout *l, char *buf, size_t n) { lm__plan_layout_format(l, buf, n); }

static const char *mop_name(const lm_plan *p, const lm__plan_mop *o) {
    if (o->gop >= 0) return p->g->ops[o->gop].name;
    return "";
}

/* " + bias + gelu" for a fused epilogue (planner.h, LM__PLAN_EPI_*). */
static void epi_text(const lm__plan_mop *o, lm__plan_sbuf *b) {
    if (o->epi & LM__PLAN_EPI_BIAS) lm__plan_sbuf_printf(b, " + bias");
    if (o->epi & LM__PLAN_EPI_GELU) lm__plan_sbuf_printf(b, " + gelu");
    if (o->epi & LM__PLAN_EPI_SILU) lm__plan_sbuf_printf(b, " + silu");
    if (o->epi) lm__plan_sbuf_printf(b, " (fused)");
}

static void describe_ops(const lm_plan *p, lm__plan_sbuf *b) {
    const lm__plan_mid *mid = &p->mid;
    int depth = 0;
    int64_t ends[8];
    for (int64_t i = 0; i < mid->nops; i++) {
        while (depth && ends[depth - 1] == i) depth--;
        const lm__plan_mop *o = &mid->ops[i];
        char out[200] = "", in[200] = "";
        if (o->out >= 0) layout_str(&mid->vals[o->out].l, out, sizeof out);
        if (o->nin) layout_str(&mid->vals[o->in[0]].l, in, sizeof in);
        lm__plan_sbuf_printf(b, "%4lld %*s%-10s ", (long long)i, 2 * depth, "", lm__plan_mid_kind_name(o->kind));
        switch (o->kind) {
        case LM__PLAN_M_COMPUTE:
            lm__plan_sbuf_printf(b, "%s (%s)", mop_name(p, o), lm__gop_name(p->g->ops[o->gop].kind));
            if (p->g->ops[o->gop].kind == LM__GOP_MATMUL)
                lm__plan_sbuf_printf(b, " grid b%lld m%lld n%lld k%lld", (long long)o->grid[0], (long long)o->grid[1],
                                     (long long)o->grid[2], (long long)o->grid[3]);
            if (o->steps > 1) lm__plan_sbuf_printf(b, " in %lld K steps", (long long)o->steps);
            epi_text(o, b);
            lm__plan_sbuf_printf(b, " -> %s  [%.0f cycles]\n", out, o->cost);
            break;
        case LM__PLAN_M_FLASH: {
            int op = p->g->ops[o->gop].kind == LM__GOP_ATTENTION; /* else the pattern's first..last op */
            lm__plan_sbuf_printf(b, "%s%s%s grid h%lld q%lld kv%lld steps %lld -> %s  [%.0f cycles]\n", mop_name(p, o),
                                 op ? " (attention)" : "..", op ? "" : p->g->values[p->mid.vals[o->out].value].name,
                                 (long long)o->grid[0], (long long)o->grid[1], (long long)o->grid[2],
                                 (long long)o->grid[3], out, o->cost);
            break;
        }
        case LM__PLAN_M_COPY:
        case LM__PLAN_M_EXCHANGE:
        case LM__PLAN_M_REDUCE:
            lm__plan_sbuf_printf(b, "%s: %s",
                                 p->g->values[mid->vals[o->kind == LM__PLAN_M_REDUCE ? o->in[0] : o->out].value].name,
                                 in);
            epi_text(o, b);
            lm__plan_sbuf_printf(b, " -> %s  [%.0f cycles]\n", out, o->cost);
            break;
        case LM__PLAN_M_REPEAT:
            lm__plan_sbuf_printf(b, "x%lld (ops %lld..%d)\n", (long long)o->count, (long long)i + 1, o->body_end - 1);
            if (depth < 8) ends[depth++] = o->body_end;
            break;
        case LM__PLAN_M_CHECKPOINT:
            lm__plan_sbuf_printf(b, "%s (%s)\n",
                                 o->check >= 0 ? p->g->checks[o->check].name : p->g->values[-1 - o->check].name,
                                 o->check >= 0 ? "checkpoint" : "output");
            break;
        }
    }
}

lm_status lm_plan_describe(const lm_plan *p, char **out) {
    if (!p || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_describe: NULL argument");
    lm__plan_sbuf b = {0};
    lm__plan_sbuf_printf(&b, "mid program on %s (%lld tiles x %lld bytes):\n", p->m.name, (long long)p->m.tiles,
                         (long long)p->m.sram_bytes);
    describe_ops(p, &b);
    return lm__plan_sbuf_finish(&b, out);
}

static void summary_text(const lm_plan *p, const lm_plan_sim *s, lm__plan_sbuf *b) {
    const lm_plan_summary *m = &p->summary;
    if (m->lower_bound_cycles > 0)
        lm__plan_sbuf_printf(b, "predicted cycles   %.0f (%.2fx the compute lower bound %.0f; %.1f us at %.2f GHz)\n",
                             m->predicted_cycles, m->predicted_cycles / m->lower_bound_cycles, m->lower_bound_cycles,
                             m->predicted_cycles / p->m.clock_hz * 1e6, p->m.clock_hz / 1e9);
    else
        lm__plan_sbuf_printf(b, "predicted cycles   %.0f (no matmul: no compute lower bound; %.1f us at %.2f GHz)\n",
                             m->predicted_cycles, m->predicted_cycles / p->m.clock_hz * 1e6, p->m.clock_hz / 1e9);
    lm__plan_sbuf_printf(b, "matmul FLOPs       %.4g\n", m->matmul_flops);
    lm__plan_sbuf_printf(b, "SRAM peak          %lld bytes per tile (live lower bound %lld; worst tile %.2fx)\n",
                         (long long)m->sram_peak_bytes, (long long)m->sram_live_bound, m->sram_alloc_ratio);
    lm__plan_sbuf_printf(b,
                         "exchange           %lld bytes received in %lld phases; %lld kernel calls, %lld transfers\n",
                         (long long)m->exchange_bytes, (long long)m->exchange_steps, (long long)m->kernel_calls,
                         (long long)m->transfers);
    lm__plan_sbuf_printf(b, "planning           %.3f s, %lld candidates costed, %.1f MiB planner memory\n",
                         m->plan_seconds, (long long)m->candidates_costed, (double)m->planner_peak_bytes / 1048576.0);
    if (p->search_attempts > 1)
        lm__plan_sbuf_printf(b,
                             "search budget      %lld of %lld bytes per tile (search %d: the plans of the full budget "
                             "overflowed a tile at allocation)\n",
                             (long long)p->search_sram, (long long)p->m.sram_bytes, p->search_attempts);
    if (!s) return;
    lm_plan_sim_summary ss;
    lm_plan_sim_get_summary(s, &ss);
    lm__plan_sbuf_printf(b, "simulated cycles   %.0f (compute %.0f, exchange %.0f, sync %.0f); %lld bytes exchanged\n",
                         ss.cycles, ss.compute_cycles, ss.exchange_cycles, ss.sync_cycles,
                         (long long)ss.exchange_bytes);
    lm__plan_sbuf_printf(b,
                         "numerical check    %d/%d passed (worst NMSE %.3g, worst max|err|/max|ref| %.3g); "
                         "simulation %.2f s, reference %.2f s\n",
                         ss.checks - ss.checks_failed, ss.checks, ss.worst_nmse, ss.worst_rel_abs, ss.sim_seconds,
                         ss.ref_seconds);
}

/* The gap to the compute bound by category (lm__plan_gap_get), one line each. */
static lm_status gap_text(const lm_plan *p, lm__plan_sbuf *b) {
    lm__plan_gap g;
    LM_TRY(lm__plan_gap_get(p, &g));
    lm__plan_sbuf_printf(b, "where the cycles go (schedule of the low program, %.0f cycles, along its critical path):\n",
                         g.total);
    for (int i = 0; i < G_COUNT; i++)
        if (g.v[i] != 0 || i == G_BOUND)
            lm__plan_sbuf_printf(b, "  %-10s %10.0f  %5.1f%%  %s\n", g.key[i], g.v[i],
                                 g.total > 0 ? 100.0 * g.v[i] / g.total : 0.0, g.label[i]);
    return LM_OK;
}

lm_status lm_plan_report_text(const lm_plan *p, const lm_plan_sim *s, char **out) {
    if (!p || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_report_text: NULL argument");
    lm__plan_sbuf b = {0};
    describe_ops(p, &b);
    summary_text(p, s, &b);
    lm_status st = gap_text(p, &b);
    if (st != LM_OK) {
        lm__free(b.p);
        return st;
    }
    if (s) {
        for (int i = 0; i < lm_plan_sim_check_count(s); i++) {
            lm_plan_check_result r;
            lm_plan_sim_check_get(s, i, &r);
            lm__plan_sbuf_printf(&b, "  check %-20s iter %-3lld NMSE %.3g max-rel %.3g %s\n", r.name,
                                 (long long)r.iteration, r.nmse, r.rel_abs, r.pass ? "ok" : "FAIL");
        }
    }
    return lm__plan_sbuf_finish(&b, out);
}

static void json_str(lm__plan_sbuf *b, const char *s) {
    lm__plan_sbuf_printf(b, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            lm__plan_sbuf_printf(b, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            lm__plan_sbuf_printf(b, "\\u%04x", (unsigned)*s);
        else
            lm__plan_sbuf_printf(b, "%c", *s);
    }
    lm__plan_sbuf_printf(b, "\"");
}

lm_status lm_plan_report_json(const lm_plan *p, const lm_plan_sim *s, char **out) {
    if (!p || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_report_json: NULL argument");
    const lm_plan_summary *m = &p->summary;
    lm__plan_sbuf b = {0};
    lm__plan_sbuf_printf(&b, "{\"machine\":");
    json_str(&b, p->m.name);
    lm__plan_sbuf_printf(&b,
                         ",\"tiles\":%lld,\"predicted_cycles\":%.0f,\"lower_bound_cycles\":%.0f,\"matmul_flops\":%.6g,"
                         "\"sram_peak_bytes\":%lld,\"sram_live_bound\":%lld,\"sram_alloc_ratio\":%.4f,"
                         "\"exchange_bytes\":%lld,\"compute_steps\":%lld,\"exchange_steps\":%lld,\"kernel_calls\":%lld,"
                         "\"transfers\":%lld,\"plan_seconds\":%.4f,\"candidates_costed\":%lld,\"planner_bytes\":%lld",
                         (long long)p->m.tiles, m->predicted_cycles, m->lower_bound_cycles, m->matmul_flops,
                         (long long)m->sram_peak_bytes, (long long)m->sram_live_bound, m->sram_alloc_ratio,
                         (long long)m->exchange_bytes, (long long)m->compute_steps, (long long)m->exchange_steps,
                         (long long)m->kernel_calls, (long long)m->transfers, m->plan_seconds,
                         (long long)m->candidates_costed, (long long)m->planner_peak_bytes);
    lm__plan_sbuf_printf(&b, ",\"ops\":[");
    for (int64_t i = 0; i < p->mid.nops; i++) {
        const lm__plan_mop *o = &p->mid.ops[i];
        char l[200] = "";
        if (o->out >= 0) lm__plan_layout_format(&p->mid.vals[o->out].l, l, sizeof l);
        lm__plan_sbuf_printf(&b, "%s{\"kind\":\"%s\",\"name\":", i ? "," : "", lm__plan_mid_kind_name(o->kind));
        json_str(&b, o->gop >= 0   ? p->g->ops[o->gop].name
                     : o->out >= 0 ? p->g->values[p->mid.vals[o->out].value].name
                                   : "");
        lm__plan_sbuf_printf(&b, ",\"layout\":");
        json_str(&b, l);
        lm__plan_sbuf_printf(&b, ",\"grid\":[%lld,%lld,%lld,%lld],\"steps\":%lld,\"cycles\":%.0f}",
                             (long long)o->grid[0], (long long)o->grid[1], (long long)o->grid[2], (long long)o->grid[3],
                             (long long)(o->kind == LM__PLAN_M_FLASH ? o->grid[3] : o->steps), o->cost);
    }
    lm__plan_sbuf_printf(&b, "]");
    lm__plan_gap g;
    lm_status st = lm__plan_gap_get(p, &g);
    if (st != LM_OK) {
        lm__free(b.p);
        return st;
    }
    lm__plan_sbuf_printf(&b, ",\"gap\":{\"total_cycles\":%.0f", g.total);
    for (int i = 0; i < G_COUNT; i++) lm__plan_sbuf_printf(&b, ",\"%s\":%.0f", g.key[i], g.v[i]);
    lm__plan_sbuf_printf(&b, "}");
    if (s) {
        lm_plan_sim_summary ss;
        lm_plan_sim_get_summary(s, &ss);
        lm__plan_sbuf_printf(
            &b,
            ",\"simulation\":{\"cycles\":%.0f,\"compute_cycles\":%.0f,\"exchange_cycles\":%.0f,"
            "\"sync_cycles\":%.0f,\"exchange_bytes\":%lld,\"checks\":%d,\"checks_failed\":%d,"
            "\"worst_nmse\":%.6g,\"worst_rel_abs\":%.6g,\"sim_seconds\":%.3f,\"ref_seconds\":%.3f,\"results\":[",
            ss.cycles, ss.compute_cycles, ss.exchange_cycles, ss.sync_cycles, (long long)ss.exchange_bytes, ss.checks,
            ss.checks_failed, ss.worst_nmse, ss.worst_rel_abs, ss.sim_seconds, ss.ref_seconds);
        for (int i = 0; i < lm_plan_sim_check_count(s); i++) {
            lm_plan_check_result r;
            lm_plan_sim_check_get(s, i, &r);
            lm__plan_sbuf_printf(&b, "%s{\"name\":", i ? "," : "");
            json_str(&b, r.name);
            lm__plan_sbuf_printf(&b, ",\"iteration\":%lld,\"nmse\":%.6g,\"rel_abs\":%.6g,\"pass\":%s}",
                                 (long long)r.iteration, r.nmse, r.rel_abs, r.pass ? "true" : "false");
        }
        lm__plan_sbuf_printf(&b, "]}");
    }
    lm__plan_sbuf_printf(&b, "}");
    return lm__plan_sbuf_finish(&b, out);
}

lm_status lm_plan_timeline_svg(const lm_plan *p, const lm_plan_sim *s, char **out) {
    if (!p || !s || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_timeline_svg: NULL argument");
    int64_t n = lm__plan_sim_phases(s);
    double total = 0;
    for (int64_t i = 0; i < n; i++) {
        int kind;
        int32_t step;
        int64_t iter, bytes;
        double start, cycles, sync;
        lm__plan_sim_phase(s, i, &kind, &step, &iter, &start, &cycles, &sync, &bytes);
        total = fmax(total, start + cycles);
    }
    const double W = 1400, left = 90, rowh = 34;
    double scale = total > 0 ? (W - left - 20) / total : 1;
    lm__plan_sbuf b = {0};
    lm__plan_sbuf_printf(
        &b,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
        "font-size=\"11\">\n<text x=\"10\" y=\"18\" font-size=\"14\">%s on %s: %.0f simulated cycles "
        "(%.1f us)</text>\n",
        W, 40 + 3 * rowh + 40, p->g->nops ? p->g->ops[p->g->nops - 1].name : "plan", p->m.name, total,
        total / p->m.clock_hz * 1e6);
    static const char *const rows[3] = {"compute", "exchange", "sync"};
    static const char *const colors[3] = {"#4a7ebb", "#d9822b", "#999999"};
    for (int r = 0; r < 3; r++)
        lm__plan_sbuf_printf(&b, "<text x=\"10\" y=\"%.0f\">%s</text>\n", 40 + r * rowh + rowh * 0.6, rows[r]);
    for (int64_t i = 0; i < n; i++) {
        int kind;
        int32_t step;
        int64_t iter, bytes;
        double start, cycles, sync;
        lm__plan_sim_phase(s, i, &kind, &step, &iter, &start, &cycles, &sync, &bytes);
        const char *label = p->low.steps[step].label;
        double x = left + start * scale, w = fmax(0.5, (cycles - sync) * scale);
        if (kind == 1 && sync > 0) {
            lm__plan_sbuf_printf(&b, "<rect x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\"/>\n", x,
                                 40 + 2 * rowh + 4, fmax(0.5, sync * scale), rowh - 8, colors[2]);
            x += sync * scale;
        }
        lm__plan_sbuf_printf(
            &b,
            "<rect x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\"><title>%s (iteration "
            "%lld): %.0f cycles, %lld bytes</title></rect>\n",
            x, 40 + kind * rowh + 4, w, rowh - 8, colors[kind], label, (long long)iter, cycles, (long long)bytes);
    }
    lm__plan_sbuf_printf(&b, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", left,
                         40 + 3 * rowh + 5, W - 20, 40 + 3 * rowh + 5);
    for (int t = 0; t <= 10; t++)
        lm__plan_sbuf_printf(&b, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">%.0f</text>\n",
                             left + t * (W - left - 20) / 10, 40 + 3 * rowh + 20, total * t / 10);
    lm__plan_sbuf_printf(&b, "</svg>\n");
    return lm__plan_sbuf_finish(&b, out);
}
