// ggml-level test of ggml_gated_delta_net's snapshot map (patch 0002).
//
// For random inputs, the batched op with a slot -> token map must leave in every slot exactly the
// state after its token (the input state for -1), computed by running the op one token at a time,
// must leave skipped slots untouched, must give the same attention output, and must not depend on
// the thread count. The op without a map must keep the upstream layout (slot s = s tokens back)
// and be bit-identical to the same layout given as an explicit map.
//
// build: cc -O2 -std=c11 test_gdn_snapshot_map.c -I<llama.cpp>/ggml/include -L<build>/bin
//           -lggml -lggml-base -lggml-cpu -lm -Wl,-rpath,<build>/bin
#include "ggml.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_V 16
#define H_K 2
#define H_V 4
#define N_SEQS 2
#define T_MAX 9
#define SENTINEL 12345.0f

static float frand(unsigned * s) { *s = *s * 1664525u + 1013904223u; return ((*s >> 8) / 16777216.0f) * 2.0f - 1.0f; }

typedef struct {
    int T, kda;
    float q[N_SEQS][T_MAX][H_K][S_V], k[N_SEQS][T_MAX][H_K][S_V], v[N_SEQS][T_MAX][H_V][S_V];
    float g[N_SEQS][T_MAX][H_V][S_V]; // scalar gate uses [..][0]
    float beta[N_SEQS][T_MAX][H_V];
    float s0[N_SEQS][H_V][S_V * S_V];
} inputs;

static size_t ctx_mem(void) { return (size_t) 64 * 1024 * 1024; }

// run the op over tokens [t0, t0 + nt) starting from state `s_in`; returns the output tensor data
// (copied into out, which must hold the whole output), with an optional map
static int run_op(const inputs * in, int t0, int nt, const float * s_in, int K, const int32_t * map,
                  int n_threads, float * out, size_t out_cap, int prefill_sentinel) {
    struct ggml_init_params ip = { ctx_mem(), NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    const int gn = in->kda ? S_V : 1;
    struct ggml_tensor * q  = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, S_V, H_K, nt, N_SEQS);
    struct ggml_tensor * k  = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, S_V, H_K, nt, N_SEQS);
    struct ggml_tensor * v  = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, S_V, H_V, nt, N_SEQS);
    struct ggml_tensor * g  = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, gn,  H_V, nt, N_SEQS);
    struct ggml_tensor * b  = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1,   H_V, nt, N_SEQS);
    struct ggml_tensor * s  = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, S_V, S_V, H_V, N_SEQS);
    for (int sq = 0; sq < N_SEQS; ++sq) {
        for (int t = 0; t < nt; ++t) {
            memcpy((float *) q->data + ((size_t) sq * nt + t) * H_K * S_V, in->q[sq][t0 + t], sizeof(float) * H_K * S_V);
            memcpy((float *) k->data + ((size_t) sq * nt + t) * H_K * S_V, in->k[sq][t0 + t], sizeof(float) * H_K * S_V);
            memcpy((float *) v->data + ((size_t) sq * nt + t) * H_V * S_V, in->v[sq][t0 + t], sizeof(float) * H_V * S_V);
            for (int h = 0; h < H_V; ++h) {
                memcpy((float *) g->data + (((size_t) sq * nt + t) * H_V + h) * gn, in->g[sq][t0 + t][h], sizeof(float) * gn);
                ((float *) b->data)[((size_t) sq * nt + t) * H_V + h] = in->beta[sq][t0 + t][h];
            }
        }
    }
    memcpy(s->data, s_in, sizeof(float) * S_V * S_V * H_V * N_SEQS);

    struct ggml_tensor * out_t = ggml_gated_delta_net(ctx, q, k, v, g, b, s, K);
    if (map) {
        ggml_gated_delta_net_set_snapshot_map(out_t, map, K);
    }
    if (prefill_sentinel) {
        float * d = (float *) out_t->data;
        for (int64_t i = 0; i < ggml_nelements(out_t); ++i) d[i] = SENTINEL;
    }
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out_t);
    if (ggml_graph_compute_with_ctx(ctx, gf, n_threads) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "compute failed\n");
        exit(1);
    }
    const size_t n = (size_t) ggml_nelements(out_t);
    if (n > out_cap) { fprintf(stderr, "out_cap\n"); exit(1); }
    memcpy(out, out_t->data, n * sizeof(float));
    ggml_free(ctx);
    return (int) n;
}

// the llama_rs_slot_map layout (src/llama-memory-recurrent.cpp), re-implemented for the test
static void layout_map(int n_planes, int lead, int n, int32_t * m) {
    for (int j = 0; j < n_planes; ++j) m[j] = GGML_GDN_SNAPSHOT_SKIP;
    if (lead < 0) { for (int j = 0; j < n_planes && j < n; ++j) m[j] = n - 1 - j; return; }
    int kept[T_MAX + 2] = {0};
#define ASSIGN(j, t) do { int jj = (j), tt = (t); if (jj < n_planes && tt >= -1 && tt < n && !kept[tt + 1]) { kept[tt + 1] = 1; m[jj] = tt; } } while (0)
    ASSIGN(0, n - 1);
    ASSIGN(1, -1);
    for (int i = 0; i < lead; ++i) ASSIGN(2 + i, i);
    for (int j = 2 + lead, t = n - 2; j < n_planes; ++j, --t) ASSIGN(j, t);
#undef ASSIGN
}

static int n_fail = 0, n_checks = 0;
static double max_diff_all = 0.0;

static double cmp(const float * a, const float * b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; ++i) { double d = fabs((double) a[i] - b[i]); if (!(d <= m)) m = isnan(d) ? INFINITY : d; }
    return m;
}

static void check(int cond, const char * what, int T, int K, const int32_t * map, int kda, int thr) {
    ++n_checks;
    if (!cond) {
        ++n_fail;
        fprintf(stderr, "FAIL %s (T=%d K=%d kda=%d threads=%d map=", what, T, K, kda, thr);
        if (map) for (int j = 0; j < K; ++j) fprintf(stderr, "%d%s", map[j], j + 1 < K ? "," : ")\n");
        else fprintf(stderr, "none)\n");
    }
}

int main(void) {
    static inputs in;
    static float ref_state[T_MAX][N_SEQS * H_V * S_V * S_V]; // state after token t (layout of the op's state output)
    static float ref_attn[N_SEQS][T_MAX][H_V * S_V];
    static float out[1 << 20], out2[1 << 20], tmp[1 << 20];
    const size_t D = (size_t) N_SEQS * H_V * S_V * S_V;

    unsigned seed = 1234;
    int n_cases = 0;
    for (int kda = 0; kda <= 1; ++kda) {
        for (int T = 1; T <= T_MAX; T += (T < 3 ? 1 : 3)) {
            in.T = T; in.kda = kda;
            float * fq = &in.q[0][0][0][0];
            for (size_t i = 0; i < sizeof(in.q)/sizeof(float); ++i) fq[i] = 0.5f * frand(&seed);
            float * fk = &in.k[0][0][0][0];
            for (size_t i = 0; i < sizeof(in.k)/sizeof(float); ++i) fk[i] = 0.5f * frand(&seed);
            float * fv = &in.v[0][0][0][0];
            for (size_t i = 0; i < sizeof(in.v)/sizeof(float); ++i) fv[i] = frand(&seed);
            float * fg = &in.g[0][0][0][0];
            for (size_t i = 0; i < sizeof(in.g)/sizeof(float); ++i) fg[i] = -0.1f - 0.4f * fabsf(frand(&seed));
            float * fb = &in.beta[0][0][0];
            for (size_t i = 0; i < sizeof(in.beta)/sizeof(float); ++i) fb[i] = 0.5f + 0.5f * fabsf(frand(&seed));
            float * fs = &in.s0[0][0][0];
            for (size_t i = 0; i < sizeof(in.s0)/sizeof(float); ++i) fs[i] = 0.2f * frand(&seed);

            // reference: token by token (n_tokens = 1, K = 1), state fed forward
            const size_t attn1 = (size_t) S_V * H_V * 1 * N_SEQS;
            const float * s_prev = &in.s0[0][0][0];
            for (int t = 0; t < T; ++t) {
                run_op(&in, t, 1, s_prev, 1, NULL, 1, tmp, sizeof(tmp)/sizeof(float), 0);
                memcpy(ref_state[t], tmp + attn1, D * sizeof(float));
                for (int sq = 0; sq < N_SEQS; ++sq) memcpy(ref_attn[sq][t], tmp + (size_t) sq * H_V * S_V, sizeof(float) * H_V * S_V);
                s_prev = ref_state[t];
            }

            // maps: every layout (n_planes, lead) plus hand-made ones with repeats and skips
            int32_t maps[64][GGML_GDN_MAX_SNAPSHOT_SLOTS]; int Ks[64]; int n_maps = 0;
            for (int P = 2; P <= 7; ++P) {
                for (int lead = -1; lead <= P - 2; ++lead) { layout_map(P, lead, T, maps[n_maps]); Ks[n_maps++] = P; }
            }
            { int32_t m[5] = { -1, -1, T - 1, 99, 0 }; memcpy(maps[n_maps], m, sizeof(m)); Ks[n_maps++] = 5; }
            { int32_t m[3] = { GGML_GDN_SNAPSHOT_SKIP, T / 2, GGML_GDN_SNAPSHOT_SKIP }; memcpy(maps[n_maps], m, sizeof(m)); Ks[n_maps++] = 3; }
            { int32_t m[1] = { -1 }; memcpy(maps[n_maps], m, sizeof(m)); Ks[n_maps++] = 1; }
            { int32_t m[1] = { T - 1 }; memcpy(maps[n_maps], m, sizeof(m)); Ks[n_maps++] = 1; }
            { int32_t m[GGML_GDN_MAX_SNAPSHOT_SLOTS]; for (int j = 0; j < GGML_GDN_MAX_SNAPSHOT_SLOTS; ++j) m[j] = (j % (T + 2)) - 1;
              memcpy(maps[n_maps], m, sizeof(m)); Ks[n_maps++] = GGML_GDN_MAX_SNAPSHOT_SLOTS; }

            for (int mi = 0; mi < n_maps; ++mi) {
                const int K = Ks[mi]; const int32_t * map = maps[mi];
                for (int thr = 1; thr <= 2; ++thr) {
                    run_op(&in, 0, T, &in.s0[0][0][0], K, map, thr, out, sizeof(out)/sizeof(float), 1);
                    ++n_cases;
                    const size_t attn = (size_t) S_V * H_V * T * N_SEQS;
                    // attention output
                    double d = 0.0;
                    for (int sq = 0; sq < N_SEQS; ++sq) for (int t = 0; t < T; ++t)
                        d = fmax(d, cmp(out + ((size_t) sq * T + t) * H_V * S_V, ref_attn[sq][t], H_V * S_V));
                    max_diff_all = fmax(max_diff_all, d);
                    check(d == 0.0, "attention output != token-by-token", T, K, map, kda, thr);
                    // slots
                    for (int j = 0; j < K; ++j) {
                        const float * slot = out + attn + (size_t) j * D;
                        const int tok = map[j];
                        if (tok == -1) {
                            d = cmp(slot, &in.s0[0][0][0], D);
                            check(d == 0.0, "input slot != input state", T, K, map, kda, thr);
                        } else if (tok >= 0 && tok < T) {
                            d = cmp(slot, ref_state[tok], D);
                            max_diff_all = fmax(max_diff_all, d);
                            check(d == 0.0, "slot != token-by-token state", T, K, map, kda, thr);
                        } else {
                            int untouched = 1;
                            for (size_t i = 0; i < D; ++i) untouched &= slot[i] == SENTINEL;
                            check(untouched, "skipped slot was written", T, K, map, kda, thr);
                        }
                    }
                }
            }

            // default layout (no map): upstream semantics, bit-identical to the trailing map
            for (int K = 1; K <= 6; ++K) {
                int32_t m[8]; layout_map(K, -1, T, m);
                run_op(&in, 0, T, &in.s0[0][0][0], K, NULL, 2, out, sizeof(out)/sizeof(float), 1);
                const int n_out = run_op(&in, 0, T, &in.s0[0][0][0], K, K > 1 ? m : NULL, 2, out2, sizeof(out2)/sizeof(float), 1);
                check(memcmp(out, out2, (size_t) n_out * sizeof(float)) == 0, "no map != trailing map", T, K, NULL, kda, 2);
                const size_t attn = (size_t) S_V * H_V * T * N_SEQS;
                for (int j = 0; j < K; ++j) {
                    const float * slot = out + attn + (size_t) j * D;
                    if (j < T) {
                        check(cmp(slot, ref_state[T - 1 - j], D) == 0.0, "default slot != state j tokens back", T, K, NULL, kda, 2);
                    } else if (K > 1) {
                        int untouched = 1;
                        for (size_t i = 0; i < D; ++i) untouched &= slot[i] == SENTINEL;
                        check(untouched, "default layout wrote a slot beyond n_tokens", T, K, NULL, kda, 2);
                    }
                }
                n_cases++;
            }
        }
    }

    printf("gdn snapshot map: %d op runs, %d checks, %d failed, max |diff| vs token-by-token = %g\n",
           n_cases, n_checks, n_fail, max_diff_all);
    return n_fail == 0 ? 0 : 1;
}
