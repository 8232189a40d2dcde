// Attention for the rows of a draft tree on a CPU whose own attention is not row-invariant (rest_lsp/model/
// attention.py says why and how it is used). A query row's result depends on its own visible keys only, taken in
// slot order: neither the other rows of the call nor the keys hidden from it (the tree's other branches, the
// padding of the last tile) change one bit of it, so a tree row rounds exactly as plain decoding's single row.
// How: every operation on a score or a weight is elementwise on vectors of the CPU's width (the same operations in
// every lane, no scalar tails), the weighted sum of values runs in slot order, the weights' sum in lanes by the
// key's rank among the row's visible keys reduced in a fixed order, a hidden key's weight is exactly 0 (adding 0
// changes nothing), and the compiler may neither fuse nor reorder on its own (-ffp-contract=off, no -ffast-math):
// the multiply-adds fused are written out (fmav).
#include <stdint.h>
#include <string.h>
#include <immintrin.h>

#include <vector>

// the CPU's own vector width: wider generic vectors are split and spilled to the stack (16 lanes built for AVX2
// ran 13x slower than 8)
#if defined(__AVX512F__)
#define VBYTES 64
#elif defined(__AVX__)
#define VBYTES 32
#else
#define VBYTES 16
#endif
typedef float vf __attribute__((vector_size(VBYTES)));
typedef int32_t vi __attribute__((vector_size(VBYTES)));
typedef uint8_t vb __attribute__((vector_size(VBYTES / 4)));

static const int W = VBYTES / 4; // lanes
static const int TILE = 2 * W;   // keys a tile: two vectors

static inline vf splat(float x) { return (vf){} + x; }
static inline vf load(const float *p) { vf r; memcpy(&r, p, sizeof r); return r; }
static inline void store(float *p, vf x) { memcpy(p, &x, sizeof x); }
// a row's mask bytes as lanes: nonzero where the key is visible
static inline vi visible(const uint8_t *p) { vb b; memcpy(&b, p, sizeof b); return __builtin_convertvector(b, vi); }

// c + a * b rounded once where the CPU fuses it (half the instructions of the two dot products), else rounded
// twice: either way the same in every lane and every call, which is all a row's bits depend on
static inline vf fmav(vf a, vf b, vf c) {
#if VBYTES == 64
    return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif VBYTES == 32 && defined(__FMA__)
    return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return c + a * b;
#endif
}

static inline vf exp_nonpositive(vf x) {
    // Cephes' expf for x <= 0, lane by lane: the same operations in every lane
    x = x < splat(-87.0f) ? splat(-87.0f) : x;
    vf t = x * 1.44269504088896341f;
    vf k = (t + 12582912.0f) - 12582912.0f;  // round to nearest (|t| < 2^22)
    vf r = (x - k * 0.693359375f) - k * -2.12194440e-4f;
    vf y = splat(1.9875691500e-4f);
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = (y * (r * r) + r) + 1.0f;
    vi n = (__builtin_convertvector(k, vi) + 127) << 23;
    vf two;
    memcpy(&two, &n, sizeof two);
    return y * two;
}

static inline float to_f32(float x) { return x; }
static inline float to_f32(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// HD: the head width (0: any, read from hd); HD / W value vectors a row
template <typename T, int HD>
static void attend_head(const float *q, const T *k, const T *v, int64_t head_stride, const uint8_t *mask, int nh,
                        int nkv, int nq, int span, int hd_arg, float scale, float *out, int g) {
    const int hd = HD ? HD : hd_arg;
    const int group = nh / nkv, R = group * nq;
    const int span_pad = (span + TILE - 1) / TILE * TILE;
    static thread_local std::vector<float> buffer;
    const size_t need = (size_t)R * span_pad + (size_t)TILE * hd + (size_t)R * hd + R + span_pad + span_pad / 4 + 16;
    if (buffer.size() < need) buffer.resize(need);
    float *S = buffer.data();                        // [R, span_pad] scores, then weights
    float *tile = S + (int64_t)R * span_pad;         // [hd, TILE] keys transposed, or [TILE, hd] values
    float *acc = tile + (int64_t)TILE * hd;          // [R, hd]
    float *totals = acc + (int64_t)R * hd;           // [R]
    float *ranked = totals + R;                      // [span_pad] a row's visible weights in slot order
    uint8_t *vis = (uint8_t *)(ranked + span_pad);   // [span_pad] a row's mask, padded with 0
    {
        const T *kg = k + g * head_stride, *vg = v + g * head_stride;
        // scores: S[row, j] = sum over d in order of q[row, d] * k[j, d]
        for (int j0 = 0; j0 < span_pad; j0 += TILE) {
            const int n = span - j0 < TILE ? span - j0 : TILE;
            for (int l = 0; l < TILE; l++) {
                if (l < n) {
                    const T *kj = kg + (int64_t)(j0 + l) * hd;
                    for (int d = 0; d < hd; d++) tile[d * TILE + l] = to_f32(kj[d]);
                } else {
                    for (int d = 0; d < hd; d++) tile[d * TILE + l] = 0.0f;
                }
            }
            int row = 0;
            for (; row + 4 <= R; row += 4) {
                const float *q0 = q + ((int64_t)(g * group + row / nq) * nq + row % nq) * hd;
                const float *q1 = q + ((int64_t)(g * group + (row + 1) / nq) * nq + (row + 1) % nq) * hd;
                const float *q2 = q + ((int64_t)(g * group + (row + 2) / nq) * nq + (row + 2) % nq) * hd;
                const float *q3 = q + ((int64_t)(g * group + (row + 3) / nq) * nq + (row + 3) % nq) * hd;
                vf a0 = {}, b0 = {}, a1 = {}, b1 = {}, a2 = {}, b2 = {}, a3 = {}, b3 = {};
                for (int d = 0; d < hd; d++) {
                    vf t0 = load(tile + d * TILE), t1 = load(tile + d * TILE + W);
                    const vf x0 = splat(q0[d]), x1 = splat(q1[d]), x2 = splat(q2[d]), x3 = splat(q3[d]);
                    a0 = fmav(x0, t0, a0); b0 = fmav(x0, t1, b0);
                    a1 = fmav(x1, t0, a1); b1 = fmav(x1, t1, b1);
                    a2 = fmav(x2, t0, a2); b2 = fmav(x2, t1, b2);
                    a3 = fmav(x3, t0, a3); b3 = fmav(x3, t1, b3);
                }
                float *s = S + (int64_t)row * span_pad + j0;
                store(s, a0); store(s + W, b0);
                store(s + span_pad, a1); store(s + span_pad + W, b1);
                store(s + 2 * span_pad, a2); store(s + 2 * span_pad + W, b2);
                store(s + 3 * span_pad, a3); store(s + 3 * span_pad + W, b3);
            }
            for (; row < R; row++) {
                const float *q0 = q + ((int64_t)(g * group + row / nq) * nq + row % nq) * hd;
                vf a0 = {}, b0 = {};
                for (int d = 0; d < hd; d++) {
                    a0 = fmav(splat(q0[d]), load(tile + d * TILE), a0);
                    b0 = fmav(splat(q0[d]), load(tile + d * TILE + W), b0);
                }
                float *s = S + (int64_t)row * span_pad + j0;
                store(s, a0); store(s + W, b0);
            }
        }
        // softmax over the row's visible keys; hidden and padded keys get exactly 0
        for (int row = 0; row < R; row++) {
            float *s = S + (int64_t)row * span_pad;
            memcpy(vis, mask + (int64_t)(row % nq) * span, span);
            memset(vis + span, 0, span_pad - span);
            vf mx = splat(-__builtin_inff());
            for (int j0 = 0; j0 < span_pad; j0 += W) {
                const vi seen = visible(vis + j0);
                vf x = load(s + j0);
                mx = seen != 0 && x > mx ? x : mx;
            }
            float m = mx[0];
            for (int l = 1; l < W; l++) m = mx[l] > m ? mx[l] : m;
            for (int j0 = 0; j0 < span_pad; j0 += W) {
                const vi seen = visible(vis + j0);
                vf p = exp_nonpositive((load(s + j0) - m) * scale);
                store(s + j0, seen != 0 ? p : splat(0.0f));
            }
            // the weights' sum in lanes by the key's rank among the row's visible keys, not by its slot: a
            // tree's path sits in scattered slots that plain decoding holds side by side
            int n = 0;
            for (int j = 0; j < span; j++)
                if (vis[j]) ranked[n++] = s[j];
            for (int l = n; l < (n + W - 1) / W * W; l++) ranked[l] = 0.0f;
            vf lanes = {};
            for (int t0 = 0; t0 < n; t0 += W) lanes = lanes + load(ranked + t0);
            float h[W];  // halved in a fixed order: lane l + w onto lane l
            memcpy(h, &lanes, sizeof h);
            for (int w = W / 2; w >= 1; w /= 2)
                for (int l = 0; l < w; l++) h[l] = h[l] + h[l + w];
            totals[row] = h[0];
        }
        // values: o[row, :] = sum over j in order of p[row, j] * v[j, :]
        memset(acc, 0, sizeof(float) * R * hd);
        for (int j0 = 0; j0 < span_pad; j0 += TILE) {
            const int n = span - j0 < TILE ? span - j0 : TILE;
            // an fp32 cache's whole tile is read where it lies (its rows are the tile's layout); the last tile,
            // padded with zeros, and a bf16 cache's, converted, are copied
            const float *vt = tile;
            if constexpr (sizeof(T) == sizeof(float)) {
                if (n == TILE) vt = reinterpret_cast<const float *>(vg + (int64_t)j0 * hd);
            }
            if (vt == tile) {
                for (int l = 0; l < TILE; l++) {
                    const T *vj = vg + (int64_t)(j0 + l) * hd;
                    for (int d = 0; d < hd; d++) tile[l * hd + d] = l < n ? to_f32(vj[d]) : 0.0f;
                }
            }
            for (int row = 0; row < R; row++) {
                const float *p = S + (int64_t)row * span_pad + j0;
                float *o = acc + (int64_t)row * hd;
                if (HD) {
                    vf oc[HD ? HD / W : 1];
                    for (int c = 0; c < HD / W; c++) oc[c] = load(o + c * W);
                    for (int l = 0; l < TILE; l++)
                        for (int c = 0; c < HD / W; c++)
                            oc[c] = fmav(splat(p[l]), load(vt + l * hd + c * W), oc[c]);
                    for (int c = 0; c < HD / W; c++) store(o + c * W, oc[c]);
                } else {
                    for (int l = 0; l < TILE; l++)
                        for (int d = 0; d < hd; d++) o[d] = o[d] + p[l] * vt[l * hd + d];
                }
            }
        }
        for (int row = 0; row < R; row++) {
            float *dst = out + ((int64_t)(g * group + row / nq) * nq + row % nq) * hd;
            for (int d = 0; d < hd; d++) dst[d] = acc[(int64_t)row * hd + d] / totals[row];
        }
    }
}

template <typename T>
static int dispatch(const float *q, const T *k, const T *v, int64_t head_stride, const uint8_t *mask, int nh,
                    int nkv, int nq, int span, int hd, float scale, float *out) {
    if (nkv <= 0 || nh % nkv || nq <= 0 || span <= 0 || hd <= 0) return 1;
    // each key/value head on its own thread (torch's OpenMP pool: the same libgomp.so.1), every head's rows
    // computed alike whichever thread runs it
#pragma omp parallel for schedule(static)
    for (int g = 0; g < nkv; g++) {
        if (hd == 64) attend_head<T, 64>(q, k, v, head_stride, mask, nh, nkv, nq, span, hd, scale, out, g);
        else if (hd == 128) attend_head<T, 128>(q, k, v, head_stride, mask, nh, nkv, nq, span, hd, scale, out, g);
        else attend_head<T, 0>(q, k, v, head_stride, mask, nh, nkv, nq, span, hd, scale, out, g);
    }
    return 0;
}

extern "C" {
int rest_attend_f32(const float *q, const float *k, const float *v, int64_t head_stride, const uint8_t *mask, int nh,
                    int nkv, int nq, int span, int hd, float scale, float *out) {
    return dispatch<float>(q, k, v, head_stride, mask, nh, nkv, nq, span, hd, scale, out);
}
int rest_attend_bf16(const float *q, const uint16_t *k, const uint16_t *v, int64_t head_stride, const uint8_t *mask,
                     int nh, int nkv, int nq, int span, int hd, float scale, float *out) {
    return dispatch<uint16_t>(q, k, v, head_stride, mask, nh, nkv, nq, span, hd, scale, out);
}
}
