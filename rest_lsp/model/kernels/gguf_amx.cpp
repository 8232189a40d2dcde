// Q4_K and Q6_K weights times bf16 activations on AMX tiles (rest_lsp/model/gguf_amx.py builds and documents it),
// or, built with REST_AVX512 (a CPU with AVX512-BF16 but no AMX), on AVX-512 dot products: the blocks' layout
// and scales are shared; each format has a body of its own there (codes decoded into registers and used by every
// row).
//
// codes [NB, K/4, 32] uint8: column block nb holds columns 16nb..16nb+15; byte j of chunk c holds, for column
//   16nb + j/2, the 4-bit value of k = 4c + j%2 (low nibble) and k = 4c + 2 + j%2 (high nibble): a chunk's two
//   nibble planes are two rows of an AMX B tile (a pair of k for 16 columns).
// dd [NB, K/256, 2, 16] fp32: each super-block's d and dmin per column; sm [NB, K/32, 2, 16] uint8: each
//   group's 6-bit scale and min per column. weight = d*sc*q - dmin*m.
// y[m][n] = sum over groups g of S*dot(q, x) - L*sum(x), S = d*sc, L = dmin*m, with x rounded to bf16 once and
// dot(q, x) = dot(128 + q, x) - 128*sum(x), the first one tile product (exact bf16 products, fp32 sums) per
// group: each element's operations depend on neither the number of rows nor the other columns, so a row gets
// the same bits alone and in any batch.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <cstring>
#include <vector>

namespace {

#ifdef REST_AVX512
constexpr bool AVX512_BUILD = true;
bool tiles_permitted() { return true; }  // no tiles asked for
#else
constexpr bool AVX512_BUILD = false;
bool tiles_permitted() {  // Linux hands out AMX tile state on request only
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return ok;
}
#endif

struct alignas(64) TileConfig {
  uint8_t palette_id = 1, start_row = 0, reserved[14] = {0};
  uint16_t colsb[16] = {0};
  uint8_t rows[16] = {0};
};

// bf16 of 128 + q for q < 128 is 0x4300 | q (exponent 2^7, q the mantissa): the codes become exact bf16
// values with one OR, and the products drop the 128 again through the group's activation sum
constexpr uint16_t BF16_128 = 0x4300;
constexpr int PREFETCH = 4096;  // bytes ahead of the codes being decoded

inline float bf16_to_float(uint16_t v) {
  uint32_t b = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// the activations as bf16 rows, zero-padded to a whole number of tiles, and each group's sum of them (where the
// product takes an offset or the mins off through them; empty otherwise)
struct Activations {
  torch::Tensor bf16;
  std::vector<float> sums;
};

Activations prepare(const torch::Tensor& x, int64_t rows_padded, int group, bool sums) {
  const int64_t M = x.size(0), K = x.size(1), G = K / group;
  Activations a{torch::zeros({rows_padded, K}, torch::kBFloat16), std::vector<float>(sums ? M * G : 0)};
  a.bf16.narrow(0, 0, M).copy_(x);
  if (!sums) return a;
  const uint16_t* xb = reinterpret_cast<const uint16_t*>(a.bf16.data_ptr());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      float s = 0.f;
      for (int k = 0; k < group; ++k) s += bf16_to_float(xb[m * K + g * group + k]);
      a.sums[m * G + g] = s;
    }
  return a;
}

// rows per tile: all of them up to 16, else 16 with the activations padded by zero rows
inline int64_t tile_rows(int64_t M) { return M <= 16 ? std::max<int64_t>(M, 1) : 16; }

// cbuf[gi] = the tile's activation rows (from x, a row every K inputs; `group` inputs for group gi) times B tile
// gi (group / 2 pairs of k x 16 columns at b + gi * group * 16), for gi < ng (even), the first `rows` rows.
#ifndef REST_AVX512
// two tile sets in turn, tiles 0-2 and 3-5 (C, A, B), so one pair's loads overlap the other's product (every row
// of the tile: padding rows are zeros)
inline void group_products(const uint16_t* x, int64_t K, const uint16_t* b, int group, int ng, float (*cbuf)[256],
                           int64_t /*rows*/) {
  for (int gi = 0; gi < ng; gi += 2) {
    _tile_zero(0); _tile_loadd(1, x + gi * group, K * 2); _tile_loadd(2, b + gi * group * 16, 64);
    _tile_dpbf16ps(0, 1, 2);
    _tile_zero(3); _tile_loadd(4, x + (gi + 1) * group, K * 2); _tile_loadd(5, b + (gi + 1) * group * 16, 64);
    _tile_dpbf16ps(3, 4, 5);
    _tile_stored(0, cbuf[gi], 64);
    _tile_stored(3, cbuf[gi + 1], 64);
  }
}
#endif

// Q6_K's codes (0..63) of the four pairs of k of chunk h (Q6Blocks' layout: the low four bits from two chunks
// of `lo`, the top two from one chunk of `hi`), 16 columns x 2 per register, with the prefetch ahead
inline void q6k_codes(const uint8_t* ls, const uint8_t* hs, int h, __m512i (&q)[4]) {
  const __m512i low4 = _mm512_set1_epi16(15), low2 = _mm512_set1_epi16(3);
  _mm_prefetch(reinterpret_cast<const char*>(ls + 64 * h + PREFETCH), _MM_HINT_T0);
  if ((h & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(hs + 32 * h + PREFETCH / 2), _MM_HINT_T0);
  const __m512i l0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ls + 64 * h)));
  const __m512i l1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ls + 64 * h + 32)));
  const __m512i hb = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hs + 32 * h)));
  q[0] = _mm512_or_si512(_mm512_and_si512(l0, low4), _mm512_slli_epi16(_mm512_and_si512(hb, low2), 4));
  q[1] = _mm512_or_si512(_mm512_srli_epi16(l0, 4), _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hb, 2), low2), 4));
  q[2] = _mm512_or_si512(_mm512_and_si512(l1, low4), _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hb, 4), low2), 4));
  q[3] = _mm512_or_si512(_mm512_srli_epi16(l1, 4), _mm512_slli_epi16(_mm512_srli_epi16(hb, 6), 4));
}

// d times a column block's 16 scales (Q4_K's 6-bit scales and mins unsigned, Q6_K's signed), per column in fp32
inline __m512 scaled(__m512 d, const uint8_t* s) {
  return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)))));
}
inline __m512 scaled(__m512 d, const int8_t* s) {
  return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)))));
}

// what every product starts with: the tiles granted, the row tiling, the activations and the output
struct Product {
  int64_t M, TR, Mp;  // rows, rows per tile, rows padded to whole tiles
  int group;          // inputs a tile product takes (a scale's group of weights)
  Activations act;
  torch::Tensor out;  // [M, N] fp32
  const uint16_t* x() const { return reinterpret_cast<const uint16_t*>(act.bf16.data_ptr()); }
};

Product start(const char* name, const torch::Tensor& x, int64_t N, int group, bool sums) {
  TORCH_CHECK(tiles_permitted(), name, ": the kernel refused AMX tile state");
  const int64_t M = x.size(0), TR = tile_rows(M), Mp = (M + TR - 1) / TR * TR;
  return Product{M, TR, Mp, group, prepare(x, Mp, group, sums), torch::empty({M, N}, torch::kFloat32)};
}

// body(nb, tot) for every block nb of 16 of out's columns ([M, N] fp32), on at::parallel_for's threads with the
// tiles configured for `rows` rows and `group` inputs a product; tot (Mp x 16 fp32) starts at zero for each
// block and its first M rows are the block's output columns
template <class Body>
void column_blocks(const torch::Tensor& out_t, int64_t M, int64_t Mp, int64_t rows, int group, Body body) {
  const int64_t N = out_t.size(1), NB = N / 16;
  float* out = out_t.data_ptr<float>();
  at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) {
#ifndef REST_AVX512
    TileConfig cfg;
    for (int t : {0, 3}) { cfg.rows[t] = rows; cfg.colsb[t] = 64; }         // C: rows x 16 fp32
    for (int t : {1, 4}) { cfg.rows[t] = rows; cfg.colsb[t] = 2 * group; }  // A: rows x group bf16
    for (int t : {2, 5}) { cfg.rows[t] = group / 2; cfg.colsb[t] = 64; }    // B: group/2 pairs of k x 16 columns
    _tile_loadconfig(&cfg);
#endif
    std::vector<float> tot(Mp * 16);
    for (int64_t nb = b0; nb < b1; ++nb) {
      std::fill(tot.begin(), tot.end(), 0.f);
      body(nb, tot.data());
      for (int64_t m = 0; m < M; ++m) std::memcpy(out + m * N + nb * 16, tot.data() + m * 16, 64);
    }
#ifndef REST_AVX512
    _tile_release();
#endif
  });
}

template <class Body>
void column_blocks(const Product& p, Body body) { column_blocks(p.out, p.M, p.Mp, p.TR, p.group, body); }


#ifdef REST_AVX512
// 32 bf16 values for a permute to decode codes with: entry i is start + i, or start + (i & 15) with `wrap16`
// (a nibble decodes then with no mask: the index's fifth bit does not matter)
inline __m512i bf16_table(int start, bool wrap16) {
  alignas(64) uint16_t t[32];
  for (int i = 0; i < 32; ++i) {
    const float f = float(start + (wrap16 ? (i & 15) : i));
    uint32_t b;
    std::memcpy(&b, &f, 4);
    t[i] = uint16_t(b >> 16);  // exact: small integers
  }
  return _mm512_load_si512(t);
}

// dot products of 16 columns with a row's 4*N activations (x[4j..4j+1] with W[2j], x[4j+2..4j+3] with W[2j+1]):
// two VDPBF16PS chains, even and odd pairs, each pair ascending, then their sum: the same operations for every
// row whatever the number of rows, so a row gets the same bits alone and in a tree. The activation pair is the
// instruction's memory operand, broadcast ({1to16}): GCC does not fold the intrinsics' broadcast into it, and the
// separate broadcast made a tree's products 1.09-1.17x slower on a Zen4 EPYC (docs/cpu.md). Products commute
// exactly (bf16 x bf16 in fp32), so the swapped operands give the same bits.
template <int N>
inline __m512 pair_dots(const uint16_t* x, const __m512i* W) {
  __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
  for (int j = 0; j < N; ++j) {
    asm("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(a) : "v"(W[2 * j]), "m"(*reinterpret_cast<const int32_t*>(x + 4 * j)));
    asm("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(b) : "v"(W[2 * j + 1]), "m"(*reinterpret_cast<const int32_t*>(x + 4 * j + 2)));
  }
  return _mm512_add_ps(a, b);
}
#endif


#ifdef REST_VNNI
// The VNNI build (REST_VNNI, on top of REST_AVX512): every format takes int8 activations and VPDPBUSD (64
// products an instruction, against VDPBF16PS's 32), llama.cpp's idea with a scale per 32 inputs rather than per
// 256. A row's 32 inputs g become q = round(x * 127 / amax) (ties to even) with the scale amax / 127; the codes'
// dot products with q are integers, exact in any order, and every float operation after them is per element in
// a fixed order: a row gets the same bits alone and in a tree, by construction. What changes against the bf16
// builds is the activations' rounding (7 bits against the group's largest, bf16's 8 bits against each value's
// own): int4w's quality is measured again for this build (rest_lsp/model/precision.py).
struct Int8Rows {
  std::vector<int8_t> q;      // [M, K]
  std::vector<float> scale;   // [M, K/32]
  std::vector<float> sum;     // [M, K/32] the inputs' own fp32 sum (Q4_K's mins), with `float_sums`
  std::vector<int32_t> qsum;  // [M, K/16] the sum of q by 16 (the offsets of Q6_K, Q5_0 and Q8_0), without
};

// x's rows rounded to int8 by 32 inputs, with the sums its format takes off: the inputs' own (Q4_K) or q's
Int8Rows int8_rows(const torch::Tensor& x, bool float_sums) {
  const torch::Tensor x32 = x.to(torch::kFloat32).contiguous();
  const int64_t M = x32.size(0), K = x32.size(1), G = K / 32;
  Int8Rows a{std::vector<int8_t>(M * K), std::vector<float>(M * G), std::vector<float>(float_sums ? M * G : 0),
             std::vector<int32_t>(float_sums ? 0 : M * K / 16)};
  const float* xp = x32.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      const float* v = xp + m * K + g * 32;
      const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a.q.data() + m * K + g * 32), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a.q.data() + m * K + g * 32 + 16), _mm512_cvtsepi32_epi8(q1));
      a.scale[m * G + g] = amax / 127.f;
      if (float_sums) {
        a.sum[m * G + g] = _mm512_reduce_add_ps(_mm512_add_ps(v0, v1));
      } else {
        a.qsum[m * 2 * G + 2 * g] = _mm512_reduce_add_epi32(q0);
        a.qsum[m * 2 * G + 2 * g + 1] = _mm512_reduce_add_epi32(q1);
      }
    }
  return a;
}

// codes of 4 k for 16 columns, a column's 4 bytes in a 32-bit lane (VPDPBUSD's unsigned operand), from a
// chunk of the nibble layout (byte 2n: k0 | k2 << 4, byte 2n + 1: k1 | k3 << 4 for column n)
inline __m512i nibble_lanes(const uint8_t* chunk) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk)));
  return _mm512_or_si512(_mm512_and_si512(w, _mm512_set1_epi32(0x0F0F)),
                         _mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0xF0F0)), 12));
}

// sum over j < N of W[j] . x[4j..4j+3] per 32-bit lane (two chains, integer: exact in any order), the four
// activations the instruction's broadcast memory operand
template <int N>
inline __m512i quad_dots(const int8_t* x, const __m512i* W) {
  __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
  const int32_t* xv = reinterpret_cast<const int32_t*>(x);
  for (int j = 0; j < N; j += 2) {
    asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(a) : "v"(W[j]), "m"(xv[j]));
    asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(b) : "v"(W[j + 1]), "m"(xv[j + 1]));
  }
  return _mm512_add_epi32(a, b);
}

// column_blocks for a product with no Product (no bf16 activations, no tiles): out [M, 16 NB] fp32
template <class Body>
torch::Tensor vnni_blocks(int64_t M, int64_t NB, Body body) {
  torch::Tensor out = torch::empty({M, NB * 16}, torch::kFloat32);
  column_blocks(out, M, M, M, 0, body);
  return out;
}

// Q4_K: y = sum over groups of 32 of d*sc * scale * dot(q, x8) - dmin*m * sum(x)
torch::Tensor q4k_vnni(const torch::Tensor& x, const uint8_t* cp, const float* dp, const uint8_t* sp, int64_t NB) {
  const int64_t M = x.size(0), K = x.size(1), G = K / 32, SB = K / 256;
  const Int8Rows a = int8_rows(x, true);
  return vnni_blocks(M, NB, [&](int64_t nb, float* tot) {
    const uint8_t* q = cp + nb * (K / 4) * 32;
    for (int64_t sb = 0; sb < SB; ++sb) {
      const float* f = dp + (nb * SB + sb) * 32;
      const __m512 d = _mm512_loadu_ps(f), dmin = _mm512_loadu_ps(f + 16);
      for (int gi = 0; gi < 8; ++gi) {
        __m512i W[8];
        for (int j = 0; j < 8; ++j) {
          const uint8_t* c = q + (sb * 64 + gi * 8 + j) * 32;
          if ((j & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(c + PREFETCH), _MM_HINT_T0);
          W[j] = nibble_lanes(c);
        }
        const uint8_t* s = sp + (nb * G + sb * 8 + gi) * 32;
        const __m512 S = scaled(d, s);
        const __m512 L = scaled(dmin, s + 16);
        const int64_t g = sb * 8 + gi;
        for (int64_t r = 0; r < M; ++r) {
          const __m512 dot = _mm512_cvtepi32_ps(quad_dots<8>(a.q.data() + r * K + g * 32, W));
          float* t = tot + r * 16;
          const __m512 v = _mm512_fmadd_ps(_mm512_mul_ps(S, _mm512_set1_ps(a.scale[r * G + g])), dot, _mm512_loadu_ps(t));
          _mm512_storeu_ps(t, _mm512_fnmadd_ps(L, _mm512_set1_ps(a.sum[r * G + g]), v));
        }
      }
    }
  });
}

// Q6_K: y = sum over groups of 16 of d*sc * scale * (dot(q, x8) - 32 * sum(x8)), q = lo | hi << 4 in 0..63;
// a group of 32 activations (one scale) covers two of the weights' groups
torch::Tensor q6k_vnni(const torch::Tensor& x, const uint8_t* lp, const uint8_t* hp, const float* dp, const int8_t* sp,
                       int64_t NB) {
  const int64_t M = x.size(0), K = x.size(1), G = K / 16, SB = K / 256;
  const Int8Rows a = int8_rows(x, false);
  const __m512i two = _mm512_set1_epi32(0x0303);
  return vnni_blocks(M, NB, [&](int64_t nb, float* tot) {
    for (int64_t sb = 0; sb < SB; ++sb) {
      const uint8_t* ls = lp + (nb * (K / 4) + sb * 64) * 32;
      const uint8_t* hs = hp + (nb * (K / 8) + sb * 32) * 32;
      const __m512 d = _mm512_loadu_ps(dp + (nb * SB + sb) * 16);
      for (int gi = 0; gi < 8; ++gi) {  // 32 inputs: chunks 8gi..8gi+7 of the super-block
        __m512i W[8];
        for (int j = 0; j < 8; ++j) {
          const int c = gi * 8 + j;  // the chunk: k = 4c..4c+3; its top bits: pairs 2c, 2c + 1 of hi chunk c / 2
          if ((j & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(ls + c * 32 + PREFETCH), _MM_HINT_T0);
          const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hs + (c / 2) * 32)));
          const int v = 4 * (c % 2);  // bits of pair 2c in a byte
          const __m512i top = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(h, v), two),
                                              _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, v + 2), two), 16));
          W[j] = _mm512_or_si512(nibble_lanes(ls + c * 32), _mm512_slli_epi32(top, 4));
        }
        const int8_t* s = sp + (nb * G + sb * 16 + 2 * gi) * 16;
        const __m512 SA = scaled(d, s);
        const __m512 SB_ = scaled(d, s + 16);
        const int64_t g = sb * 8 + gi;  // the activations' group of 32
        for (int64_t r = 0; r < M; ++r) {
          const int8_t* xr = a.q.data() + r * K + g * 32;
          const __m512i dA = _mm512_sub_epi32(quad_dots<4>(xr, W), _mm512_set1_epi32(32 * a.qsum[r * G + 2 * g]));
          const __m512i dB = _mm512_sub_epi32(quad_dots<4>(xr + 16, W + 4), _mm512_set1_epi32(32 * a.qsum[r * G + 2 * g + 1]));
          const __m512 sc = _mm512_set1_ps(a.scale[r * (K / 32) + g]);
          float* t = tot + r * 16;
          const __m512 v = _mm512_fmadd_ps(_mm512_mul_ps(SA, sc), _mm512_cvtepi32_ps(dA), _mm512_loadu_ps(t));
          _mm512_storeu_ps(t, _mm512_fmadd_ps(_mm512_mul_ps(SB_, sc), _mm512_cvtepi32_ps(dB), v));
        }
      }
    }
  });
}

// Q5_0 and Q8_0: y = sum over groups of 32 of d * scale * (dot(u, x8) - off * sum(x8)), u = q (Q5_0, 0..31, off
// 16) or q + 128 (Q8_0, the sign bit flipped: 0..255, off 128), so that the codes are VPDPBUSD's unsigned operand
template <bool Q8>
torch::Tensor q32_vnni(const torch::Tensor& x, const uint8_t* lp, const uint8_t* hp, const float* dp, int64_t NB) {
  const int64_t M = x.size(0), K = x.size(1), G = K / 32;
  const Int8Rows a = int8_rows(x, false);
  const int32_t off = Q8 ? 128 : 16;
  // Q8_0's chunks p and p + 1 (k = 2p, 2p + 1 and 2p + 2, 2p + 3 of 16 columns) interleaved by 16 bits: a
  // column's four k in one lane
  alignas(64) uint16_t interleave[32];
  for (int i = 0; i < 32; ++i) interleave[i] = uint16_t(i % 2 ? 16 + i / 2 : i / 2);
  const __m512i order = _mm512_load_si512(interleave), sign = _mm512_set1_epi32(int32_t(0x80808080u));
  const __m512i bit0 = _mm512_set1_epi32(0x01010101), even = _mm512_set1_epi32(0x5555);
  return vnni_blocks(M, NB, [&](int64_t nb, float* tot) {
    const uint8_t* lb = lp + nb * (Q8 ? K / 2 : K / 4) * 32;
    for (int64_t g = 0; g < G; ++g) {
      __m512i W[8];
      if (Q8) {
        const uint8_t* ls = lb + g * 16 * 32;
        for (int j = 0; j < 8; ++j) {
          _mm_prefetch(reinterpret_cast<const char*>(ls + 64 * j + PREFETCH), _MM_HINT_T0);
          W[j] = _mm512_xor_si512(_mm512_permutexvar_epi16(order, _mm512_loadu_si512(ls + 64 * j)), sign);
        }
      } else {
        const uint8_t* ls = lb + g * 8 * 32;
        const uint8_t* hs = hp + (nb * (K / 16) + g * 2) * 32;
        _mm_prefetch(reinterpret_cast<const char*>(hs + PREFETCH / 4), _MM_HINT_T0);
        for (int hh = 0; hh < 2; ++hh) {
          // lane n of hi chunk hh: bit v of byte 2n (k even) and of byte 2n + 1 (k odd) the top bit of pair 8hh + v;
          // rearranged so that bits 2cc, 8 + 2cc, 16 + 2cc, 24 + 2cc are those of k = 0..3 of nibble chunk cc
          const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hs + 32 * hh)));
          const __m512i tops = _mm512_or_si512(_mm512_and_si512(h, even),
                                               _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 1), even), 16));
          for (int cc = 0; cc < 4; ++cc) {
            const int c = 4 * hh + cc;
            if ((c & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(ls + 32 * c + PREFETCH), _MM_HINT_T0);
            const __m512i top = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(tops, 2 * cc), bit0), 4);
            W[c] = _mm512_or_si512(nibble_lanes(ls + 32 * c), top);
          }
        }
      }
      const __m512 d = _mm512_loadu_ps(dp + (nb * G + g) * 16);
      for (int64_t r = 0; r < M; ++r) {
        const int32_t xs = a.qsum[r * 2 * G + 2 * g] + a.qsum[r * 2 * G + 2 * g + 1];
        const __m512i dot = _mm512_sub_epi32(quad_dots<8>(a.q.data() + r * K + g * 32, W), _mm512_set1_epi32(off * xs));
        float* t = tot + r * 16;
        _mm512_storeu_ps(t, _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(a.scale[r * G + g])),
                                            _mm512_cvtepi32_ps(dot), _mm512_loadu_ps(t)));
      }
    }
  });
}
#endif
}  // namespace

bool q4k_amx_ready() { return tiles_permitted(); }

torch::Tensor q4k_amx_mm(torch::Tensor x, torch::Tensor codes, torch::Tensor dd, torch::Tensor sm) {
  TORCH_CHECK(x.dim() == 2 && codes.dim() == 3 && codes.size(2) == 32, "q4k_amx_mm: shapes");
  TORCH_CHECK(codes.is_contiguous() && dd.is_contiguous() && sm.is_contiguous(), "q4k_amx_mm: contiguous weights");
  const int64_t K = x.size(1), NB = codes.size(0), G = K / 32, SB = K / 256;
  TORCH_CHECK(K % 256 == 0 && codes.size(1) == K / 4, "q4k_amx_mm: width");
#ifdef REST_VNNI
  return q4k_vnni(x, codes.data_ptr<uint8_t>(), dd.data_ptr<float>(), sm.data_ptr<uint8_t>(), NB);
#else  // the bf16 builds
  // each group's sum of the bf16 activations: the mins, and the 128 every decoded code carries
  const Product p = start("q4k_amx_mm", x, NB * 16, 32, true);
  const int64_t M = p.M, TR = p.TR, Mp = p.Mp;
  const uint16_t* xbp = p.x();
  const std::vector<float>& xsum = p.act.sums;
  if (M == 0) return p.out;
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const float* dp = dd.data_ptr<float>();
  const uint8_t* sp = sm.data_ptr<uint8_t>();
#ifdef REST_AVX512
  // the weights decoded into registers, a group (16 pairs of k) at a time, and used there by every row
  const __m512i nibbles = bf16_table(0, true);
  column_blocks(p, [&](int64_t nb, float* tot) {
    const uint8_t* q = cp + nb * (K / 4) * 32;
    for (int64_t sb = 0; sb < SB; ++sb) {
      const uint8_t* qs = q + sb * 64 * 32;
      const float* f = dp + (nb * SB + sb) * 32;
      const __m512 d = _mm512_loadu_ps(f), dmin = _mm512_loadu_ps(f + 16);
      for (int gi = 0; gi < 8; ++gi) {
        __m512i W[16];
        for (int j = 0; j < 8; ++j) {
          const uint8_t* c = qs + (gi * 8 + j) * 32;
          if ((j & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(c + PREFETCH), _MM_HINT_T0);
          const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)));
          W[2 * j] = _mm512_permutexvar_epi16(w, nibbles);  // the index's fifth bit is ignored by the table
          W[2 * j + 1] = _mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4), nibbles);
        }
        const uint8_t* s = sp + (nb * G + sb * 8 + gi) * 32;
        const __m512 S = scaled(d, s);
        const __m512 L = scaled(dmin, s + 16);
        for (int64_t r = 0; r < M; ++r) {
          const uint16_t* xr = xbp + r * K + sb * 256 + gi * 32;
          const __m512 dot = pair_dots<8>(xr, W);
          const __m512 xs = _mm512_set1_ps(xsum[r * G + sb * 8 + gi]);
          float* t = tot + r * 16;
          _mm512_storeu_ps(t, _mm512_fnmadd_ps(L, xs, _mm512_fmadd_ps(S, dot, _mm512_loadu_ps(t))));
        }
      }
    }
  });
#else
  const __m512i low4 = _mm512_set1_epi16(15), bias128 = _mm512_set1_epi16(BF16_128);
  const __m512 c128 = _mm512_set1_ps(128.f);
  column_blocks(p, [&](int64_t nb, float* tot) {
    // a super-block's eight B tiles decoded before any is loaded: a tile load waits for the stores it reads
    alignas(64) uint16_t wbuf[8][16 * 32];
    alignas(64) float cbuf[8][16 * 16];
    const uint8_t* q = cp + nb * (K / 4) * 32;
    for (int64_t sb = 0; sb < SB; ++sb) {
      const uint8_t* qs = q + sb * 64 * 32;
      for (int c = 0; c < 64; ++c) {
        if ((c & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(qs + c * 32 + PREFETCH), _MM_HINT_T0);
        __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + c * 32)));
        _mm512_store_si512(&wbuf[c >> 3][64 * (c & 7)], _mm512_or_si512(_mm512_and_si512(w, low4), bias128));
        _mm512_store_si512(&wbuf[c >> 3][64 * (c & 7) + 32], _mm512_or_si512(_mm512_srli_epi16(w, 4), bias128));
      }
      const float* f = dp + (nb * SB + sb) * 32;
      const __m512 d = _mm512_loadu_ps(f), dmin = _mm512_loadu_ps(f + 16);
      for (int64_t m0 = 0; m0 < Mp; m0 += TR) {
        const uint16_t* xa = xbp + m0 * K + sb * 256;
        const int64_t rows = std::min<int64_t>(TR, M - m0);
        group_products(xa, K, wbuf[0], 32, 8, cbuf, rows);
        __m512 S[8], L[8];
        for (int gi = 0; gi < 8; ++gi) {
          const uint8_t* s = sp + (nb * G + sb * 8 + gi) * 32;
          S[gi] = scaled(d, s);
          L[gi] = scaled(dmin, s + 16);
        }
        // row by row with the sum in a register: each element's operations and their order are those of
        // group by group (g ascending), with one load and one store of the total a row instead of eight
        for (int64_t r = 0; r < rows; ++r) {
          float* t = tot + (m0 + r) * 16;
          const float* xr = xsum.data() + (m0 + r) * G + sb * 8;
          __m512 v = _mm512_loadu_ps(t);
          for (int gi = 0; gi < 8; ++gi) {
            const __m512 xs = _mm512_set1_ps(xr[gi]);
            const __m512 dot = _mm512_fnmadd_ps(c128, xs, _mm512_load_ps(cbuf[gi] + 16 * r));  // q, not 128 + q
            v = _mm512_fnmadd_ps(L[gi], xs, _mm512_fmadd_ps(S[gi], dot, v));
          }
          _mm512_storeu_ps(t, v);
        }
      }
    }
  });
#endif
  return p.out;
#endif  // REST_VNNI
}

// Q6_K: lo [NB, K/4, 32] uint8 (the low four bits, laid out as Q4_K's codes), hi [NB, K/8, 32] uint8 (byte j of
// chunk h: the top two bits of lane j for the k-pairs 4h + v at bits 2v), dd [NB, K/256, 16] fp32 (d), sc
// [NB, K/16, 16] int8 (a scale per 16 weights). weight = d*sc*(q - 32), q = lo | hi << 4 in 0..63; one tile
// product per group of 16, y = sum over groups of d*sc*dot(q - 32, x).
torch::Tensor q6k_amx_mm(torch::Tensor x, torch::Tensor lo, torch::Tensor hi, torch::Tensor dd, torch::Tensor sc) {
  TORCH_CHECK(x.dim() == 2 && lo.dim() == 3 && lo.size(2) == 32 && hi.size(2) == 32, "q6k_amx_mm: shapes");
  TORCH_CHECK(lo.is_contiguous() && hi.is_contiguous() && dd.is_contiguous() && sc.is_contiguous(),
              "q6k_amx_mm: contiguous weights");
  const int64_t K = x.size(1), NB = lo.size(0), G = K / 16, SB = K / 256;
  TORCH_CHECK(K % 256 == 0 && lo.size(1) == K / 4 && hi.size(1) == K / 8, "q6k_amx_mm: width");
#ifdef REST_VNNI
  return q6k_vnni(x, lo.data_ptr<uint8_t>(), hi.data_ptr<uint8_t>(), dd.data_ptr<float>(), sc.data_ptr<int8_t>(), NB);
#else  // the bf16 builds
  // tiles: q - 32 = (128 + q) - 160, the sums take the 160 off; the AVX-512 body decodes q - 32 itself
  const Product p = start("q6k_amx_mm", x, NB * 16, 16, !AVX512_BUILD);
  const int64_t M = p.M, TR = p.TR, Mp = p.Mp;
  const uint16_t* xbp = p.x();
  const std::vector<float>& xsum = p.act.sums;
  if (M == 0) return p.out;
  const uint8_t* lp = lo.data_ptr<uint8_t>();
  const uint8_t* hp = hi.data_ptr<uint8_t>();
  const float* dp = dd.data_ptr<float>();
  const int8_t* sp = sc.data_ptr<int8_t>();
#ifdef REST_AVX512
  // q - 32 decoded to bf16 by one two-table permute, a group (8 pairs of k) at a time, into registers
  const __m512i below = bf16_table(-32, false), above = bf16_table(0, false);  // q < 32, q >= 32
  column_blocks(p, [&](int64_t nb, float* tot) {
    for (int64_t sb = 0; sb < SB; ++sb) {
      const uint8_t* ls = lp + (nb * (K / 4) + sb * 64) * 32;
      const uint8_t* hs = hp + (nb * (K / 8) + sb * 32) * 32;
      const __m512 d = _mm512_loadu_ps(dp + (nb * SB + sb) * 16);
      for (int gi = 0; gi < 16; ++gi) {
        __m512i W[8];
        for (int hh = 0; hh < 2; ++hh) {
          const int h = 2 * gi + hh;
          __m512i q[4];
          q6k_codes(ls, hs, h, q);
          for (int v = 0; v < 4; ++v) W[4 * hh + v] = _mm512_permutex2var_epi16(below, q[v], above);
        }
        const __m512 S = scaled(d, sp + (nb * G + sb * 16 + gi) * 16);
        for (int64_t r = 0; r < M; ++r) {
          const __m512 dot = pair_dots<4>(xbp + r * K + sb * 256 + gi * 16, W);
          float* t = tot + r * 16;
          _mm512_storeu_ps(t, _mm512_fmadd_ps(S, dot, _mm512_loadu_ps(t)));
        }
      }
    }
  });
#else
  const __m512i bias128 = _mm512_set1_epi16(BF16_128);
  const __m512 c160 = _mm512_set1_ps(160.f);
  column_blocks(p, [&](int64_t nb, float* tot) {
    alignas(64) uint16_t wbuf[128][32];  // a super-block's 128 pairs of k, decoded
    alignas(64) float cbuf[16][16 * 16];
    for (int64_t sb = 0; sb < SB; ++sb) {
      const uint8_t* ls = lp + (nb * (K / 4) + sb * 64) * 32;
      const uint8_t* hs = hp + (nb * (K / 8) + sb * 32) * 32;
      for (int h = 0; h < 32; ++h) {
        __m512i q[4];
        q6k_codes(ls, hs, h, q);
        for (int v = 0; v < 4; ++v) _mm512_store_si512(wbuf[4 * h + v], _mm512_or_si512(q[v], bias128));
      }
      const __m512 d = _mm512_loadu_ps(dp + (nb * SB + sb) * 16);
      for (int64_t m0 = 0; m0 < Mp; m0 += TR) {
        const uint16_t* xa = xbp + m0 * K + sb * 256;
        const int64_t rows = std::min<int64_t>(TR, M - m0);
        group_products(xa, K, wbuf[0], 16, 16, cbuf, rows);
        __m512 S[16];
        for (int gi = 0; gi < 16; ++gi) {
          const int8_t* s = sp + (nb * G + sb * 16 + gi) * 16;
          S[gi] = scaled(d, s);
        }
        for (int64_t r = 0; r < rows; ++r) {  // the total in a register, as in q4k_amx_mm
          float* t = tot + (m0 + r) * 16;
          const float* xr = xsum.data() + (m0 + r) * G + sb * 16;
          __m512 v = _mm512_loadu_ps(t);
          for (int gi = 0; gi < 16; ++gi) {
            const __m512 dot = _mm512_fnmadd_ps(c160, _mm512_set1_ps(xr[gi]), _mm512_load_ps(cbuf[gi] + 16 * r));
            v = _mm512_fmadd_ps(S[gi], dot, v);  // q - 32
          }
          _mm512_storeu_ps(t, v);
        }
      }
    }
  });
#endif
  return p.out;
#endif  // REST_VNNI
}

// Q5_0 and Q8_0: 32 weights a scale, weight = d*(q - 16) (Q5_0, q 0..31) or d*q (Q8_0, q -128..127); dd
// [NB, K/32, 16] fp32. Q5_0: lo [NB, K/4, 32] (the low four bits, laid out as Q4_K's codes), hi [NB, K/16, 32]
// (byte j of chunk h, bit v: the top bit of pair 8h + v, lane j); 128 + q by one OR, 144 taken off through the
// sums. Q8_0: lo [NB, K/2, 32] int8 (byte j of chunk p: lane j of pair p), converted to bf16 exactly.
template <bool Q8>
torch::Tensor q32_amx_mm(torch::Tensor x, torch::Tensor lo, torch::Tensor hi, torch::Tensor dd) {
  TORCH_CHECK(x.dim() == 2 && lo.dim() == 3 && lo.size(2) == 32, "q32_amx_mm: shapes");
  TORCH_CHECK(lo.is_contiguous() && hi.is_contiguous() && dd.is_contiguous(), "q32_amx_mm: contiguous weights");
  const int64_t K = x.size(1), NB = lo.size(0), G = K / 32;
  TORCH_CHECK(K % 64 == 0 && lo.size(1) == (Q8 ? K / 2 : K / 4) && (Q8 || hi.size(1) == K / 16), "q32_amx_mm: width");
#ifdef REST_VNNI
  return q32_vnni<Q8>(x, lo.data_ptr<uint8_t>(), Q8 ? nullptr : hi.data_ptr<uint8_t>(), dd.data_ptr<float>(), NB);
#else  // the bf16 builds
  const Product p = start("q32_amx_mm", x, NB * 16, 32, !AVX512_BUILD);  // tiles: the 144 of Q5_0
  const int64_t M = p.M, TR = p.TR, Mp = p.Mp;
  const uint16_t* xbp = p.x();
  const std::vector<float>& xsum = p.act.sums;
  if (M == 0) return p.out;
  const uint8_t* lp = lo.data_ptr<uint8_t>();
  const uint8_t* hp = Q8 ? nullptr : hi.data_ptr<uint8_t>();
  const float* dp = dd.data_ptr<float>();
  const int64_t chunk_bytes = Q8 ? 16 * 32 : 8 * 32;  // a group's codes: 16 pairs of bytes, or 8 chunks of nibbles
#ifdef REST_AVX512
  // a group's 16 pairs of k decoded into registers as q - 16 (Q5_0: one permute of the five-bit code) or q
  // (Q8_0: converted), exact in bf16, and used there by every row: no offset to take off through the sums
  const __m512i low4 = _mm512_set1_epi16(15), top = _mm512_set1_epi16(16);
  const __m512i centred = bf16_table(-16, false);
  column_blocks(p, [&](int64_t nb, float* tot) {
    const uint8_t* lb = lp + nb * (Q8 ? K / 2 : K / 4) * 32;
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* ls = lb + g * chunk_bytes;
      for (int64_t l = 0; l < chunk_bytes; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(ls + PREFETCH + l), _MM_HINT_T0);
      __m512i W[16];
      if (Q8) {
        for (int q = 0; q < 16; ++q) {
          const __m128i* b = reinterpret_cast<const __m128i*>(ls + 32 * q);
          const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(b)));
          const __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(b + 1)));
          W[q] = (__m512i)_mm512_cvtne2ps_pbh(f1, f0);
        }
      } else {
        const uint8_t* hs = hp + (nb * (K / 16) + g * 2) * 32;
        _mm_prefetch(reinterpret_cast<const char*>(hs + PREFETCH / 4), _MM_HINT_T0);
        for (int hh = 0; hh < 2; ++hh) {
          // bit v of a lane's byte moved to bit 4 + v: (hb >> v) & 16 is then pair v's top bit in place
          const __m512i hb = _mm512_slli_epi16(
              _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hs + 32 * hh))), 4);
          for (int cc = 0; cc < 4; ++cc) {
            const __m512i w = _mm512_cvtepu8_epi16(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ls + 32 * (4 * hh + cc))));
            const __m512i t0 = _mm512_and_si512(_mm512_srli_epi16(hb, 2 * cc), top);
            const __m512i t1 = _mm512_and_si512(_mm512_srli_epi16(hb, 2 * cc + 1), top);
            W[2 * (4 * hh + cc)] = _mm512_permutexvar_epi16(_mm512_or_si512(_mm512_and_si512(w, low4), t0), centred);
            W[2 * (4 * hh + cc) + 1] = _mm512_permutexvar_epi16(_mm512_or_si512(_mm512_srli_epi16(w, 4), t1), centred);
          }
        }
      }
      const __m512 S = _mm512_loadu_ps(dp + (nb * G + g) * 16);
      for (int64_t r = 0; r < M; ++r) {
        const __m512 dot = pair_dots<8>(xbp + r * K + g * 32, W);
        float* t = tot + r * 16;
        _mm512_storeu_ps(t, _mm512_fmadd_ps(S, dot, _mm512_loadu_ps(t)));
      }
    }
  });
  (void)TR; (void)Mp; (void)xsum;
#else
  const __m512i low4 = _mm512_set1_epi16(15), one = _mm512_set1_epi16(1), bias128 = _mm512_set1_epi16(BF16_128);
  const __m512 c144 = _mm512_set1_ps(144.f);
  column_blocks(p, [&](int64_t nb, float* tot) {
    alignas(64) uint16_t wbuf[8][16 * 32];
    alignas(64) float cbuf[8][16 * 16];
    for (int64_t g0 = 0; g0 < G; g0 += 8) {
      const int ng = int(std::min<int64_t>(8, G - g0));
      for (int gi = 0; gi < ng; ++gi) {
        const uint8_t* ls = lp + nb * (Q8 ? K / 2 : K / 4) * 32 + (g0 + gi) * chunk_bytes;
        for (int64_t l = 0; l < chunk_bytes; l += 64)
          _mm_prefetch(reinterpret_cast<const char*>(ls + PREFETCH + l), _MM_HINT_T0);
        if (Q8) {
          for (int p = 0; p < 16; ++p) {
            const __m128i* b = reinterpret_cast<const __m128i*>(ls + 32 * p);
            const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(b)));
            const __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(b + 1)));
            _mm512_store_si512(&wbuf[gi][32 * p], (__m512i)_mm512_cvtne2ps_pbh(f1, f0));
          }
        } else {
          const uint8_t* hs = hp + (nb * (K / 16) + (g0 + gi) * 2) * 32;
          _mm_prefetch(reinterpret_cast<const char*>(hs + PREFETCH / 4), _MM_HINT_T0);
          for (int hh = 0; hh < 2; ++hh) {
            const __m512i hb = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hs + 32 * hh)));
            for (int cc = 0; cc < 4; ++cc) {
              const int c = 4 * hh + cc;
              const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ls + 32 * c)));
              const __m512i t0 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hb, 2 * cc), one), 4);
              const __m512i t1 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hb, 2 * cc + 1), one), 4);
              _mm512_store_si512(&wbuf[gi][64 * c],
                                 _mm512_or_si512(_mm512_or_si512(_mm512_and_si512(w, low4), t0), bias128));
              _mm512_store_si512(&wbuf[gi][64 * c + 32],
                                 _mm512_or_si512(_mm512_or_si512(_mm512_srli_epi16(w, 4), t1), bias128));
            }
          }
        }
      }
      for (int64_t m0 = 0; m0 < Mp; m0 += TR) {
        const uint16_t* xa = xbp + m0 * K + g0 * 32;
        const int64_t rows = std::min<int64_t>(TR, M - m0);
        group_products(xa, K, wbuf[0], 32, ng, cbuf, rows);
        __m512 S[8];
        for (int gi = 0; gi < ng; ++gi) S[gi] = _mm512_loadu_ps(dp + (nb * G + g0 + gi) * 16);
        for (int64_t r = 0; r < rows; ++r) {  // the total in a register, as in q4k_amx_mm
          float* t = tot + (m0 + r) * 16;
          const float* xr = xsum.data() + (m0 + r) * G + g0;
          __m512 v = _mm512_loadu_ps(t);
          for (int gi = 0; gi < ng; ++gi) {
            __m512 dot = _mm512_load_ps(cbuf[gi] + 16 * r);
            if (!Q8) dot = _mm512_fnmadd_ps(c144, _mm512_set1_ps(xr[gi]), dot);  // q - 16
            v = _mm512_fmadd_ps(S[gi], dot, v);
          }
          _mm512_storeu_ps(t, v);
        }
      }
    }
  });
#endif
  return p.out;
#endif  // REST_VNNI
}

// one product by format (0 Q4_K, 1 Q6_K, 2 Q5_0, 3 Q8_0) with the blocks' tensors in QBlocks/Q6Blocks/Q32Blocks
// order: decode_layer.cpp's layers call the products through it
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
  m.def("q4k_amx_ready", &q4k_amx_ready, "whether the OS grants AMX tile state");
  bind_decode_layer(m);
}
