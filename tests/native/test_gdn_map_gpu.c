// ggml-level test of ggml_gated_delta_net with snapshot maps on a GPU backend (CUDA: patch 0010,
// Vulkan: patch 0020).
//
// The op runs on the first GPU device of the ggml-backend registry and on the CPU backend, on the
// same random inputs, for every plane layout llama.cpp makes (llama_rs_slot_map in patch 0002's
// src/llama-memory-recurrent.cpp: 2..9 and 28 planes, every lead) at several token counts, with the
// scalar and the KDA gate, for every head size the CUDA and Vulkan kernels have, plus hand-made maps. The GPU
// device must accept the op (supports_op), and its attention output and every written slot must
// match the CPU op's (max |diff| <= 1e-4 of the largest value); slots the map skips must keep the
// sentinel they held before; slots of the input state must hold it exactly. The op without a map
// (the default layouts) is compared too.
//
// Exit status: 0 pass, 1 fail, 77 no GPU device (skip). `--self-check` compares the CPU backend
// with itself (1 thread and several) instead, so the harness can run on a machine without a GPU;
// `--quick` keeps S_v = 16 only (the same maps, a fraction of the CPU time).
//
// build: cc -O2 -std=c11 test_gdn_map_gpu.c -I<llama.cpp>/ggml/include -L<build>/bin
//           -lggml -lggml-base -lm -Wl,-rpath,<build>/bin
#define _POSIX_C_SOURCE 200809L // sysconf

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define H_K 2
#define H_V 4
#define N_SEQS 2
#define T_MAX 28
#define MAX_SLOTS GGML_GDN_MAX_SNAPSHOT_SLOTS
#define SENTINEL 12345.0f
#define REL_TOL 1e-4
#define SKIP_EXIT 77

static const int HEAD_SIZES[] = { 16, 32, 64, 128 }; // the S_v cases of gated_delta_net.cu
static const int PLANE_COUNTS[] = { 2, 3, 4, 5, 6, 7, 8, 9, MAX_SLOTS };

static float frand(unsigned * s) { *s = *s * 1664525u + 1013904223u; return ((*s >> 8) / 16777216.0f) * 2.0f - 1.0f; }

// T_MAX tokens of random inputs for one head size and gate kind; a run with T tokens uses the first T
typedef struct {
    int S, kda;
    float * q; float * k; float * v; float * g; float * b; float * s0;
} inputs;

static size_t n_q(const inputs * in)  { return (size_t) in->S * H_K * T_MAX * N_SEQS; }
static size_t n_v(const inputs * in)  { return (size_t) in->S * H_V * T_MAX * N_SEQS; }
static size_t n_g(const inputs * in)  { return (size_t) (in->kda ? in->S : 1) * H_V * T_MAX * N_SEQS; }
static size_t n_b(void)               { return (size_t) H_V * T_MAX * N_SEQS; }
static size_t n_s(const inputs * in)  { return (size_t) in->S * in->S * H_V * N_SEQS; }

static float * fill(size_t n, float lo, float span, int absval, unsigned * seed) {
    float * p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; ++i) { const float r = frand(seed); p[i] = lo + span * (absval ? fabsf(r) : r); }
    return p;
}

// q and k scaled by 1/sqrt(S) keep the state bounded for every head size (the models normalise them)
static void make_inputs(inputs * in, int S, int kda, unsigned * seed) {
    const float qk = 1.0f / sqrtf((float) S);
    in->S = S; in->kda = kda;
    in->q  = fill(n_q(in), 0.0f, qk, 0, seed);
    in->k  = fill(n_q(in), 0.0f, qk, 0, seed);
    in->v  = fill(n_v(in), 0.0f, 1.0f, 0, seed);
    in->g  = fill(n_g(in), -0.1f, -0.4f, 1, seed);
    in->b  = fill(n_b(), 0.5f, 0.5f, 1, seed);
    in->s0 = fill(n_s(in), 0.0f, 0.2f, 0, seed);
}

static void free_inputs(inputs * in) { free(in->q); free(in->k); free(in->v); free(in->g); free(in->b); free(in->s0); }

// copy tokens [0, T) of a [w, T_MAX, N_SEQS] input into a [w, T, N_SEQS] tensor
static void set_tokens(struct ggml_tensor * t, const float * src, size_t w, int T) {
    for (int sq = 0; sq < N_SEQS; ++sq) {
        ggml_backend_tensor_set(t, src + (size_t) sq * T_MAX * w, (size_t) sq * T * w * sizeof(float), (size_t) T * w * sizeof(float));
    }
}

typedef struct {
    ggml_backend_dev_t dev;
    ggml_backend_t be;
} device;

// one op run: K slots, an optional map (NULL: the default layout); the output (attention, then K
// slots) is returned in a malloc'd array of *n floats, every slot pre-filled with SENTINEL.
// *supported: what the device's supports_op said about the op.
static float * run_op(const device * d, const inputs * in, int T, int K, const int32_t * map, size_t * n, int * supported) {
    const int S = in->S, gn = in->kda ? S : 1;
    struct ggml_init_params ip = { ggml_tensor_overhead() * 16 + ggml_graph_overhead(), NULL, true };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, S, H_K, T, N_SEQS);
    struct ggml_tensor * k = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, S, H_K, T, N_SEQS);
    struct ggml_tensor * v = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, S, H_V, T, N_SEQS);
    struct ggml_tensor * g = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, gn, H_V, T, N_SEQS);
    struct ggml_tensor * b = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, H_V, T, N_SEQS);
    struct ggml_tensor * s = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, S, S, H_V, N_SEQS);
    struct ggml_tensor * out = ggml_gated_delta_net(ctx, q, k, v, g, b, s, K);
    if (map) {
        ggml_gated_delta_net_set_snapshot_map(out, map, K);
    }
    *supported = ggml_backend_dev_supports_op(d->dev, out);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, d->be);
    if (!buf) { fprintf(stderr, "buffer allocation failed\n"); exit(1); }

    set_tokens(q, in->q, (size_t) S * H_K, T);
    set_tokens(k, in->k, (size_t) S * H_K, T);
    set_tokens(v, in->v, (size_t) S * H_V, T);
    set_tokens(g, in->g, (size_t) gn * H_V, T);
    set_tokens(b, in->b, (size_t) H_V, T);
    ggml_backend_tensor_set(s, in->s0, 0, ggml_nbytes(s));
    *n = (size_t) ggml_nelements(out);
    float * host = malloc(*n * sizeof(float));
    for (size_t i = 0; i < *n; ++i) host[i] = SENTINEL;
    ggml_backend_tensor_set(out, host, 0, ggml_nbytes(out));

    if (ggml_backend_graph_compute(d->be, gf) != GGML_STATUS_SUCCESS) { fprintf(stderr, "compute failed\n"); exit(1); }
    ggml_backend_tensor_get(out, host, 0, ggml_nbytes(out));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return host;
}

// llama_rs_slot_map (patch 0002, src/llama-memory-recurrent.cpp), reproduced: plane j keeps the state
// after token slot_tok[j] (-1: the input state), GGML_GDN_SNAPSHOT_SKIP: not written
static void layout_map(int n_planes, int lead, int n, int32_t * m) {
    for (int j = 0; j < n_planes; ++j) m[j] = GGML_GDN_SNAPSHOT_SKIP;
    if (lead < 0) { for (int j = 0; j < n_planes && j < n; ++j) m[j] = n - 1 - j; return; }
    int kept[T_MAX + 2] = {0};
#define ASSIGN(j, t) do { int jj = (j), tt = (t); if (jj < n_planes && tt >= -1 && tt < n && !kept[tt + 1]) { kept[tt + 1] = 1; m[jj] = tt; } } while (0)
    ASSIGN(0, n - 1);  // newest
    ASSIGN(1, -1);     // input
    for (int i = 0; i < lead; ++i) ASSIGN(2 + i, i);                               // after 1 .. lead tokens
    for (int j = 2 + lead, t = n - 2; j < n_planes; ++j, --t) ASSIGN(j, t);        // after n-1, n-2, ...
#undef ASSIGN
}

static int n_fail = 0, n_runs = 0, n_slots_checked = 0, n_skips_checked = 0;
static double max_rel = 0.0;

static void fail(const char * what, const inputs * in, int T, int K, const int32_t * map, double err) {
    if (++n_fail > 20) return; // the count says the rest
    fprintf(stderr, "FAIL %s (S_v=%d kda=%d T=%d K=%d err=%g map=", what, in->S, in->kda, T, K, err);
    if (!map) { fprintf(stderr, "none)\n"); return; }
    for (int j = 0; j < K; ++j) fprintf(stderr, "%d%s", map[j], j + 1 < K ? "," : ")\n");
}

// max |a - b| relative to max(1, max |b|); NaN counts as infinite
static double rel_err(const float * a, const float * b, size_t n) {
    double d = 0.0, m = 1.0;
    for (size_t i = 0; i < n; ++i) {
        const double e = fabs((double) a[i] - b[i]);
        if (!(e <= d)) d = isnan(e) ? INFINITY : e;
        if (fabs((double) b[i]) > m) m = fabs((double) b[i]);
    }
    return d / m;
}

static int all_sentinel(const float * p, size_t n) {
    for (size_t i = 0; i < n; ++i) if (p[i] != SENTINEL) return 0;
    return 1;
}

// the token slot j keeps: the map's entry, or the default layout's
static int slot_token(const int32_t * map, int j, int T) {
    if (map) return map[j];
    return T - 1 - j >= 0 ? T - 1 - j : GGML_GDN_SNAPSHOT_SKIP;
}

static void compare_outputs(const float * od, const float * orf, const inputs * in, int T, int K, const int32_t * map) {
    const size_t attn = (size_t) in->S * H_V * T * N_SEQS, D = n_s(in);
    double e = rel_err(od, orf, attn);
    max_rel = fmax(max_rel, e);
    if (!(e <= REL_TOL)) fail("attention output differs from the CPU", in, T, K, map, e);
    for (int j = 0; j < K; ++j) {
        const float * sd = od + attn + (size_t) j * D, * sr = orf + attn + (size_t) j * D;
        const int tok = slot_token(map, j, T);
        if (tok >= 0 && tok < T) {
            e = rel_err(sd, sr, D);
            max_rel = fmax(max_rel, e);
            ++n_slots_checked;
            if (!(e <= REL_TOL)) fail("slot differs from the CPU", in, T, K, map, e);
        } else if (tok == -1) {
            ++n_slots_checked;
            if (memcmp(sd, in->s0, D * sizeof(float)) != 0) fail("input slot != the input state", in, T, K, map, rel_err(sd, in->s0, D));
            if (memcmp(sr, in->s0, D * sizeof(float)) != 0) fail("CPU input slot != the input state", in, T, K, map, 0.0);
        } else {
            ++n_skips_checked;
            if (!all_sentinel(sd, D)) fail("skipped slot was written", in, T, K, map, 0.0);
            if (!all_sentinel(sr, D)) fail("CPU skipped slot was written", in, T, K, map, 0.0);
        }
    }
}

static void run_case(const device * dut, const device * ref, const inputs * in, int T, int K, const int32_t * map) {
    size_t n_d, n_r; int sup_d, sup_r;
    float * od = run_op(dut, in, T, K, map, &n_d, &sup_d);
    float * orf = run_op(ref, in, T, K, map, &n_r, &sup_r);
    ++n_runs;
    if (!sup_d) fail("the device refuses the op (supports_op)", in, T, K, map, 0.0);
    if (!sup_r) fail("the CPU refuses the op (supports_op)", in, T, K, map, 0.0);
    if (n_d != n_r || n_d != (size_t) in->S * H_V * T * N_SEQS + (size_t) K * n_s(in)) {
        fail("output sizes differ", in, T, K, map, 0.0);
    } else {
        compare_outputs(od, orf, in, T, K, map);
    }
    free(od); free(orf);
}

// token counts for a layout: 1, lead + 1, the plane count, 8, 16 (once each, within T_MAX)
static int token_counts(int planes, int lead, int * out) {
    const int cand[5] = { 1, lead + 1, planes, 8, 16 };
    int n = 0;
    for (int i = 0; i < 5; ++i) {
        int seen = cand[i] < 1 || cand[i] > T_MAX;
        for (int j = 0; j < n; ++j) seen |= out[j] == cand[i];
        if (!seen) out[n++] = cand[i];
    }
    return n;
}

static void layout_cases(const device * dut, const device * ref, const inputs * in) {
    for (size_t pi = 0; pi < sizeof(PLANE_COUNTS) / sizeof(PLANE_COUNTS[0]); ++pi) {
        const int P = PLANE_COUNTS[pi];
        for (int lead = -1; lead <= P - 2; ++lead) {
            int Ts[5]; const int nT = token_counts(P, lead, Ts);
            for (int ti = 0; ti < nT; ++ti) {
                int32_t m[MAX_SLOTS];
                layout_map(P, lead, Ts[ti], m);
                run_case(dut, ref, in, Ts[ti], P, m);
                if (lead == -1) run_case(dut, ref, in, Ts[ti], P, NULL); // the same layout without a map
            }
        }
    }
}

static void hand_made_cases(const device * dut, const device * ref, const inputs * in) {
    const int Ts[3] = { 1, 5, 16 };
    for (int ti = 0; ti < 3; ++ti) {
        const int T = Ts[ti], SK = GGML_GDN_SNAPSHOT_SKIP;
        { int32_t m[4] = { T - 1, SK, 0, -1 }; run_case(dut, ref, in, T, 4, m); }          // a skip in the middle
        { int32_t m[1] = { -1 }; run_case(dut, ref, in, T, 1, m); }                        // the input only
        { int32_t m[3] = { -1, -1, -1 }; run_case(dut, ref, in, T, 3, m); }                // the input, repeated
        { int32_t m[3] = { T - 1, T + 3, -1 }; run_case(dut, ref, in, T, 3, m); }          // a token beyond n_tokens
        { int32_t m[3] = { SK, T / 2, SK }; run_case(dut, ref, in, T, 3, m); }             // one slot written
        { int32_t m[MAX_SLOTS]; for (int j = 0; j < MAX_SLOTS; ++j) m[j] = (j % (T + 2)) - 1; // repeats, all slots
          run_case(dut, ref, in, T, MAX_SLOTS, m); }
        run_case(dut, ref, in, T, 1, NULL);                                                 // no map, final state only
    }
}

static ggml_backend_t init_cpu(int n_threads) {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_t be = dev ? ggml_backend_dev_init(dev, NULL) : NULL;
    if (!be) { fprintf(stderr, "no CPU backend\n"); exit(1); }
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_set_n_threads_t set = (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
    if (set) set(be, n_threads);
    return be;
}

// the first GPU device of the registry (no CUDA headers: whatever GPU backend the build has)
static ggml_backend_dev_t first_gpu(void) {
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_GPU) return dev;
    }
    return NULL;
}

// the CPU reference is most of the run time: as many threads as cores, up to 16
static int cpu_threads(void) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 2 ? 2 : n > 16 ? 16 : (int) n;
}

static int has_arg(int argc, char ** argv, const char * flag) {
    for (int i = 1; i < argc; ++i) if (strcmp(argv[i], flag) == 0) return 1;
    return 0;
}

int main(int argc, char ** argv) {
    const int self_check = has_arg(argc, argv, "--self-check");
    const size_t n_heads = has_arg(argc, argv, "--quick") ? 1 : sizeof(HEAD_SIZES) / sizeof(HEAD_SIZES[0]);
    device ref = { ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU), init_cpu(cpu_threads()) };
    device dut;
    if (self_check) {
        dut.dev = ref.dev; dut.be = init_cpu(1);
    } else {
        dut.dev = first_gpu();
        if (!dut.dev) { printf("no GPU device in the ggml-backend registry: skipped\n"); return SKIP_EXIT; }
        dut.be = ggml_backend_dev_init(dut.dev, NULL);
        if (!dut.be) { fprintf(stderr, "cannot start %s\n", ggml_backend_dev_name(dut.dev)); return 1; }
    }
    printf("device under test: %s (%s), reference: %s\n", ggml_backend_dev_name(dut.dev),
           ggml_backend_dev_description(dut.dev), ggml_backend_dev_name(ref.dev));

    unsigned seed = 1234;
    for (size_t si = 0; si < n_heads; ++si) {
        for (int kda = 0; kda <= 1; ++kda) {
            inputs in;
            make_inputs(&in, HEAD_SIZES[si], kda, &seed);
            layout_cases(&dut, &ref, &in);
            hand_made_cases(&dut, &ref, &in);
            free_inputs(&in);
        }
    }
    ggml_backend_free(dut.be);
    ggml_backend_free(ref.be);

    printf("gdn map on %s: %d op runs, %d slots compared, %d skipped slots checked, %d failed, max rel |diff| = %g\n",
           self_check ? "cpu (self-check)" : "gpu", n_runs, n_slots_checked, n_skips_checked, n_fail, max_rel);
    return n_fail == 0 ? 0 : 1;
}
