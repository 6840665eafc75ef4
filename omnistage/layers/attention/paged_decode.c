/* Decode attention over a paged KV cache, for every decode row of a step in one call (CPU).
 *
 * Built at first use by omnistage/layers/attention/native.py (cc -O3 -march=native) and called through ctypes:
 * torch's matmuls spend most of their time on shapes this small (a few query rows of head_dim against each
 * key), so the step grew with the context; this loop reads each key and value once, in place, in the cache's
 * own layout and dtype (float32; bfloat16, fp8 e5m2 or e4m3 widened on the fly: `kind`, KV_* below).
 *
 * q, out: [rows, kv_heads, group, head_dim] float32, q already scaled. cache: one layer's
 * [2, num_blocks, page, kv_heads, head_dim] (keys then values) of `kind`. tables: [num_seqs, table_stride] int32.
 * For decode sequence i (i < n): its row is rows[i], its table tables[seqs[i]], its context ctx[seqs[i]];
 * window > 0 reads only the last `window` positions. scratch: `threads` rows of scratch_stride floats (each at least
 * group * max context), one per thread. A long step's (sequence, KV head) items are spread over the threads.
 */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline __attribute__((always_inline)) float dot_f32(const float *restrict a, const float *restrict b, int d) {
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (int i = 0; i < d; i++) acc += a[i] * b[i];
    return acc;
}

static inline __attribute__((always_inline)) float dot_bf16(const float *restrict a, const uint16_t *restrict b, int d) {
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (int i = 0; i < d; i++) acc += a[i] * bf16_to_f32(b[i]);
    return acc;
}

static inline __attribute__((always_inline)) void axpy_f32(float *restrict y, float a, const float *restrict x, int d) {
#pragma omp simd
    for (int i = 0; i < d; i++) y[i] += a * x[i];
}

static inline __attribute__((always_inline)) void axpy_bf16(float *restrict y, float a, const uint16_t *restrict x, int d) {
#pragma omp simd
    for (int i = 0; i < d; i++) y[i] += a * bf16_to_f32(x[i]);
}

/* Cache element types (native.py's CACHE_KINDS). fp8 (e5m2, e4m3) widens exactly, subnormals too: its 7 magnitude
 * bits moved under float's exponent and mantissa (a shift), rescaled by the bias difference, the sign put back. */
enum { KV_F32, KV_BF16, KV_E5M2, KV_E4M3 };
#define FP8_SHIFT(kind) ((kind) == KV_E5M2 ? 21 : 20)
#define FP8_SCALE(kind) ((kind) == KV_E5M2 ? 0x1p112f : 0x1p120f)

static inline int kv_elem(int kind) { return kind == KV_F32 ? 4 : kind == KV_BF16 ? 2 : 1; }

static inline float fp8_to_f32(uint8_t b, int shift, float scale) {
    uint32_t u = (uint32_t)(b & 0x7f) << shift;
    float f;
    memcpy(&f, &u, sizeof f);
    f *= scale;
    return (b & 0x80) ? -f : f;
}

static inline __attribute__((always_inline)) float dot_kv(const float *restrict a, const char *restrict b, int d,
                                                          int kind) {
    if (kind == KV_F32) return dot_f32(a, (const float *)b, d);
    if (kind == KV_BF16) return dot_bf16(a, (const uint16_t *)b, d);
    float acc = 0.f;
    for (int i = 0; i < d; i++) acc += a[i] * fp8_to_f32((uint8_t)b[i], FP8_SHIFT(kind), FP8_SCALE(kind));
    return acc;
}

static inline __attribute__((always_inline)) void axpy_kv(float *restrict y, float a, const char *restrict x, int d,
                                                          int kind) {
    if (kind == KV_F32) axpy_f32(y, a, (const float *)x, d);
    else if (kind == KV_BF16) axpy_bf16(y, a, (const uint16_t *)x, d);
    else
        for (int i = 0; i < d; i++) y[i] += a * fp8_to_f32((uint8_t)x[i], FP8_SHIFT(kind), FP8_SCALE(kind));
}

/* Calls fn(slot, position) for positions [first, len) of a sequence, block by block (no division per position). */
#define FOR_EACH_SLOT(table, page, first, len, BODY)                                \
    for (int b = (first) / (page); b * (page) < (len); b++) {                       \
        int lo = b * (page) > (first) ? b * (page) : (first);                       \
        int hi = (b + 1) * (page) < (len) ? (b + 1) * (page) : (len);               \
        long base = (long)(table)[b] * (page) - (long)b * (page);                   \
        for (int p = lo; p < hi; p++) {                                             \
            long slot = base + p;                                                   \
            BODY                                                                    \
        }                                                                           \
    }

#ifdef __AVX512F__
#include "paged_decode_avx512.h"
#endif

/* One sequence and KV head: scores of its group's queries over positions [first, len), softmax, weighted values. */
static inline __attribute__((always_inline)) void one_head(const float *q, const char *keys, const char *values,
                                                           const int32_t *table, int first, int len, int page,
                                                           long slot_stride, int head_off, int group, int d, int kind,
                                                           float *scores, float *out) {
    const int elem = kv_elem(kind);
    const int span = len - first;
    for (int g = 0; g < group; g++) memset(out + (long)g * d, 0, sizeof(float) * d);
    keys += (long)head_off * elem;
    values += (long)head_off * elem;
#ifdef __AVX512F__
    const int vector = d % 16 == 0;
    if (vector) {
        BY_KIND(scores, kind, q, keys, table, first, len, page, slot_stride * elem, group, d, scores)
    } else
#endif
    FOR_EACH_SLOT(table, page, first, len, {
        const char *k = keys + slot * slot_stride * elem;
        for (int g = 0; g < group; g++) scores[(long)g * span + p - first] = dot_kv(q + (long)g * d, k, d, kind);
    })
    float inv[group];  /* 1 / each query's softmax sum, applied to its output at the end */
    for (int g = 0; g < group; g++) {
        float *row = scores + (long)g * span;
#ifdef __AVX512F__
        if (vector) {
            inv[g] = softmax16(row, span);
            continue;
        }
#endif
        float m = -FLT_MAX, sum = 0.f;
#pragma omp simd reduction(max : m)
        for (int i = 0; i < span; i++) m = row[i] > m ? row[i] : m;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < span; i++) {
            row[i] = expf(row[i] - m);
            sum += row[i];
        }
        inv[g] = 1.f / sum;
    }
#ifdef __AVX512F__
    if (vector) {
        BY_KIND(values, kind, scores, values, table, first, len, page, slot_stride * elem, group, d, out)
    } else
#endif
    FOR_EACH_SLOT(table, page, first, len, {
        const char *v = values + slot * slot_stride * elem;
        for (int g = 0; g < group; g++) axpy_kv(out + (long)g * d, scores[(long)g * span + p - first], v, d, kind);
    })
    for (int g = 0; g < group; g++) {
#pragma omp simd
        for (int i = 0; i < d; i++) out[(long)g * d + i] *= inv[g];
    }
}

/* Head sizes of the families (and the tiny test models) get a copy with the size a constant, which the compiler
 * unrolls into whole vectors; any other size takes the generic loop. */
#define HEAD(D)                                                                                                    \
    static void one_head_##D(const float *q, const char *k, const char *v, const int32_t *t, int first, int len,  \
                             int page, long ss, int off, int group, int kind, float *sc, float *out) {             \
        one_head(q, k, v, t, first, len, page, ss, off, group, D, kind, sc, out);                                \
    }
HEAD(16)
HEAD(32)
HEAD(64)
HEAD(128)

static void one_head_any(const float *q, const char *k, const char *v, const int32_t *t, int first, int len, int page,
                         long ss, int off, int group, int d, int kind, float *sc, float *out) {
    one_head(q, k, v, t, first, len, page, ss, off, group, d, kind, sc, out);
}

/* Item `item` of a call: decode sequence item / kv_heads, KV head item % kv_heads. */
static inline void one_item(int item, const float *q, const char *keys, const char *values, int page, int kv_heads,
                            int group, int d, int kind, const int32_t *tables, int table_stride, const int32_t *ctx,
                            const int32_t *seqs, const int32_t *rows, int window, float *sc, float *out) {
    const long slot_stride = (long)kv_heads * d;  /* elements between consecutive slots */
    const long row_stride = (long)kv_heads * group * d;
    int i = item / kv_heads, h = item % kv_heads;
    int s = seqs[i], len = ctx[s];
    int first = (window > 0 && len > window) ? len - window : 0;
    long off = rows[i] * row_stride + (long)h * group * d;
    const int32_t *table = tables + (long)s * table_stride;
    switch (d) {
    case 16: one_head_16(q + off, keys, values, table, first, len, page, slot_stride, h * d, group, kind, sc, out + off); break;
    case 32: one_head_32(q + off, keys, values, table, first, len, page, slot_stride, h * d, group, kind, sc, out + off); break;
    case 64: one_head_64(q + off, keys, values, table, first, len, page, slot_stride, h * d, group, kind, sc, out + off); break;
    case 128: one_head_128(q + off, keys, values, table, first, len, page, slot_stride, h * d, group, kind, sc, out + off); break;
    default: one_head_any(q + off, keys, values, table, first, len, page, slot_stride, h * d, group, d, kind, sc, out + off);
    }
}

/* Below this many multiply-adds in a call (the scores' and the values' together) it runs on one thread: waking
 * the team costs more than a short context's work (batch 16 at 32 tokens of a tiny model stays serial). */
#define PARALLEL_MIN_WORK (1L << 17)

int paged_decode(const float *q, const void *cache, int kind, long num_blocks, int page, int kv_heads, int group,
                 int d, const int32_t *tables, int table_stride, const int32_t *ctx, const int32_t *seqs,
                 const int32_t *rows, int n, int window, int threads, long scratch_stride, float *scratch,
                 float *out) {
    const int elem = kv_elem(kind);
    const long slot_stride = (long)kv_heads * d;  /* elements between consecutive slots */
    const char *keys = (const char *)cache;
    const char *values = keys + num_blocks * page * slot_stride * elem;
    long work = 0;
    for (int i = 0; i < n; i++) {
        int len = ctx[seqs[i]];
        work += (long)((window > 0 && len > window) ? window : len) * kv_heads * group * d * 2;
    }
    /* One item per sequence and KV head, spread over the threads of torch's own OpenMP runtime (the library links
     * the libgomp.so.1 that torch loaded; native.py runs it on one thread where a second runtime got loaded). A short
     * step never enters the runtime. */
    if (threads > 1 && work >= PARALLEL_MIN_WORK) {
#pragma omp parallel for schedule(dynamic) num_threads(threads)
        for (int item = 0; item < n * kv_heads; item++)
            one_item(item, q, keys, values, page, kv_heads, group, d, kind, tables, table_stride, ctx, seqs, rows,
                     window, scratch + (long)omp_get_thread_num() * scratch_stride, out);
    } else {
        for (int item = 0; item < n * kv_heads; item++)
            one_item(item, q, keys, values, page, kv_heads, group, d, kind, tables, table_stride, ctx, seqs, rows,
                     window, scratch, out);
    }
    return 0;
}
