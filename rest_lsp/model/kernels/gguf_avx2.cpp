// The AVX2 build of int4w's products (rest_lsp/model/gguf_amx.py builds it where the CPU has AVX2 and FMA but not
// AVX512-BF16: an AVX2-only EPYC, an Ice Lake Xeon): the same entry points, blocks and layout as kernels/
// gguf_amx.cpp, and the numbers of its VNNI build, bit for bit. Every format takes int8 activations, a scale per
// 32 inputs (q = round(x * 127 / amax), ties to even, scale amax / 127); the codes' dot products with q are
// integers, and every float operation after them is the VNNI build's, per element and in its order (two halves of
// 8 columns where it has one register of 16; Q4_K's input sums in _mm512_reduce_add_ps's order). What differs is
// how the integers are made: AVX2 has no VPDPBUSD, so VPMADDUBSW multiplies a column's unsigned codes by the
// signed activations into int16 pair sums, some chunks of those are added in int16 and VPMADDWD widens them. No
// int16 sum can saturate: |q| <= 127, so a pair sum is at most 2 * 127 * the largest code (15 Q4_K, 31 Q5_0, 63
// Q6_K), and at most 8, 4 and 2 chunks of pairs are added before widening (30,480, 31,496 and 32,004 < 32,767);
// Q8_0's signed codes go through VPSIGNB (|w| <= 128 times +-q: 32,512 a pair, widened at once). A row gets the
// same bits alone and in a tree, as in the VNNI build, and int4w takes that build's quality figures
// (precision.INT4W_VNNI_QUALITY); tests/model/test_gguf_amx.py compares the two builds bit for bit where both run.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cstring>
#include <vector>

namespace {

constexpr int PREFETCH = 4096;  // bytes ahead of the codes being decoded

// 16 columns: columns 0-7 and 8-15
struct I16 { __m256i lo, hi; };
struct F16 { __m256 lo, hi; };

inline F16 load16(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }

// d times a column block's 16 scales (Q4_K's 6-bit scales and mins unsigned, Q6_K's signed)
inline F16 scaled(const F16& d, const uint8_t* s) {
  return {_mm256_mul_ps(d.lo, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s))))),
          _mm256_mul_ps(d.hi, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + 8)))))};
}
inline F16 scaled(const F16& d, const int8_t* s) {
  return {_mm256_mul_ps(d.lo, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s))))),
          _mm256_mul_ps(d.hi, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + 8)))))};
}

inline int32_t hsum(__m256i v) {  // integers: any order
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

struct Int8Rows {
  std::vector<int8_t> q;      // [M, K]
  std::vector<float> scale;   // [M, K/32]
  std::vector<float> sum;     // [M, K/32] the inputs' own fp32 sum (Q4_K's mins), with `float_sums`
  std::vector<int32_t> qsum;  // [M, K/16] the sum of q by 16 (the offsets of Q6_K and Q5_0), without
};

// x's rows rounded to int8 by 32 inputs, as the VNNI build rounds them
Int8Rows int8_rows(const torch::Tensor& x, bool float_sums) {
  const torch::Tensor x32 = x.to(torch::kFloat32).contiguous();
  const int64_t M = x32.size(0), K = x32.size(1), G = K / 32;
  Int8Rows a{std::vector<int8_t>(M * K), std::vector<float>(M * G), std::vector<float>(float_sums ? M * G : 0),
             std::vector<int32_t>(float_sums ? 0 : M * K / 16)};
  const float* xp = x32.data_ptr<float>();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // the two packs' dwords back in input order
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      const float* v = xp + m * K + g * 32;
      const __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8), v2 = _mm256_loadu_ps(v + 16),
                   v3 = _mm256_loadu_ps(v + 24);
      const __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, abs_mask), _mm256_and_ps(v1, abs_mask)),
                                      _mm256_max_ps(_mm256_and_ps(v2, abs_mask), _mm256_and_ps(v3, abs_mask)));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));  // a maximum: any order
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
      const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
      const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, inv)), q1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, inv)),
                    q2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, inv)), q3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, inv));
      // saturating packs, as _mm512_cvtsepi32_epi8 saturates
      const __m256i q8 = _mm256_permutevar8x32_epi32(
          _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3)), order);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.q.data() + m * K + g * 32), q8);
      a.scale[m * G + g] = amax / 127.f;
      if (float_sums) {
        // _mm512_reduce_add_ps(x[0..15] + x[16..31]): lanes i + 8, then i + 4, then (0 + 2) + (1 + 3)
        const __m256 t3 = _mm256_add_ps(_mm256_add_ps(v1, v3), _mm256_add_ps(v0, v2));
        const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
        const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
        a.sum[m * G + g] = _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 1));
      } else {
        a.qsum[m * 2 * G + 2 * g] = hsum(_mm256_add_epi32(q0, q1));
        a.qsum[m * 2 * G + 2 * g + 1] = hsum(_mm256_add_epi32(q2, q3));
      }
    }
  return a;
}

// codes of 4 k for 8 columns, a column's 4 bytes in a 32-bit lane, from 16 bytes of a chunk of the nibble
// layout (byte 2n: k0 | k2 << 4, byte 2n + 1: k1 | k3 << 4 for column n)
inline __m256i nibble8(const uint8_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi32(0x0F0F)),
                         _mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0xF0F0)), 12));
}
inline I16 nibble_lanes(const uint8_t* chunk) { return {nibble8(chunk), nibble8(chunk + 16)}; }

// a chunk's 16-bit lanes per column widened to 32 bits: [2-byte lane of columns 0-7, of columns 8-15]
inline I16 halves32(const uint8_t* chunk) {
  return {_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk))),
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 16)))};
}

// acc += sum over j < N of W[j] . x[4j..4j+3] per column: unsigned codes times int8 activations in int16 pair
// sums, the N chunks added in int16 (the caller's N keeps them below 2^15), then widened to int32
template <int N>
inline void quad_dots(const int8_t* x, const I16* W, I16& acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
  const int32_t* xv = reinterpret_cast<const int32_t*>(x);
  for (int j = 0; j < N; ++j) {
    const __m256i xb = _mm256_set1_epi32(xv[j]);
    lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(W[j].lo, xb));
    hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(W[j].hi, xb));
  }
  acc.lo = _mm256_add_epi32(acc.lo, _mm256_madd_epi16(lo, ones));
  acc.hi = _mm256_add_epi32(acc.hi, _mm256_madd_epi16(hi, ones));
}

inline I16 zero16() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline F16 floats(const I16& v) { return {_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)}; }

// body(nb, tot) for every block nb of 16 of out's columns ([M, N] fp32), on at::parallel_for's threads; tot
// (M x 16 fp32) starts at zero for each block and ends as the block's output columns
template <class Body>
torch::Tensor column_blocks(int64_t M, int64_t NB, Body body) {
  torch::Tensor out_t = torch::empty({M, NB * 16}, torch::kFloat32);
  const int64_t N = NB * 16;
  float* out = out_t.data_ptr<float>();
  at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> tot(std::max<int64_t>(M, 1) * 16);
    for (int64_t nb = b0; nb < b1; ++nb) {
      std::fill(tot.begin(), tot.end(), 0.f);
      body(nb, tot.data());
      for (int64_t m = 0; m < M; ++m) std::memcpy(out + m * N + nb * 16, tot.data() + m * 16, 64);
    }
  });
  return out_t;
}

// t (16 floats) = fmadd(A * s, dot, t), the VNNI build's one line per half
inline void fmadd_into(float* t, const F16& A, __m256 s, const F16& dot) {
  _mm256_storeu_ps(t, _mm256_fmadd_ps(_mm256_mul_ps(A.lo, s), dot.lo, _mm256_loadu_ps(t)));
  _mm256_storeu_ps(t + 8, _mm256_fmadd_ps(_mm256_mul_ps(A.hi, s), dot.hi, _mm256_loadu_ps(t + 8)));
}

// Q4_K: y = sum over groups of 32 of d*sc * scale * dot(q, x8) - dmin*m * sum(x)
torch::Tensor q4k(const torch::Tensor& x, const uint8_t* cp, const float* dp, const uint8_t* sp, int64_t NB) {
  const int64_t M = x.size(0), K = x.size(1), G = K / 32, SB = K / 256;
  const Int8Rows a = int8_rows(x, true);
  return column_blocks(M, NB, [&](int64_t nb, float* tot) {
    const uint8_t* q = cp + nb * (K / 4) * 32;
    for (int64_t sb = 0; sb < SB; ++sb) {
      const float* f = dp + (nb * SB + sb) * 32;
      const F16 d = load16(f), dmin = load16(f + 16);
      for (int gi = 0; gi < 8; ++gi) {
        I16 W[8];
        for (int j = 0; j < 8; ++j) {
          const uint8_t* c = q + (sb * 64 + gi * 8 + j) * 32;
          if ((j & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(c + PREFETCH), _MM_HINT_T0);
          W[j] = nibble_lanes(c);
        }
        const uint8_t* s = sp + (nb * G + sb * 8 + gi) * 32;
        const F16 S = scaled(d, s), L = scaled(dmin, s + 16);
        const int64_t g = sb * 8 + gi;
        for (int64_t r = 0; r < M; ++r) {
          I16 dot = zero16();
          quad_dots<8>(a.q.data() + r * K + g * 32, W, dot);  // 8 x 2 x 15 x 127 = 30,480
          const F16 fd = floats(dot);
          const __m256 sc = _mm256_set1_ps(a.scale[r * G + g]), xs = _mm256_set1_ps(a.sum[r * G + g]);
          float* t = tot + r * 16;
          const __m256 v0 = _mm256_fmadd_ps(_mm256_mul_ps(S.lo, sc), fd.lo, _mm256_loadu_ps(t));
          const __m256 v1 = _mm256_fmadd_ps(_mm256_mul_ps(S.hi, sc), fd.hi, _mm256_loadu_ps(t + 8));
          _mm256_storeu_ps(t, _mm256_fnmadd_ps(L.lo, xs, v0));
          _mm256_storeu_ps(t + 8, _mm256_fnmadd_ps(L.hi, xs, v1));
        }
      }
    }
  });
}

// Q6_K: y = sum over groups of 16 of d*sc * scale * (dot(q, x8) - 32 * sum(x8)), q = lo | hi << 4 in 0..63;
// a group of 32 activations (one scale) covers two of the weights' groups
torch::Tensor q6k(const torch::Tensor& x, const uint8_t* lp, const uint8_t* hp, const float* dp, const int8_t* sp,
                  int64_t NB) {
  const int64_t M = x.size(0), K = x.size(1), G = K / 16, SB = K / 256;
  const Int8Rows a = int8_rows(x, false);
  const __m256i two = _mm256_set1_epi32(0x0303);
  return column_blocks(M, NB, [&](int64_t nb, float* tot) {
    for (int64_t sb = 0; sb < SB; ++sb) {
      const uint8_t* ls = lp + (nb * (K / 4) + sb * 64) * 32;
      const uint8_t* hs = hp + (nb * (K / 8) + sb * 32) * 32;
      const F16 d = load16(dp + (nb * SB + sb) * 16);
      for (int gi = 0; gi < 8; ++gi) {  // 32 inputs: chunks 8gi..8gi+7 of the super-block
        I16 W[8];
        for (int j = 0; j < 8; ++j) {
          const int c = gi * 8 + j;  // the chunk: k = 4c..4c+3; its top bits: pairs 2c, 2c + 1 of hi chunk c / 2
          if ((j & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(ls + c * 32 + PREFETCH), _MM_HINT_T0);
          const I16 h = halves32(hs + (c / 2) * 32), n = nibble_lanes(ls + c * 32);
          const int v = 4 * (c % 2);  // bits of pair 2c in a byte
          auto top = [&](__m256i hh) {
            return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(hh, v), two),
                                   _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hh, v + 2), two), 16));
          };
          W[j] = {_mm256_or_si256(n.lo, _mm256_slli_epi32(top(h.lo), 4)), _mm256_or_si256(n.hi, _mm256_slli_epi32(top(h.hi), 4))};
        }
        const int8_t* s = sp + (nb * G + sb * 16 + 2 * gi) * 16;
        const F16 SA = scaled(d, s), SB_ = scaled(d, s + 16);
        const int64_t g = sb * 8 + gi;  // the activations' group of 32
        for (int64_t r = 0; r < M; ++r) {
          const int8_t* xr = a.q.data() + r * K + g * 32;
          I16 dA = zero16(), dB = zero16();
          quad_dots<2>(xr, W, dA);  // 2 x 2 x 63 x 127 = 32,004
          quad_dots<2>(xr + 8, W + 2, dA);
          quad_dots<2>(xr + 16, W + 4, dB);
          quad_dots<2>(xr + 24, W + 6, dB);
          const __m256i oA = _mm256_set1_epi32(32 * a.qsum[r * G + 2 * g]), oB = _mm256_set1_epi32(32 * a.qsum[r * G + 2 * g + 1]);
          const F16 fA = floats({_mm256_sub_epi32(dA.lo, oA), _mm256_sub_epi32(dA.hi, oA)});
          const F16 fB = floats({_mm256_sub_epi32(dB.lo, oB), _mm256_sub_epi32(dB.hi, oB)});
          const __m256 sc = _mm256_set1_ps(a.scale[r * (K / 32) + g]);
          float* t = tot + r * 16;
          fmadd_into(t, SA, sc, fA);
          fmadd_into(t, SB_, sc, fB);
        }
      }
    }
  });
}

// Q5_0 and Q8_0: y = sum over groups of 32 of d * scale * dot(w, x8), w = q - 16 (Q5_0: dot(q, x8) - 16 *
// sum(x8)) or q (Q8_0, signed: |q| times x8 with q's sign)
template <bool Q8>
torch::Tensor q32(const torch::Tensor& x, const uint8_t* lp, const uint8_t* hp, const float* dp, int64_t NB) {
  const int64_t M = x.size(0), K = x.size(1), G = K / 32;
  const Int8Rows a = int8_rows(x, false);
  const __m256i bit0 = _mm256_set1_epi32(0x01010101), even = _mm256_set1_epi32(0x5555), ones = _mm256_set1_epi16(1);
  return column_blocks(M, NB, [&](int64_t nb, float* tot) {
    const uint8_t* lb = lp + nb * (Q8 ? K / 2 : K / 4) * 32;
    for (int64_t g = 0; g < G; ++g) {
      I16 W[8], A[8];  // Q8_0: W the codes (signed), A their magnitudes
      if (Q8) {
        const uint8_t* ls = lb + g * 16 * 32;
        for (int j = 0; j < 8; ++j) {
          // chunks 2j and 2j + 1 (k = 4j, 4j + 1 and 4j + 2, 4j + 3 of 16 columns) interleaved by 16 bits: a
          // column's four k in one lane; the 64-bit quarters reordered first, as the unpacks work per 128 bits
          _mm_prefetch(reinterpret_cast<const char*>(ls + 64 * j + PREFETCH), _MM_HINT_T0);
          const __m256i c0 = _mm256_permute4x64_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ls + 64 * j)), 0xD8);
          const __m256i c1 = _mm256_permute4x64_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ls + 64 * j + 32)), 0xD8);
          W[j] = {_mm256_unpacklo_epi16(c0, c1), _mm256_unpackhi_epi16(c0, c1)};
          A[j] = {_mm256_abs_epi8(W[j].lo), _mm256_abs_epi8(W[j].hi)};
        }
      } else {
        const uint8_t* ls = lb + g * 8 * 32;
        const uint8_t* hs = hp + (nb * (K / 16) + g * 2) * 32;
        _mm_prefetch(reinterpret_cast<const char*>(hs + PREFETCH / 4), _MM_HINT_T0);
        for (int hh = 0; hh < 2; ++hh) {
          // lane n of hi chunk hh: bit v of byte 2n (k even) and of byte 2n + 1 (k odd) the top bit of pair 8hh + v;
          // rearranged so that bits 2cc, 8 + 2cc, 16 + 2cc, 24 + 2cc are those of k = 0..3 of nibble chunk cc
          const I16 h = halves32(hs + 32 * hh);
          auto tops = [&](__m256i v) {
            return _mm256_or_si256(_mm256_and_si256(v, even), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(v, 1), even), 16));
          };
          const __m256i tlo = tops(h.lo), thi = tops(h.hi);
          for (int cc = 0; cc < 4; ++cc) {
            const int c = 4 * hh + cc;
            if ((c & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(ls + 32 * c + PREFETCH), _MM_HINT_T0);
            const I16 n = nibble_lanes(ls + 32 * c);
            W[c] = {_mm256_or_si256(n.lo, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(tlo, 2 * cc), bit0), 4)),
                    _mm256_or_si256(n.hi, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(thi, 2 * cc), bit0), 4))};
          }
        }
      }
      const F16 d = load16(dp + (nb * G + g) * 16);
      for (int64_t r = 0; r < M; ++r) {
        const int8_t* xr = a.q.data() + r * K + g * 32;
        I16 dot = zero16();
        if (Q8) {
          const int32_t* xv = reinterpret_cast<const int32_t*>(xr);
          for (int j = 0; j < 8; ++j) {  // 2 x 128 x 127 = 32,512: widened chunk by chunk
            const __m256i xb = _mm256_set1_epi32(xv[j]);
            dot.lo = _mm256_add_epi32(dot.lo, _mm256_madd_epi16(_mm256_maddubs_epi16(A[j].lo, _mm256_sign_epi8(xb, W[j].lo)), ones));
            dot.hi = _mm256_add_epi32(dot.hi, _mm256_madd_epi16(_mm256_maddubs_epi16(A[j].hi, _mm256_sign_epi8(xb, W[j].hi)), ones));
          }
        } else {
          quad_dots<4>(xr, W, dot);  // 4 x 2 x 31 x 127 = 31,496
          quad_dots<4>(xr + 16, W + 4, dot);
          const __m256i off = _mm256_set1_epi32(16 * (a.qsum[r * 2 * G + 2 * g] + a.qsum[r * 2 * G + 2 * g + 1]));
          dot = {_mm256_sub_epi32(dot.lo, off), _mm256_sub_epi32(dot.hi, off)};
        }
        fmadd_into(tot + r * 16, d, _mm256_set1_ps(a.scale[r * G + g]), floats(dot));
      }
    }
  });
}

}  // namespace

bool q4k_amx_ready() { return true; }  // no tile state to ask for

torch::Tensor q4k_amx_mm(torch::Tensor x, torch::Tensor codes, torch::Tensor dd, torch::Tensor sm) {
  TORCH_CHECK(x.dim() == 2 && codes.dim() == 3 && codes.size(2) == 32, "q4k_amx_mm: shapes");
  TORCH_CHECK(codes.is_contiguous() && dd.is_contiguous() && sm.is_contiguous(), "q4k_amx_mm: contiguous weights");
  const int64_t K = x.size(1);
  TORCH_CHECK(K % 256 == 0 && codes.size(1) == K / 4, "q4k_amx_mm: width");
  return q4k(x, codes.data_ptr<uint8_t>(), dd.data_ptr<float>(), sm.data_ptr<uint8_t>(), codes.size(0));
}

torch::Tensor q6k_amx_mm(torch::Tensor x, torch::Tensor lo, torch::Tensor hi, torch::Tensor dd, torch::Tensor sc) {
  TORCH_CHECK(x.dim() == 2 && lo.dim() == 3 && lo.size(2) == 32 && hi.size(2) == 32, "q6k_amx_mm: shapes");
  TORCH_CHECK(lo.is_contiguous() && hi.is_contiguous() && dd.is_contiguous() && sc.is_contiguous(),
              "q6k_amx_mm: contiguous weights");
  const int64_t K = x.size(1);
  TORCH_CHECK(K % 256 == 0 && lo.size(1) == K / 4 && hi.size(1) == K / 8, "q6k_amx_mm: width");
  return q6k(x, lo.data_ptr<uint8_t>(), hi.data_ptr<uint8_t>(), dd.data_ptr<float>(), sc.data_ptr<int8_t>(), lo.size(0));
}

template <bool Q8>
torch::Tensor q32_amx_mm(torch::Tensor x, torch::Tensor lo, torch::Tensor hi, torch::Tensor dd) {
  TORCH_CHECK(x.dim() == 2 && lo.dim() == 3 && lo.size(2) == 32, "q32_amx_mm: shapes");
  TORCH_CHECK(lo.is_contiguous() && hi.is_contiguous() && dd.is_contiguous(), "q32_amx_mm: contiguous weights");
  const int64_t K = x.size(1);
  TORCH_CHECK(K % 64 == 0 && lo.size(1) == (Q8 ? K / 2 : K / 4) && (Q8 || hi.size(1) == K / 16), "q32_amx_mm: width");
  return q32<Q8>(x, lo.data_ptr<uint8_t>(), Q8 ? nullptr : hi.data_ptr<uint8_t>(), dd.data_ptr<float>(), lo.size(0));
}

// one product by format (0 Q4_K, 1 Q6_K, 2 Q5_0, 3 Q8_0), as gguf_amx.cpp's: decode_layer.cpp calls it
torch::Tensor gguf_product(int64_t kind, const torch::Tensor& x, const std::vector<torch::Tensor>& b) {
  TORCH_CHECK(kind >= 0 && kind <= 3 && b.size() == (kind == 1 ? 4u : 3u), "gguf_product: format and blocks");
  switch (kind) {
    case 0: return q4k_amx_mm(x, b[0], b[1], b[2]);
    case 1: return q6k_amx_mm(x, b[0], b[1], b[2], b[3]);
    case 2: return q32_amx_mm<false>(x, b[0], b[1], b[2]);
    default: return q32_amx_mm<true>(x, b[0], b[1], b[2]);
  }
}

void bind_decode_layer(pybind11::module& m);  // decode_layer.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q4k_amx_mm", &q4k_amx_mm, "x [M, K] float, codes, dd, sm -> [M, N] fp32");
  m.def("q6k_amx_mm", &q6k_amx_mm, "x [M, K] float, lo, hi, dd, sc -> [M, N] fp32");
  m.def("q5_0_amx_mm", &q32_amx_mm<false>, "x [M, K] float, lo, hi, dd -> [M, N] fp32");
  m.def("q8_0_amx_mm", &q32_amx_mm<true>, "x [M, K] float, codes, (empty), dd -> [M, N] fp32");
  m.def("q4k_amx_ready", &q4k_amx_ready, "whether the OS grants AMX tile state (no tiles here: always)");
  bind_decode_layer(m);
}
