/* CUDA runtime services on cuda:0:
 *  - the caching allocator: a freed block is handed out again for a similar size
 *    without a new cudaMalloc (cache_hits grows, backend_allocs does not), current and
 *    peak bytes follow allocations (sizes rounded to 512 B / 2 MiB), reset_peak and
 *    empty_cache behave, and the CPU device answers LM_UNSUPPORTED;
 *  - staged host <-> device copies of 20 MiB + 7 bytes (several pinned chunks, an odd
 *    tail) round-trip exactly;
 *  - events: record, synchronize and a positive elapsed time around real work;
 *    wait_event orders a second context after the first;
 *  - graphs: a captured region (two kernels on a caller-owned buffer, and a copy) does
 *    nothing at capture time and exactly its work at every replay; the graph counts
 *    its 2 kernels (the copy is not one); capture on a CPU context
 *    is LM_UNSUPPORTED;
 *  - strided copies within the device (transposes, slices, permuted 4-d views, every
 *    element size) queued on the context's stream equal the host strided copy bit for
 *    bit, leave the destination's gaps untouched, and without a CUDA context a
 *    strided device copy is refused with LM_UNSUPPORTED; lm_tensor_contiguous of a
 *    transposed device view works;
 *  - capabilities (not host addressable, asynchronous, capturing, a name and the
 *    GPU's memory), the capturing flag around a capture, pinned host memory, and
 *    lm_ctx_copy: host -> device -> device -> host round trips from pinned and
 *    pageable memory, ordered after kernels already queued on the context, and the
 *    errors for a device the context cannot reach.
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

static lm_ctx *g_ctx;

static void test_allocator_reuses_blocks(void) {
    lm_device_memory_stats a, b, c;
    LT_CHECK_OK(lm_device_empty_cache(ct_gpu));
    LT_CHECK_OK(lm_device_memory_stats_get(ct_gpu, &a));
    void *p = NULL, *q = NULL;
    LT_CHECK_OK(lm_device_alloc(ct_gpu, 3 << 20, &p)); /* rounds to 4 MiB */
    LT_CHECK_OK(lm_device_memory_stats_get(ct_gpu, &b));
    LT_CHECK(b.current_bytes - a.current_bytes == 4 << 20);
    LT_CHECK(b.backend_allocs == a.backend_allocs + 1 && b.peak_bytes >= b.current_bytes);
    lm_device_free(ct_gpu, p);
    LT_CHECK_OK(lm_device_alloc(ct_gpu, (3 << 20) + 100, &q)); /* same rounded size: from the cache */
    LT_CHECK_OK(lm_device_memory_stats_get(ct_gpu, &c));
    LT_CHECK(c.backend_allocs == b.backend_allocs && c.cache_hits == b.cache_hits + 1);
    LT_CHECK(q == p && c.current_bytes == b.current_bytes && c.reserved_bytes == b.reserved_bytes);
    lm_device_free(ct_gpu, q);
    LT_CHECK_OK(lm_device_memory_stats_get(ct_gpu, &c));
    LT_CHECK(c.current_bytes == a.current_bytes && c.reserved_bytes == a.reserved_bytes + (4 << 20));
    LT_CHECK_OK(lm_device_memory_reset_peak(ct_gpu));
    LT_CHECK_OK(lm_device_memory_stats_get(ct_gpu, &c));
    LT_CHECK(c.peak_bytes == c.current_bytes);
    LT_CHECK_OK(lm_device_empty_cache(ct_gpu));
    LT_CHECK_OK(lm_device_memory_stats_get(ct_gpu, &c));
    LT_CHECK(c.reserved_bytes == a.reserved_bytes && c.backend_frees > a.backend_frees);
    void *small = NULL;
    LT_CHECK_OK(lm_device_alloc(ct_gpu, 100, &small)); /* 512-byte granule */
    LT_CHECK_OK(lm_device_memory_stats_get(ct_gpu, &b));
    LT_CHECK(b.current_bytes - c.current_bytes == 512);
    lm_device_free(ct_gpu, small);
    LT_CHECK_STATUS(lm_device_memory_stats_get(lm_device_cpu(), &c), LM_UNSUPPORTED);
}

static void test_staged_copies_round_trip(void) {
    size_t n = (20u << 20) + 7;
    unsigned char *src = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i * 131 + (i >> 13));
    void *d = NULL;
    LT_CHECK_OK(lm_device_alloc(ct_gpu, n, &d));
    LT_CHECK_OK(lm_device_copy(ct_gpu, d, lm_device_cpu(), src, n));
    memset(back, 0, n);
    LT_CHECK_OK(lm_device_copy(lm_device_cpu(), back, ct_gpu, d, n));
    LT_CHECK(memcmp(src, back, n) == 0);
    lm_device_free(ct_gpu, d);
    free(src);
    free(back);
}

/* x = x * 2 + x (as two kernels), n f32 elements. */
static void queue_work(lm_ctx *ctx, const lm_tensor_view *x) {
    LT_CHECK_OK(lm__cuda_scale(x, 2.0f, x, ct_stream(ctx)));
    LT_CHECK_OK(lm__cuda_add(x, x, x, ct_stream(ctx)));
}

static void test_events_time_and_order(void) {
    int64_t n = 1 << 22;
    lm_tensor *h = NULL;
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 1, &n, &h));
    for (int64_t i = 0; i < n; i++) ((float *)lm_tensor_data(h))[i] = 1.0f;
    lm_tensor *d = ct_upload(h);
    lm_event *e0 = NULL, *e1 = NULL;
    LT_CHECK_OK(lm_event_create(g_ctx, &e0));
    LT_CHECK_OK(lm_event_create(g_ctx, &e1));
    LT_CHECK_OK(lm_event_record(e0, g_ctx));
    for (int i = 0; i < 5; i++) queue_work(g_ctx, lm_tensor_as_view(d));
    LT_CHECK_OK(lm_event_record(e1, g_ctx));
    LT_CHECK_OK(lm_event_synchronize(e1));
    double ms = -1;
    LT_CHECK_OK(lm_event_elapsed_ms(e0, e1, &ms));
    LT_CHECK_MSG(ms > 0, "elapsed %g ms", ms); /* the second event follows the work; speed is not asserted */
    /* a second context waits for the first's event before reading */
    lm_ctx *other = NULL;
    LT_CHECK_OK(lm_ctx_create(ct_gpu, 1, &other));
    queue_work(g_ctx, lm_tensor_as_view(d));
    LT_CHECK_OK(lm_event_record(e1, g_ctx));
    LT_CHECK_OK(lm_ctx_wait_event(other, e1));
    LT_CHECK_OK(lm__cuda_scale(lm_tensor_as_view(d), 0.5f, lm_tensor_as_view(d), ct_stream(other)));
    LT_CHECK_OK(lm_ctx_synchronize(other));
    float v = 0;
    LT_CHECK_OK(lm_device_copy(lm_device_cpu(), &v, ct_gpu, lm_tensor_data(d), sizeof v));
    LT_CHECK_MSG(v == 2048.0f, "value after ordered work: %g (want 4^6 / 2 = 2048)", v);
    lm_ctx *cpu = NULL;
    lm_event *ce = NULL;
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &cpu));
    LT_CHECK_STATUS(lm_event_record(e0, cpu), LM_INVALID_ARGUMENT);
    LT_CHECK_OK(lm_event_create(cpu, &ce));
    LT_CHECK_OK(lm_event_record(ce, cpu));
    lm_event_destroy(ce);
    lm_ctx_destroy(cpu);
    lm_ctx_destroy(other);
    lm_event_destroy(e0);
    lm_event_destroy(e1);
    lm_tensor_destroy(d);
    lm_tensor_destroy(h);
}

static void test_graph_capture_and_replay(void) {
    int64_t n = 1000;
    lm_tensor *h = NULL;
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 1, &n, &h));
    for (int64_t i = 0; i < n; i++) ((float *)lm_tensor_data(h))[i] = (float)(i % 7) - 3.0f;
    lm_tensor *d = ct_upload(h), *d2 = ct_upload(h);
    lm_device_graph *g = NULL;
    LT_CHECK(lm_ctx_capturing(g_ctx) == 0);
    LT_CHECK_OK(lm_ctx_capture_begin(g_ctx));
    LT_CHECK(lm_ctx_capturing(g_ctx) == 1);
    queue_work(g_ctx, lm_tensor_as_view(d));
    /* a device copy in the region is a copy node, not a kernel */
    LT_CHECK_OK(lm_ctx_copy(g_ctx, ct_gpu, lm_tensor_data(d2), ct_gpu, lm_tensor_data(d), (size_t)n * sizeof(float)));
    LT_CHECK_OK(lm_ctx_capture_end(g_ctx, &g));
    LT_CHECK(lm_ctx_capturing(g_ctx) == 0);
    LT_CHECK_MSG(lm_device_graph_kernels(g) == 2, "kernels in the graph: %lld, expected 2 (scale, add)",
                 (long long)lm_device_graph_kernels(g));
    LT_CHECK(lm_device_graph_kernels(NULL) == 0);
    LT_CHECK_OK(lm_ctx_synchronize(g_ctx));
    float back[1000];
    LT_CHECK_OK(lm_device_copy(lm_device_cpu(), back, ct_gpu, lm_tensor_data(d), sizeof back));
    int untouched = 1;
    for (int i = 0; i < 1000; i++) untouched &= back[i] == (float)(i % 7) - 3.0f;
    LT_CHECK_MSG(untouched, "capture must not run the work");
    for (int rep = 0; rep < 3; rep++) LT_CHECK_OK(lm_device_graph_launch(g, g_ctx));
    LT_CHECK_OK(lm_ctx_synchronize(g_ctx));
    LT_CHECK_OK(lm_device_copy(lm_device_cpu(), back, ct_gpu, lm_tensor_data(d), sizeof back));
    int ok = 1;
    for (int i = 0; i < 1000; i++) ok &= back[i] == ((float)(i % 7) - 3.0f) * 64.0f; /* (x * 2 * 2)^3 replays = 64x */
    LT_CHECK_MSG(ok, "three replays give x * 64");
    lm_device_graph_destroy(g);
    lm_ctx *cpu = NULL;
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &cpu));
    LT_CHECK_STATUS(lm_ctx_capture_begin(cpu), LM_UNSUPPORTED);
    lm_ctx_destroy(cpu);
    lm_tensor_destroy(d);
    lm_tensor_destroy(d2);
    lm_tensor_destroy(h);
}

/* dst (a view of a poisoned parent, strides dperm) = src (a view with strides sperm)
 * on the device, compared byte for byte with the same copy on the host parents. */
static void check_strided_copy(lt_rng *r, lm_dtype dt, int nd, const int64_t *shape, const int *sperm,
                               const int *dperm) {
    int64_t ps[LM_MAX_DIMS];
    for (int i = 0; i < nd; i++) ps[i] = shape[sperm[i]] + (i == nd - 1 ? 1 : 0); /* padded parent */
    lm_tensor *hs = lt_random_tensor(r, dt, nd, ps, 1.0), *hd = NULL;
    for (int i = 0; i < nd; i++) ps[i] = shape[dperm[i]] + (i == 0 ? 2 : 0);
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), dt, nd, ps, &hd));
    memset(lm_tensor_data(hd), 0x5A, (size_t)lm_tensor_numel(hd) * lm_dtype_size(dt));
    lm_tensor *ds = ct_upload(hs), *dd = ct_upload(hd);
    /* views: slice the padding off, then permute back to `shape` order */
    lm_tensor_view sv = *lm_tensor_as_view(hs), dv = *lm_tensor_as_view(hd), t;
    int64_t sst[LM_MAX_DIMS], dst_[LM_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        sst[sperm[i]] = sv.stride[i];
        dst_[dperm[i]] = dv.stride[i];
    }
    LT_CHECK_OK(lm_tensor_view_init(&t, sv.data, dt, sv.device, nd, shape, sst));
    sv = t;
    LT_CHECK_OK(lm_tensor_view_init(&t, dv.data, dt, dv.device, nd, shape, dst_));
    dv = t;
    lm_tensor_view gs = ct_mirror(hs, &sv, ds), gd = ct_mirror(hd, &dv, dd);
    LT_CHECK_OK(lm_tensor_view_copy(NULL, &dv, &sv));
    LT_CHECK_OK(lm_tensor_view_copy(g_ctx, &gd, &gs));
    LT_CHECK_OK(lm_ctx_synchronize(g_ctx));
    size_t nb = (size_t)lm_tensor_numel(hd) * lm_dtype_size(dt);
    unsigned char *back = malloc(nb);
    LT_CHECK_OK(lm_device_copy(lm_device_cpu(), back, ct_gpu, lm_tensor_data(dd), nb));
    LT_CHECK_MSG(memcmp(back, lm_tensor_data(hd), nb) == 0, "%s %d-d strided device copy differs from the host copy",
                 lm_dtype_name(dt), nd);
    LT_CHECK_STATUS(lm_tensor_view_copy(NULL, &gd, &gs), LM_UNSUPPORTED);
    free(back);
    lm_tensor_destroy(hs);
    lm_tensor_destroy(hd);
    lm_tensor_destroy(ds);
    lm_tensor_destroy(dd);
}

static void test_strided_device_copies(void) {
    lt_rng r = lt_rng_seed(41);
    static const lm_dtype dts[] = {LM_F32, LM_BF16, LM_I64, LM_U8};
    int64_t s2[2] = {37, 53}, s4[4] = {3, 17, 5, 12};
    int id2[2] = {0, 1}, tr2[2] = {1, 0}, id4[4] = {0, 1, 2, 3}, p4[4] = {0, 2, 1, 3}, q4[4] = {3, 1, 0, 2};
    for (int k = 0; k < 4; k++) {
        check_strided_copy(&r, dts[k], 2, s2, tr2, id2); /* transpose into a padded row-major */
        check_strided_copy(&r, dts[k], 2, s2, id2, tr2);
        check_strided_copy(&r, dts[k], 4, s4, p4, id4); /* [B, T, H, D] <-> [B, H, T, D] */
        check_strided_copy(&r, dts[k], 4, s4, q4, p4);
    }
    /* contiguous() of a transposed device view */
    int64_t shape[2] = {64, 48};
    lm_tensor *h = lt_random_tensor(&r, LM_F32, 2, shape, 1.0), *d = ct_upload(h), *c = NULL, *hc = NULL;
    lm_tensor *dt_ = NULL, *ht = NULL;
    lm_tensor_view tv;
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(d), 0, 1, &tv));
    LT_CHECK_OK(lm_tensor_from_view(d, &tv, &dt_));
    LT_CHECK_OK(lm_tensor_contiguous(g_ctx, dt_, &c));
    LT_CHECK(lm_tensor_view_is_contiguous(lm_tensor_as_view(c)) && lm_tensor_dim(c, 0) == 48);
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(h), 0, 1, &tv));
    LT_CHECK_OK(lm_tensor_from_view(h, &tv, &ht));
    LT_CHECK_OK(lm_tensor_contiguous(NULL, ht, &hc));
    LT_CHECK_OK(lm_ctx_synchronize(g_ctx));
    float *back = malloc(64 * 48 * sizeof *back);
    LT_CHECK_OK(lm_tensor_view_read(g_ctx, lm_tensor_as_view(c), back));
    LT_CHECK(memcmp(back, lm_tensor_data(hc), 64 * 48 * sizeof *back) == 0);
    free(back);
    lm_tensor_destroy(h), lm_tensor_destroy(d), lm_tensor_destroy(c), lm_tensor_destroy(hc);
    lm_tensor_destroy(dt_), lm_tensor_destroy(ht);
}

static void test_caps(void) {
    lm_device_caps caps;
    memset(&caps, 0x5A, sizeof caps);
    LT_CHECK_OK(lm_device_caps_get(ct_gpu, &caps));
    LT_CHECK(caps.host_addressable == 0 && caps.async == 1 && caps.graph_capture == 1 && caps.fast_16bit == 1);
    LT_CHECK_MSG(caps.memory_bytes >= ((int64_t)1 << 30), "GPU memory_bytes %lld", (long long)caps.memory_bytes);
    LT_CHECK(memchr(caps.name, '\0', sizeof caps.name) != NULL && caps.name[0] != '\0');
    LT_CHECK_STATUS(lm_device_caps_get(lm_device_cuda(lm_cuda_device_count()), &caps), LM_DEVICE_ERROR);
    LT_CHECK_STATUS(lm_device_caps_get(ct_gpu, NULL), LM_INVALID_ARGUMENT);
}

/* host -> device -> device -> host through lm_ctx_copy, from host buffers src and back
 * (pinned or pageable), n bytes. */
static void ctx_round_trip(unsigned char *src, unsigned char *back, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i * 29 + (i >> 11));
    memset(back, 0, n);
    void *d1 = NULL, *d2 = NULL;
    LT_CHECK_OK(lm_device_alloc(ct_gpu, n, &d1));
    LT_CHECK_OK(lm_device_alloc(ct_gpu, n, &d2));
    LT_CHECK_OK(lm_ctx_copy(g_ctx, ct_gpu, d1, lm_device_cpu(), src, n));
    LT_CHECK_OK(lm_ctx_copy(g_ctx, ct_gpu, d2, ct_gpu, d1, n));
    LT_CHECK_OK(lm_ctx_copy(g_ctx, lm_device_cpu(), back, ct_gpu, d2, n));
    LT_CHECK_OK(lm_ctx_synchronize(g_ctx));
    LT_CHECK_MSG(memcmp(src, back, n) == 0, "%s round trip of %zu bytes", what, n);
    lm_device_free(ct_gpu, d1);
    lm_device_free(ct_gpu, d2);
}

static void test_host_alloc_and_ctx_copy(void) {
    const size_t n = (4u << 20) + 3;
    unsigned char *ph = NULL, *pb = NULL;
    LT_CHECK_OK(lm_host_alloc(ct_gpu, n, (void **)&ph));
    LT_CHECK_OK(lm_host_alloc(ct_gpu, n, (void **)&pb));
    if (ph && pb) ctx_round_trip(ph, pb, n, "pinned");
    unsigned char *src = malloc(n), *back = malloc(n);
    ctx_round_trip(src, back, n, "pageable");
    /* host to host on a CUDA context is queued too */
    LT_CHECK_OK(lm_ctx_copy(g_ctx, lm_device_cpu(), back, lm_device_cpu(), src, n));
    LT_CHECK_OK(lm_ctx_synchronize(g_ctx));
    LT_CHECK(memcmp(src, back, n) == 0);
    free(src);
    free(back);

    /* a copy queued after kernels sees their result: 1 * 2 * 2 = 4 for every element */
    int64_t m = 1 << 20;
    lm_tensor *h = NULL;
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 1, &m, &h));
    for (int64_t i = 0; i < m; i++) ((float *)lm_tensor_data(h))[i] = 1.0f;
    lm_tensor *d = ct_upload(h);
    queue_work(g_ctx, lm_tensor_as_view(d));
    float *out = (float *)pb;
    if (out) {
        LT_CHECK_OK(lm_ctx_copy(g_ctx, lm_device_cpu(), out, ct_gpu, lm_tensor_data(d), (size_t)m * sizeof(float)));
        LT_CHECK_OK(lm_ctx_synchronize(g_ctx));
        int ok = 1;
        for (int64_t i = 0; i < m; i++) ok &= out[i] == 4.0f;
        LT_CHECK_MSG(ok, "lm_ctx_copy must run after the work queued before it");
    }

    /* errors: NULL arguments, memory the context cannot reach */
    void *z = (void *)&z;
    LT_CHECK_OK(lm_host_alloc(ct_gpu, 0, &z));
    lm_host_free(ct_gpu, z);
    lm_host_free(ct_gpu, NULL);
    LT_CHECK_STATUS(lm_host_alloc(ct_gpu, 8, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_ctx_copy(g_ctx, ct_gpu, NULL, lm_device_cpu(), ph, 8), LM_INVALID_ARGUMENT);
    lm_ctx *cpu = NULL;
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &cpu));
    if (ph) LT_CHECK_STATUS(lm_ctx_copy(cpu, lm_device_cpu(), ph, ct_gpu, lm_tensor_data(d), 8), LM_INVALID_ARGUMENT);
    lm_ctx_destroy(cpu);
    int ndev = lm_cuda_device_count();
    lm_status want = ndev > 1 ? LM_INVALID_ARGUMENT : LM_DEVICE_ERROR; /* another GPU, or none */
    if (ph) LT_CHECK_STATUS(lm_ctx_copy(g_ctx, lm_device_cuda(1), lm_tensor_data(d), lm_device_cpu(), ph, 8), want);
    lm_tensor_destroy(d);
    lm_tensor_destroy(h);
    lm_host_free(ct_gpu, ph);
    lm_host_free(ct_gpu, pb);
}

int main(void) {
    g_ctx = ct_start();
    LT_RUN(test_caps);
    LT_RUN(test_host_alloc_and_ctx_copy);
    LT_RUN(test_strided_device_copies);
    LT_RUN(test_allocator_reuses_blocks);
    LT_RUN(test_staged_copies_round_trip);
    LT_RUN(test_events_time_and_order);
    LT_RUN(test_graph_capture_and_replay);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
