// The small-group expert GEMM kernels (small_gemm.h) on x86-64: the tiles in AVX2 with FMA and in AVX-512, each
// compiled for its instructions (#pragma GCC target) and chosen at run time, so the binary still runs on any x86-64;
// the loops over tiles and the packing of the weights' slabs and panels are shared, compiled for AVX2 (the AVX-512
// set packs a group's rows and columns and transposes the weights itself).
//
// A tile is R rows by P panels of 16 columns of C, held in registers: the AVX2 tile up to 6 rows of one panel
// (12 ymm registers), the AVX-512 tile up to 12 rows of two panels (24 zmm registers). The reduction streams
// through a packed "a" block (reduction-major, R values per step) and "b" panels (reduction-major, 16 values per
// step; packed, or read in place where B's rows hold them). Each form packs differently:
// - A B (the forward, B the weights K x N): B is taken in slabs of kSlab whole rows, read in memory order, the
//   next slab prefetched while the current one is used (packed into panels for the AVX2 tile; the AVX-512 tile
//   reads whole panels in place); partial sums wait in a buffer between slabs;
// - A B^T (the input gradient, B the weights N x K): 16 P rows of B at a time, contiguous, transposed in registers
//   (8 x 8 blocks in AVX2, 16 x 16 in AVX-512), the next rows prefetched;
// - A^T B (the weight gradient C, K x N, with K large and the reduction over the group's few rows): the small
//   operands are packed once and C is read and written once, each tile's lines prefetched a few tiles ahead.
// Whether a panel's chain runs in C itself or in a buffer finished with alpha and beta is decided panel by panel
// alike in both sets (two panels share a tile only where both are whole), so both give the same bits.
#include "core/backend/cpu/small_gemm.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/backend/cpu/cpu_vectors.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace moe::cpu {

const char* small_gemm_isa_name(SmallGemmIsa isa) { return isa == SmallGemmIsa::Avx512 ? "avx512" : "avx2"; }

#if defined(__x86_64__)

namespace {

constexpr int64_t kW = 16;          // columns of a panel
constexpr int kMaxRows = 12;        // rows of a tile at most, in either set
constexpr int kMaxPanels = 2;       // panels of a tile at most
constexpr int64_t kSlab = 32;       // rows of B per slab in the A B form (docs/bench.md "Weights from memory")
constexpr int64_t kTilesAhead = 8;  // how far ahead, in panels, the A^T B form prefetches C

// Where a tile's chain of sums starts and ends: init (zeros where null) and out, each R rows of 16 P floats,
// their rows ld_init and ld_out floats apart.
struct TileIo {
  const float* init;
  int64_t ld_init;
  float* out;
  int64_t ld_out;
};

// Where a tile's "b" values lie: panel q's 16 values of step k at p + q stride + k ldk (packed: stride a panel's
// size, ldk 16; read in place from a row-major matrix: stride 16, ldk its leading dimension).
struct Panels {
  const float* p;
  int64_t stride, ldk;
};

// out (R x 16 P) = init + the sum over k < K of ap[k] (R values) times panel q's 16 values of step k, one fused
// multiply-add per k in order. The AVX2 tile takes packed panels only.
using TileFn = void (*)(int R, int P, const float* ap, const Panels& b, int64_t K, const TileIo& io);

// Rows [n0, n0 + 16) of B (N x K) transposed into bp (K x 16), zeros past row N: the "b" panel of the A B^T form.
using PackTransposedFn = void (*)(const float* B, int64_t ldb, int64_t K, int64_t n0, int64_t N, float* bp);

// Rows [i0, i0 + R) of A (rows x K) transposed into ap (K x R): the "a" block of the A B and A B^T forms.
using PackRowsFn = void (*)(const float* A, int64_t lda, int64_t K, int64_t i0, int R, float* ap);

// Columns [i0, i0 + R) of A (m x lda) into ap (m x R): the "a" block of the A^T B form.
using PackColumnsFn = void (*)(const float* A, int64_t lda, int64_t m, int64_t i0, int R, float* ap);

// One instruction set's tiles (at most `rows` rows and `panels` panels) and its packing.
struct Kernels {
  int rows, panels;
  TileFn tile;
  PackTransposedFn pack_transposed;
  PackRowsFn pack_rows;
  PackColumnsFn pack_columns;
};

}  // namespace

// ---- AVX-512 tiles ----------------------------------------------------------------------------------------

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")

namespace {

// The accumulators are named registers (an array of them gets spilled to the stack); MOE_Z_EACH applies a
// row's macro to the 12 rows.
#define MOE_Z_EACH(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)
#define MOE_Z_ROW(i)                                                \
  if constexpr (R > i) {                                            \
    const __m512 a = _mm512_set1_ps(ap[k * R + i]);                 \
    c##i##0 = _mm512_fmadd_ps(a, b0, c##i##0);                      \
    if constexpr (P > 1) c##i##1 = _mm512_fmadd_ps(a, b1, c##i##1); \
  }
#define MOE_Z_LOAD(i)                                                              \
  if constexpr (R > i) {                                                           \
    c##i##0 = _mm512_loadu_ps(io.init + i * io.ld_init);                           \
    if constexpr (P > 1) c##i##1 = _mm512_loadu_ps(io.init + i * io.ld_init + kW); \
  }
#define MOE_Z_STORE(i)                                                           \
  if constexpr (R > i) {                                                         \
    _mm512_storeu_ps(io.out + i * io.ld_out, c##i##0);                           \
    if constexpr (P > 1) _mm512_storeu_ps(io.out + i * io.ld_out + kW, c##i##1); \
  }

template <int R, int P>
void tile_z(const float* ap, const Panels& b, int64_t K, const TileIo& io) {
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
         c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00, c80 = c00, c81 = c00,
         c90 = c00, c91 = c00, c100 = c00, c101 = c00, c110 = c00, c111 = c00;
  if (io.init) {
    MOE_Z_EACH(MOE_Z_LOAD)
  }
  const float *bp = b.p, *bq = b.p + b.stride;
  const int64_t ldk = b.ldk;
  for (int64_t k = 0; k < K; ++k) {
    const __m512 b0 = _mm512_loadu_ps(bp + k * ldk), b1 = P > 1 ? _mm512_loadu_ps(bq + k * ldk) : b0;
    MOE_Z_EACH(MOE_Z_ROW)
  }
  MOE_Z_EACH(MOE_Z_STORE)
}
#undef MOE_Z_EACH
#undef MOE_Z_ROW
#undef MOE_Z_LOAD
#undef MOE_Z_STORE

template <int P>
void tile_z_rows(int R, const float* ap, const Panels& b, int64_t K, const TileIo& io) {
  using Fn = void (*)(const float*, const Panels&, int64_t, const TileIo&);
  static constexpr Fn by_rows[kMaxRows] = {tile_z<1, P>, tile_z<2, P>,  tile_z<3, P>,  tile_z<4, P>,
                                           tile_z<5, P>, tile_z<6, P>,  tile_z<7, P>,  tile_z<8, P>,
                                           tile_z<9, P>, tile_z<10, P>, tile_z<11, P>, tile_z<12, P>};
  by_rows[R - 1](ap, b, K, io);
}

void tile_avx512(int R, int P, const float* ap, const Panels& b, int64_t K, const TileIo& io) {
  if (P > 1) return tile_z_rows<2>(R, ap, b, K, io);
  tile_z_rows<1>(R, ap, b, K, io);
}

// GCC 12 warns of the unset first operand its headers give unmasked AVX-512 shuffles (_mm512_undefined_ps).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The 16 x 16 block at src (rows ld floats apart; rows from `rows` on read as zeros, not read) transposed into dst
// (16 rows of 16, contiguous, 64-byte aligned): pairs of rows interleaved, then groups of four within each 128-bit
// lane, then the lanes.
void transpose16(const float* src, int64_t ld, float* dst, int rows = 16) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_loadu_ps(src + i * ld) : _mm512_setzero_ps();
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // lane L of r[4 i + j]: column 4 L + j of rows 4 i ... 4 i + 3
    r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512 even_a = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88),
                 odd_a = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
    const __m512 even_b = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88),
                 odd_b = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
    _mm512_store_ps(dst + (0 + j) * kW, _mm512_shuffle_f32x4(even_a, even_b, 0x88));
    _mm512_store_ps(dst + (4 + j) * kW, _mm512_shuffle_f32x4(odd_a, odd_b, 0x88));
    _mm512_store_ps(dst + (8 + j) * kW, _mm512_shuffle_f32x4(even_a, even_b, 0xDD));
    _mm512_store_ps(dst + (12 + j) * kW, _mm512_shuffle_f32x4(odd_a, odd_b, 0xDD));
  }
}
#pragma GCC diagnostic pop

// PackTransposedFn by 16 x 16 blocks in registers (a partial panel, and the last K % 16 steps, by element).
void pack_transposed_avx512(const float* B, int64_t ldb, int64_t K, int64_t n0, int64_t N, float* bp) {
  const int64_t w = std::min(kW, N - n0), k16 = w == kW ? K / kW * kW : 0;
  for (int64_t k = 0; k < k16; k += kW) transpose16(B + n0 * ldb + k, ldb, bp + k * kW);
  for (int64_t k = k16; k < K; ++k)
    for (int64_t c = 0; c < kW; ++c) bp[k * kW + c] = c < w ? B[(n0 + c) * ldb + k] : 0.f;
}

// PackRowsFn by blocks of 16 steps: the R rows' 16 values transposed in registers, each step's R values stored
// under a mask (the last K % 16 steps by element).
void pack_rows_avx512(const float* A, int64_t lda, int64_t K, int64_t i0, int R, float* ap) {
  const __mmask16 keep = __mmask16((1u << R) - 1);
  const int64_t k16 = K / kW * kW;
  alignas(64) float block[kW * kW];
  for (int64_t k = 0; k < k16; k += kW) {
    transpose16(A + i0 * lda + k, lda, block, R);
    for (int64_t j = 0; j < kW; ++j) _mm512_mask_storeu_ps(ap + (k + j) * R, keep, _mm512_load_ps(block + j * kW));
  }
  for (int r = 0; r < R; ++r)
    for (int64_t k = k16; k < K; ++k) ap[k * R + r] = A[(i0 + r) * lda + k];
}

// PackColumnsFn: each row's R values moved under a mask.
void pack_columns_avx512(const float* A, int64_t lda, int64_t m, int64_t i0, int R, float* ap) {
  const __mmask16 keep = __mmask16((1u << R) - 1);
  for (int64_t r = 0; r < m; ++r)
    _mm512_mask_storeu_ps(ap + r * R, keep, _mm512_maskz_loadu_ps(keep, A + r * lda + i0));
}

}  // namespace

#pragma GCC pop_options

// ---- AVX2 tiles, packing and the three forms --------------------------------------------------------------

// Everything from here to the next pop_options is compiled for AVX2 and FMA; only the functions after it run before
// the CPU has been asked whether it has them.
#pragma GCC push_options
#pragma GCC target("avx2,fma")

namespace {

#define MOE_TILE_ROW(i)                                   \
  if constexpr (R > i) {                                  \
    const __m256 a = _mm256_broadcast_ss(ap + k * R + i); \
    c##i##0 = _mm256_fmadd_ps(a, b0, c##i##0);            \
    c##i##1 = _mm256_fmadd_ps(a, b1, c##i##1);            \
  }
#define MOE_TILE_LOAD(i)                                     \
  if constexpr (R > i) {                                     \
    c##i##0 = _mm256_loadu_ps(io.init + i * io.ld_init);     \
    c##i##1 = _mm256_loadu_ps(io.init + i * io.ld_init + 8); \
  }
#define MOE_TILE_STORE(i)                                  \
  if constexpr (R > i) {                                   \
    _mm256_storeu_ps(io.out + i * io.ld_out, c##i##0);     \
    _mm256_storeu_ps(io.out + i * io.ld_out + 8, c##i##1); \
  }

// The AVX2 tile: R <= 6 rows of one panel.
template <int R>
void tile_y(const float* ap, const float* bp, int64_t K, const TileIo& io) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
         c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  if (io.init) {
    MOE_TILE_LOAD(0) MOE_TILE_LOAD(1) MOE_TILE_LOAD(2) MOE_TILE_LOAD(3) MOE_TILE_LOAD(4) MOE_TILE_LOAD(5)
  }
  for (int64_t k = 0; k < K; ++k) {
    const __m256 b0 = _mm256_load_ps(bp + k * kW), b1 = _mm256_load_ps(bp + k * kW + 8);
    MOE_TILE_ROW(0) MOE_TILE_ROW(1) MOE_TILE_ROW(2) MOE_TILE_ROW(3) MOE_TILE_ROW(4) MOE_TILE_ROW(5)
  }
  MOE_TILE_STORE(0) MOE_TILE_STORE(1) MOE_TILE_STORE(2) MOE_TILE_STORE(3) MOE_TILE_STORE(4) MOE_TILE_STORE(5)
}
#undef MOE_TILE_ROW
#undef MOE_TILE_LOAD
#undef MOE_TILE_STORE

void tile_avx2(int R, int, const float* ap, const Panels& b, int64_t K, const TileIo& io) {
  using Fn = void (*)(const float*, const float*, int64_t, const TileIo&);
  static constexpr Fn by_rows[6] = {tile_y<1>, tile_y<2>, tile_y<3>, tile_y<4>, tile_y<5>, tile_y<6>};
  by_rows[R - 1](ap, b.p, K, io);
}

// A buffer of the calling thread, 64-byte aligned, at least n floats; slot tells the buffers apart.
float* scratch(int slot, int64_t n) {
  thread_local std::vector<float> buffers[3];
  std::vector<float>& v = buffers[slot];
  if (v.size() < size_t(n + 16)) v.resize(size_t(n + 16));
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t(63));
}

// Rows are cut into blocks of at most `rows`, as even as they go: block b is [first(b), first(b + 1)).
struct RowBlocks {
  int64_t count;
  std::vector<int64_t> starts;
  RowBlocks(int64_t m, int rows) : count((m + rows - 1) / rows), starts(size_t(count + 1)) {
    for (int64_t b = 0; b <= count; ++b) starts[size_t(b)] = b * m / count;
  }
  int64_t first(int64_t b) const { return starts[size_t(b)]; }
  int height(int64_t b) const { return int(starts[size_t(b + 1)] - starts[size_t(b)]); }
};

// The columns of C cut into tiles of whole panels: panels(t) panels from panel first(t). Two panels share a
// tile (where the set has two) only where both are whole, so a panel's treatment never depends on the set.
struct ColumnTiles {
  std::vector<int64_t> starts;  // the first panel of each tile, then the panel count
  ColumnTiles(int64_t N, int per_tile) {
    const int64_t panels = (N + kW - 1) / kW;
    for (int64_t p = 0; p < panels; p += (per_tile > 1 && (p + 2) * kW <= N) ? 2 : 1) starts.push_back(p);
    starts.push_back(panels);
  }
  int64_t count() const { return int64_t(starts.size()) - 1; }
  int64_t first(int64_t t) const { return starts[size_t(t)]; }
  int panels(int64_t t) const { return int(starts[size_t(t + 1)] - starts[size_t(t)]); }
};

void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }

// Lines of `rows` rows of `floats` floats, `ld` floats apart, asked for a few at a time in memory order (no
// division per line: its cost would match the tile's).
struct Prefetcher {
  const char* row = nullptr;
  int64_t rows = 0, row_lines = 0, ld_bytes = 0, line = 0;
  Prefetcher() = default;
  Prefetcher(const float* p, int64_t rows_, int64_t floats, int64_t ld)
      : row(reinterpret_cast<const char*>(p)), rows(rows_), row_lines((floats * 4 + 63) / 64), ld_bytes(ld * 4) {}
  int64_t total() const { return rows * row_lines; }
  void issue(int64_t n) {
    for (; n > 0 && rows > 0; --n) {
      prefetch(row + line * 64);
      if (++line == row_lines) line = 0, row += ld_bytes, --rows;
    }
  }
};

// C (R rows x w columns) = alpha t + beta C, t's rows ldt apart; beta = 0 does not read C. Whole tiles (w = 16
// P) in vectors, a partial panel (one, w < 16) element by element.
void finish(const float* t, int64_t ldt, int R, int64_t w, bool whole, float alpha, float beta, float* C, int64_t ldc) {
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  for (int r = 0; r < R; ++r) {
    float* out = C + r * ldc;
    const float* s = t + r * ldt;
    if (!whole) {
      for (int64_t x = 0; x < w; ++x) out[x] = beta == 0.f ? alpha * s[x] : alpha * s[x] + beta * out[x];
      continue;
    }
    for (int64_t x = 0; x < w; x += 8) {
      __m256 v = _mm256_mul_ps(va, _mm256_load_ps(s + x));
      if (beta != 0.f) v = _mm256_fmadd_ps(vb, _mm256_loadu_ps(out + x), v);
      _mm256_storeu_ps(out + x, v);
    }
  }
}

// How a tile of P panels, w columns at C (R rows, ldc apart), ends. Where alpha is 1, beta 0 or 1 and the
// panels are whole, the chain runs in C itself: it starts from C's value (beta 1) or zero, and its last step stores
// into C. Otherwise it ends in t and finish() applies alpha and beta. A function of the shape and of alpha and
// beta, panel by panel.
struct TileEnd {
  const Kernels& kn;
  float alpha, beta;
  float* C;
  int64_t ldc, w;
  int P;
  bool whole() const { return w == kW * P; }
  bool direct() const { return whole() && alpha == 1.f && (beta == 0.f || beta == 1.f); }
  const float* init() const { return direct() && beta == 1.f ? C : nullptr; }
  // The last part of the chain: from `from` (ld floats apart; null: init()) to C.
  void run(int R, const float* ap, const Panels& b, int64_t K, const float* from, int64_t ld, float* t) const {
    if (!from) from = init(), ld = ldc;
    if (direct()) return kn.tile(R, P, ap, b, K, {from, ld, C, ldc});
    kn.tile(R, P, ap, b, K, {from, ld, t, kW * P});
    finish(t, kW * P, R, w, whole(), alpha, beta, C, ldc);
  }
};

// 16 values of row `src` from column c0 (w <= 16 of them, zeros after) to dst.
inline void copy16(const float* src, int64_t w, float* dst) {
  if (w == kW) {
    _mm256_store_ps(dst, _mm256_loadu_ps(src));
    _mm256_store_ps(dst + 8, _mm256_loadu_ps(src + 8));
    return;
  }
  for (int64_t c = 0; c < kW; ++c) dst[c] = c < w ? src[c] : 0.f;
}

// ---- packing ----------------------------------------------------------------------------------------

// PackRowsFn by element.
void pack_rows(const float* A, int64_t lda, int64_t K, int64_t i0, int R, float* ap) {
  for (int r = 0; r < R; ++r) {
    const float* a = A + (i0 + r) * lda;
    for (int64_t k = 0; k < K; ++k) ap[k * R + r] = a[k];
  }
}

// PackColumnsFn by element.
void pack_columns(const float* A, int64_t lda, int64_t m, int64_t i0, int R, float* ap) {
  for (int64_t r = 0; r < m; ++r)
    for (int i = 0; i < R; ++i) ap[r * R + i] = A[r * lda + i0 + i];
}

// Rows [k0, k0 + kc) of B (all N columns) into panels: panel p (columns 16 p ...) at bp + p kc 16.
void pack_slab(const float* B, int64_t ldb, int64_t k0, int64_t kc, int64_t N, float* bp) {
  const int64_t panels = (N + kW - 1) / kW;
  for (int64_t kk = 0; kk < kc; ++kk) {
    const float* row = B + (k0 + kk) * ldb;
    for (int64_t p = 0; p < panels; ++p) copy16(row + p * kW, std::min(kW, N - p * kW), bp + (p * kc + kk) * kW);
  }
}

// dst (8 x 8, leading dimension ldd) = the transpose of src (8 x 8, leading dimension ld).
void transpose8(const float* src, int64_t ld, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ld);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    r[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

// PackTransposedFn by 8 x 8 blocks in registers.
void pack_transposed(const float* B, int64_t ldb, int64_t K, int64_t n0, int64_t N, float* bp) {
  const int64_t w = std::min(kW, N - n0), k8 = w == kW ? K / 8 * 8 : 0;
  for (int64_t k = 0; k < k8; k += 8) {
    transpose8(B + n0 * ldb + k, ldb, bp + k * kW, kW);
    transpose8(B + (n0 + 8) * ldb + k, ldb, bp + k * kW + 8, kW);
  }
  for (int64_t k = k8; k < K; ++k)
    for (int64_t c = 0; c < kW; ++c) bp[k * kW + c] = c < w ? B[(n0 + c) * ldb + k] : 0.f;
}

// B (m x N) into panels: panel p (m x 16) at bp + p m 16.
void pack_panels(const float* B, int64_t ldb, int64_t m, int64_t N, float* bp) {
  const int64_t panels = (N + kW - 1) / kW;
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t r = 0; r < m; ++r) copy16(B + r * ldb + p * kW, std::min(kW, N - p * kW), bp + (p * m + r) * kW);
}

// ---- the three forms ----------------------------------------------------------------------------------

// C (m x N) = alpha A (m x K) B (K x N) + beta C.
void gemm_nn(const Kernels& kn, int64_t m, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
             const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const RowBlocks blocks(m, kn.rows);
  const ColumnTiles columns(N, kn.panels);
  const int64_t panels = (N + kW - 1) / kW, tiles = columns.count() * blocks.count, ldp = panels * kW;
  // The AVX-512 tile reads whole panels of B where they lie (its rows ldb apart), the AVX2 one packed copies.
  const bool in_place = kn.panels > 1 && N % kW == 0;
  float* ap = scratch(0, m * K);
  float* bp = in_place ? nullptr : scratch(1, std::min(kSlab, K) * panels * kW);
  float* partial = scratch(2, m * ldp);  // sums between slabs, m x ldp
  for (int64_t b = 0; b < blocks.count; ++b)
    kn.pack_rows(A, lda, K, blocks.first(b), blocks.height(b), ap + blocks.first(b) * K);
  alignas(64) float t[kMaxRows * kW * kMaxPanels];
  for (int64_t k0 = 0; k0 < K; k0 += kSlab) {
    const int64_t kc = std::min(kSlab, K - k0);
    const bool first = k0 == 0, last = k0 + kc == K;
    if (!in_place) pack_slab(B, ldb, k0, kc, N, bp);
    Prefetcher next;
    if (!last) next = Prefetcher(B + (k0 + kc) * ldb, std::min(kSlab, K - k0 - kc), N, ldb);
    const int64_t per_tile = (next.total() + tiles - 1) / tiles;
    for (int64_t c = 0; c < columns.count(); ++c)
      for (int64_t b = 0; b < blocks.count; ++b) {
        next.issue(per_tile);
        const int R = blocks.height(b), P = columns.panels(c);
        const int64_t i0 = blocks.first(b), n0 = columns.first(c) * kW;
        const TileEnd end{kn, alpha, beta, C + i0 * ldc + n0, ldc, std::min(kW * P, N - n0), P};
        float* sums = partial + i0 * ldp + n0;
        const float* a = ap + i0 * K + k0 * R;
        const Panels b_panels =
            in_place ? Panels{B + k0 * ldb + n0, kW, ldb} : Panels{bp + columns.first(c) * kc * kW, kc * kW, kW};
        if (last)
          end.run(R, a, b_panels, kc, first ? nullptr : sums, ldp, t);
        else
          kn.tile(R, P, a, b_panels, kc, {first ? end.init() : sums, first ? ldc : ldp, sums, ldp});
      }
  }
}

// C (m x N) = alpha A (m x K) B^T + beta C, B (N x K).
void gemm_nt(const Kernels& kn, int64_t m, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
             const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const RowBlocks blocks(m, kn.rows);
  const ColumnTiles columns(N, kn.panels);
  float* ap = scratch(0, m * K);
  float* bp = scratch(1, K * kW * kMaxPanels);
  for (int64_t b = 0; b < blocks.count; ++b)
    kn.pack_rows(A, lda, K, blocks.first(b), blocks.height(b), ap + blocks.first(b) * K);
  alignas(64) float t[kMaxRows * kW * kMaxPanels];
  for (int64_t c = 0; c < columns.count(); ++c) {
    const int P = columns.panels(c);
    const int64_t n0 = columns.first(c) * kW, w = std::min(kW * P, N - n0), next0 = n0 + kW * P;
    for (int q = 0; q < P; ++q) kn.pack_transposed(B, ldb, K, n0 + q * kW, N, bp + q * K * kW);
    Prefetcher next;
    if (next0 < N) next = Prefetcher(B + next0 * ldb, std::min(kW * kn.panels, N - next0), K, ldb);
    const int64_t per_tile = (next.total() + blocks.count - 1) / blocks.count;
    for (int64_t b = 0; b < blocks.count; ++b) {
      next.issue(per_tile);
      const int64_t i0 = blocks.first(b);
      const TileEnd end{kn, alpha, beta, C + i0 * ldc + n0, ldc, w, P};
      end.run(blocks.height(b), ap + i0 * K, {bp, K * kW, kW}, K, nullptr, 0, t);
    }
  }
}

// C (M x N) = alpha A^T B + beta C, A (m x M), B (m x N): the reduction over the m rows.
void gemm_tn(const Kernels& kn, int64_t m, int64_t M, int64_t N, float alpha, const float* A, int64_t lda,
             const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const RowBlocks blocks(M, kn.rows);
  const ColumnTiles columns(N, kn.panels);
  const int64_t panels = (N + kW - 1) / kW;
  float* ap = scratch(0, m * M);
  float* bp = scratch(1, m * panels * kW);
  for (int64_t b = 0; b < blocks.count; ++b)
    kn.pack_columns(A, lda, m, blocks.first(b), blocks.height(b), ap + blocks.first(b) * m);
  pack_panels(B, ldb, m, N, bp);
  alignas(64) float t[kMaxRows * kW * kMaxPanels];
  int64_t ahead_b = kTilesAhead / panels, ahead_p = kTilesAhead % panels;  // the panel whose C lines are asked for
  for (int64_t b = 0; b < blocks.count; ++b)
    for (int64_t c = 0; c < columns.count(); ++c) {
      const int P = columns.panels(c);
      for (int q = 0; q < P && ahead_b < blocks.count; ++q) {
        for (int64_t i = blocks.first(ahead_b); i < blocks.first(ahead_b + 1); ++i)
          prefetch(C + i * ldc + ahead_p * kW);
        if (++ahead_p == panels) ahead_p = 0, ++ahead_b;
      }
      const int64_t i0 = blocks.first(b), n0 = columns.first(c) * kW;
      const TileEnd end{kn, alpha, beta, C + i0 * ldc + n0, ldc, std::min(kW * P, N - n0), P};
      end.run(blocks.height(b), ap + i0 * m, {bp + columns.first(c) * m * kW, m * kW, kW}, m, nullptr, 0, t);
    }
}

constexpr Kernels kAvx2{6, 1, tile_avx2, pack_transposed, pack_rows, pack_columns};
constexpr Kernels kAvx512{kMaxRows,         kMaxPanels,         tile_avx512, pack_transposed_avx512,
                          pack_rows_avx512, pack_columns_avx512};

bool run_form(const Kernels& kn, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if ((ta && tb) || K == 0) return false;
  if (M == 0 || N == 0) return true;
  if (ta)
    gemm_tn(kn, K, M, N, alpha, A, lda, B, ldb, beta, C, ldc);
  else if (tb)
    gemm_nt(kn, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    gemm_nn(kn, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  return true;
}

}  // namespace

#pragma GCC pop_options

namespace {

bool cpu_has(SmallGemmIsa isa) {
  const CpuVectors v = cpu_vectors();
  return isa == SmallGemmIsa::Avx512 ? v.avx512 : v.avx2_fma;
}

// The set small_gemm() runs: the widest here, or AVX2 where MOE_SMALL_GEMM=avx2 (a knob for measurements:
// docs/bench.md "Small-group expert GEMMs").
SmallGemmIsa chosen_isa() {
  static const SmallGemmIsa isa = [] {
    const char* asked = std::getenv("MOE_SMALL_GEMM");
    if (asked && std::strcmp(asked, "avx2") == 0) return SmallGemmIsa::Avx2;
    return cpu_has(SmallGemmIsa::Avx512) ? SmallGemmIsa::Avx512 : SmallGemmIsa::Avx2;
  }();
  return isa;
}

}  // namespace

bool small_gemm_available(SmallGemmIsa isa) { return cpu_has(isa); }
bool small_gemm_available() { return cpu_has(SmallGemmIsa::Avx2); }
const char* small_gemm_isa_in_use() { return small_gemm_available() ? small_gemm_isa_name(chosen_isa()) : nullptr; }

bool small_gemm_on(SmallGemmIsa isa, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (!cpu_has(isa)) return false;
  return run_form(isa == SmallGemmIsa::Avx512 ? kAvx512 : kAvx2, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

bool small_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  return small_gemm_on(chosen_isa(), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#else  // not x86-64: OpenBLAS serves every group

bool small_gemm_available(SmallGemmIsa) { return false; }
bool small_gemm_available() { return false; }
const char* small_gemm_isa_in_use() { return nullptr; }

bool small_gemm_on(SmallGemmIsa, bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                   int64_t, float, float*, int64_t) {
  return false;
}

bool small_gemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, float,
                float*, int64_t) {
  return false;
}

#endif

}  // namespace moe::cpu
