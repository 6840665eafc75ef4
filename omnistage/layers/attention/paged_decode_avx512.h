/* The AVX-512 passes of paged_decode.c (included there inside #ifdef __AVX512F__; hashed with it by native.py):
 * scores, softmax and weighted values for head sizes a multiple of 16, per cache element type. */
#include <immintrin.h>
static inline __m512 load16_f32(const void *p) { return _mm512_loadu_ps((const float *)p); }
static inline __m512 load16_bf16(const void *p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
/* fp8 through fp16 (vcvtph2ps): e5m2 is the top byte of an fp16; e4m3's magnitude goes one bit lower (its sign,
 * copied down by the arithmetic shift, cleared there) and its bias, 8 less than fp16's, is a product by 2^8. */
static inline __m512 load16_e5m2(const void *p) {
    __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm512_cvtph_ps(_mm256_slli_epi16(x, 8));
}
static inline __m512 load16_e4m3(const void *p) {
    __m256i x = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), 8);
    __m256i h = _mm256_and_si256(_mm256_srai_epi16(x, 1), _mm256_set1_epi16((short)0xbfff));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.f));
}

/* The last three levels of hsum16, from its first level's eight pair sums. */
static inline __m512 hsum_pairs(const __m512 *a) {
    __m512 b[4], c[2];
    for (int i = 0; i < 4; i++) {
        __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
}

/* Sums of 16 vectors, lane i holding the sum of v[i]: unpack, then shuffle, pairs of lanes added at each level. */
static inline __m512 hsum16(const __m512 *v) {
    __m512 a[8];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    return hsum_pairs(a);
}

/* exp(x) for x <= 0 on 16 lanes (Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r, then 2^n by
 * scalef; ~1 ulp), inline: libmvec's expf is a call, around which the loop spilled its registers. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.33f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    return _mm512_scalef_ps(p, n);
}

/* row[0, n) <- exp(row - max(row)); returns 1 / their sum (the caller scales its output instead of every weight). */
static inline float softmax16(float *row, int n) {
    __m512 m = _mm512_set1_ps(-FLT_MAX), sum = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(row + i));
    __mmask16 tail = (__mmask16)((1u << (n - i)) - 1);
    m = _mm512_mask_max_ps(m, tail, m, _mm512_maskz_loadu_ps(tail, row + i));
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(m));
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(row + i), top));
        _mm512_storeu_ps(row + i, e);
        sum = _mm512_add_ps(sum, e);
    }
    __m512 e = _mm512_maskz_mov_ps(tail, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, row + i), top)));
    _mm512_mask_storeu_ps(row + i, tail, e);
    return 1.f / _mm512_reduce_add_ps(_mm512_add_ps(sum, e));
}

/* Head sizes a multiple of 16: whole vectors, the cache's dtype chosen outside the loops, and no value carried
 * from one position to the next through memory (the running max is a pass of its own; the weighted values add up
 * in registers over a block's positions, two chains deep). */
#define VECTOR_PASSES(T, LOAD)                                                                                      \
    static inline float vdot_##T(const float *restrict qg, const char *restrict k, int d) {                          \
        __m512 acc = _mm512_mul_ps(LOAD(k), _mm512_loadu_ps(qg));                                                   \
        for (int c = 16; c < d; c += 16)                                                                            \
            acc = _mm512_fmadd_ps(LOAD(k + c * (long)sizeof(T##_t)), _mm512_loadu_ps(qg + c), acc);                 \
        return _mm512_reduce_add_ps(acc);                                                                           \
    }                                                                                                               \
    /* 16 positions' partial-sum vectors reduced together (one transpose-add) instead of one by one. */             \
    static inline __m512 vdot16_##T(const float *restrict qg, const char *restrict k, long row_bytes, int d) {        \
        __m512 v[16];                                                                                               \
        for (int i = 0; i < 16; i++) {                                                                              \
            const char *row = k + i * row_bytes;                                                                    \
            v[i] = _mm512_mul_ps(LOAD(row), _mm512_loadu_ps(qg));                                                   \
            for (int c = 16; c < d; c += 16)                                                                        \
                v[i] = _mm512_fmadd_ps(LOAD(row + c * (long)sizeof(T##_t)), _mm512_loadu_ps(qg + c), v[i]);         \
        }                                                                                                           \
        return hsum16(v);                                                                                           \
    }                                                                                                               \
    /* 16-wide heads: 16 positions' scores for every query of the group. The first level of the transpose-add is  \
     * linear in the query, so the key rows are unpacked once for the whole group and each query's lanes multiply \
     * the unpacked rows (a product and a fused add per pair of rows, instead of two products, two unpacks and an \
     * add per query). */                                                                                        \
    static inline void tile16_##T(const float *restrict q, const char *restrict k, long row_bytes, int group,      \
                                  float *restrict out, int out_stride) {                                           \
        __m512 lo[8], hi[8];                                                                                        \
        for (int i = 0; i < 8; i++) {                                                                               \
            __m512 a = LOAD(k + 2 * i * row_bytes), b = LOAD(k + (2 * i + 1) * row_bytes);                          \
            lo[i] = _mm512_unpacklo_ps(a, b);                                                                       \
            hi[i] = _mm512_unpackhi_ps(a, b);                                                                       \
        }                                                                                                           \
        for (int g = 0; g < group; g++) {                                                                           \
            __m512 qv = _mm512_loadu_ps(q + (long)g * 16), pairs[8];                                                \
            __m512 ql = _mm512_unpacklo_ps(qv, qv), qh = _mm512_unpackhi_ps(qv, qv);                                \
            for (int i = 0; i < 8; i++) pairs[i] = _mm512_fmadd_ps(lo[i], ql, _mm512_mul_ps(hi[i], qh));            \
            _mm512_storeu_ps(out + (long)g * out_stride, hsum_pairs(pairs));                                        \
        }                                                                                                           \
    }                                                                                                               \
    static void scores_##T(const float *restrict q, const char *restrict keys, const int32_t *table, int first,      \
                           int len, int page, long row_bytes, int group, int d, float *restrict scores) {          \
        const int span = len - first;                                                                               \
        for (int b = first / page; b * page < len; b++) {                                                           \
            int lo = b * page > first ? b * page : first, hi = (b + 1) * page < len ? (b + 1) * page : len;         \
            const char *k = keys + ((long)table[b] * page - (long)b * page) * row_bytes;                            \
            int p16 = lo;                                                                                           \
            if (d == 16)                                                                                            \
                for (; p16 + 16 <= hi; p16 += 16)                                                                   \
                    TILE16_##T(q, k + p16 * row_bytes, row_bytes, group, scores + p16 - first, span);               \
            for (int g = 0; g < group; g++) {                                                                       \
                const float *qg = q + (long)g * d;                                                                  \
                float *out = scores + (long)g * span - first;                                                       \
                int p = p16;                                                                                        \
                for (; p + 16 <= hi; p += 16) _mm512_storeu_ps(out + p, vdot16_##T(qg, k + p * row_bytes, row_bytes, d)); \
                for (; p < hi; p++) out[p] = vdot_##T(qg, k + p * row_bytes, d);                                     \
            }                                                                                                       \
        }                                                                                                           \
    }                                                                                                               \
    /* The weighted values, one 16-wide slice of the head at a time, for two queries of the group at once: each  \
     * value row is loaded once for both, and four positions go down four separate chains per query (eight FMAs  \
     * in flight: one chain waited on the FMA before it at every position). Written into out (not added). */     \
    static void values_##T(const float *restrict scores, const char *restrict values, const int32_t *table,         \
                           int first, int len, int page, long row_bytes, int group, int d, float *restrict out) {   \
        const int span = len - first;                                                                               \
        for (int c = 0; c < d; c += 16) {                                                                           \
            const long col = c * (long)sizeof(T##_t);                                                               \
            for (int g = 0; g < group; g += 2) {                                                                    \
                const int two = g + 1 < group;                                                                      \
                const float *w0 = scores + (long)g * span - first, *w1 = two ? w0 + span : w0;                      \
                __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;     \
                for (int b = first / page; b * page < len; b++) {                                                   \
                    int lo = b * page > first ? b * page : first, hi = (b + 1) * page < len ? (b + 1) * page : len; \
                    const char *v = values + ((long)table[b] * page - (long)b * page) * row_bytes + col;            \
                    int p = lo;                                                                                     \
                    for (; p + 4 <= hi; p += 4) {                                                                   \
                        __m512 x0 = LOAD(v + p * row_bytes), x1 = LOAD(v + (p + 1) * row_bytes);                    \
                        __m512 x2 = LOAD(v + (p + 2) * row_bytes), x3 = LOAD(v + (p + 3) * row_bytes);              \
                        a0 = _mm512_fmadd_ps(_mm512_set1_ps(w0[p]), x0, a0);                                        \
                        a1 = _mm512_fmadd_ps(_mm512_set1_ps(w0[p + 1]), x1, a1);                                    \
                        a2 = _mm512_fmadd_ps(_mm512_set1_ps(w0[p + 2]), x2, a2);                                    \
                        a3 = _mm512_fmadd_ps(_mm512_set1_ps(w0[p + 3]), x3, a3);                                    \
                        b0 = _mm512_fmadd_ps(_mm512_set1_ps(w1[p]), x0, b0);                                        \
                        b1 = _mm512_fmadd_ps(_mm512_set1_ps(w1[p + 1]), x1, b1);                                    \
                        b2 = _mm512_fmadd_ps(_mm512_set1_ps(w1[p + 2]), x2, b2);                                    \
                        b3 = _mm512_fmadd_ps(_mm512_set1_ps(w1[p + 3]), x3, b3);                                    \
                    }                                                                                               \
                    for (; p < hi; p++) {                                                                           \
                        __m512 x0 = LOAD(v + p * row_bytes);                                                        \
                        a0 = _mm512_fmadd_ps(_mm512_set1_ps(w0[p]), x0, a0);                                        \
                        b0 = _mm512_fmadd_ps(_mm512_set1_ps(w1[p]), x0, b0);                                        \
                    }                                                                                               \
                }                                                                                                   \
                _mm512_storeu_ps(out + (long)g * d + c, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))); \
                if (two)                                                                                            \
                    _mm512_storeu_ps(out + (long)(g + 1) * d + c,                                                   \
                                     _mm512_add_ps(_mm512_add_ps(b0, b1), _mm512_add_ps(b2, b3)));                  \
            }                                                                                                       \
        }                                                                                                           \
    }
#ifdef __AVX512BF16__
static inline __m512i two_rows_bf16(const char *a, const char *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* tile16 over a bf16 cache on CPUs with AVX512_BF16: vdpbf16ps multiplies two 16-wide key rows (one vector, read
 * as stored: no widening) by the query and adds adjacent products in fp32, so a row's 16 products arrive as 8
 * partial sums and three transpose-add levels remain instead of four. The query goes in as two bf16 halves,
 * hi + lo (its rounding ~2^-16, not bf16's 2^-8), so the scores stay fp32 math over the stored keys. Rows i and
 * i + 1 share a vector; the levels leave positions in the order 0 2 4 6 1 3 5 7 8 10 ..., put back by one permute. */
static inline void tile16_bf16dp(const float *restrict q, const char *restrict k, long row_bytes, int group,
                                 float *restrict out, int out_stride) {
    __m512i rows[8];
    for (int i = 0; i < 8; i++) rows[i] = two_rows_bf16(k + 2 * i * row_bytes, k + (2 * i + 1) * row_bytes);
    const __m512i order = _mm512_set_epi32(15, 11, 14, 10, 13, 9, 12, 8, 7, 3, 6, 2, 5, 1, 4, 0);
    for (int g = 0; g < group; g++) {
        __m512 qv = _mm512_loadu_ps(q + (long)g * 16);
        __m256i hi = (__m256i)_mm512_cvtneps_pbh(qv);
        __m512 hi_f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
        __m256i lo = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(qv, hi_f));
        __m512bh qh = (__m512bh)_mm512_inserti64x4(_mm512_castsi256_si512(hi), hi, 1);
        __m512bh ql = (__m512bh)_mm512_inserti64x4(_mm512_castsi256_si512(lo), lo, 1);
        __m512 acc[8], s[4], t[2];
        for (int i = 0; i < 8; i++)
            acc[i] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), qh, (__m512bh)rows[i]), ql,
                                      (__m512bh)rows[i]);
        for (int i = 0; i < 4; i++)
            s[i] = _mm512_add_ps(_mm512_unpacklo_ps(acc[2 * i], acc[2 * i + 1]),
                                 _mm512_unpackhi_ps(acc[2 * i], acc[2 * i + 1]));
        for (int i = 0; i < 2; i++) {
            __m512d x = _mm512_castps_pd(s[2 * i]), y = _mm512_castps_pd(s[2 * i + 1]);
            t[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
        }
        __m512 sums = _mm512_add_ps(_mm512_shuffle_f32x4(t[0], t[1], 0x88), _mm512_shuffle_f32x4(t[0], t[1], 0xdd));
        _mm512_storeu_ps(out + (long)g * out_stride, _mm512_permutexvar_ps(order, sums));
    }
}
#define TILE16_bf16 tile16_bf16dp
#else
#define TILE16_bf16 tile16_bf16
#endif
#define TILE16_f32 tile16_f32
#define TILE16_e5m2 tile16_e5m2
#define TILE16_e4m3 tile16_e4m3
typedef float f32_t;
typedef uint16_t bf16_t;
typedef uint8_t e5m2_t, e4m3_t;
VECTOR_PASSES(f32, load16_f32)
VECTOR_PASSES(bf16, load16_bf16)
VECTOR_PASSES(e5m2, load16_e5m2)
VECTOR_PASSES(e4m3, load16_e4m3)

/* PASS_##kind(args): the pass for the cache's type, called directly (inlined with the head size a constant). */
#define BY_KIND(PASS, kind, ...)                                                                                    \
    switch (kind) {                                                                                                 \
    case KV_BF16: PASS##_bf16(__VA_ARGS__); break;                                                                  \
    case KV_E5M2: PASS##_e5m2(__VA_ARGS__); break;                                                                  \
    case KV_E4M3: PASS##_e4m3(__VA_ARGS__); break;                                                                  \
    default: PASS##_f32(__VA_ARGS__);                                                                               \
    }
