/* tests/ops/backward_fd.h — float64 finite differences for the backward-operator and
 * autograd tests (header-only, static helpers).
 *
 * A test writes its forward in double precision as a scalar function of one flat
 * input array, L(x) = sum(forward(x) * w) for a fixed random upstream gradient w, so
 * dL/dx is exactly the vector-Jacobian product a backward operator computes. Central
 * differences with h = 1e-5 have truncation error O(h^2) ~ 1e-10 relative and rounding
 * error ~ 1e-16 / h = 1e-11: far below the f32 rounding (6e-8 relative) of the
 * operator's outputs, so the gates below are set by f32, not by the differences.
 */
#ifndef LOOM_TESTS_BACKWARD_FD_H
#define LOOM_TESTS_BACKWARD_FD_H

#include "harness.h"

#include <math.h>
#include <stdlib.h>

typedef double (*fd_loss_fn)(void *user);

/* g[i] = (L(x + h e_i) - L(x - h e_i)) / 2h for i < n; x is restored. f reads x
 * through user. */
static inline void fd_gradient(fd_loss_fn f, void *user, double *x, int64_t n, double *g) {
    const double h = 1e-5;
    for (int64_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + h;
        double up = f(user);
        x[i] = keep - h;
        double down = f(user);
        x[i] = keep;
        g[i] = (up - down) / (2 * h);
    }
}

/* A random contiguous tensor and its exact values as a new double array (free()). */
static inline lm_tensor *fd_random(lt_rng *r, lm_dtype dt, int ndim, const int64_t *shape, double scale, double **vals) {
    lm_tensor *t = lt_random_tensor(r, dt, ndim, shape, scale);
    *vals = lt_view_to_f64(lm_tensor_as_view(t));
    return t;
}

static inline double fd_max_abs(const double *v, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fabs(v[i]) > m ? fabs(v[i]) : m;
    return m;
}

/* Compares the gradient a backward operator wrote into view got against want
 * (finite differences): NMSE <= nmse and max-abs <= rel * max|want| + 1e-12. */
static inline int fd_check(const char *what, const lm_tensor_view *got, const double *want, double nmse, double rel) {
    int64_t n = lm_tensor_view_numel(got);
    double *g = lt_view_to_f64(got);
    int ok = lt_check_close(what, g, want, n, nmse, rel * fd_max_abs(want, n) + 1e-12);
    free(g);
    return ok;
}

/* The f32 scalar 1.0 (or any value) as a tensor, for dloss operands. */
static inline lm_tensor *fd_scalar(float value) {
    lm_tensor *t = NULL;
    if (lm_tensor_from_host(lm_device_cpu(), LM_F32, 0, NULL, &value, &t) != LM_OK) return NULL;
    return t;
}

#endif
