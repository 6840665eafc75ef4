/* The tiny-channel passes of a DAC decoder, in one pass over memory each (built at first use by NativeLibrary).
 *
 * At a few channels and 4-24 kHz, a decode is many short passes: torch's Snake is four (a product, sin, square,
 * add), and a convolution an im2col copy and a product whose inner dimension is C * K. Here the Snake is one
 * loop with its own sin (reduced by pi, an odd polynomial of degree 11: within ~1e-7 of libm's on the reduced
 * range), a convolution accumulates its taps into a block of outputs that stays in L1, and a residual unit
 * (x + conv1x1(snake(conv(snake(x))))) runs its second half block by block without leaving L1.
 * Layout: float32, contiguous [B, C, T]; weights [O, C, K]; stride 1, zero padding, output length T.
 */
#include <math.h>
#include <stdlib.h>

static inline float sin_squared(float y) {
    /* sin^2 has period pi: y = k pi + r with |r| <= pi / 2 (pi split in two so k * P1 is exact for |k| < 2^16) */
    const float P1 = 3.140625f, P2 = 9.67653589793e-4f, INV_PI = 0.318309886183791f;
    float k = rintf(y * INV_PI);
    float r = (y - k * P1) - k * P2;
    float r2 = r * r;
    float s = r * (1.0f + r2 * (-1.0f / 6 + r2 * (1.0f / 120 + r2 * (-1.0f / 5040 + r2 * (1.0f / 362880
                   + r2 * (-1.0f / 39916800))))));
    return s * s;
}

static void snake_row(float *dst, const float *src, float a, long length) {
    const float inv = 1.0f / (a + 1e-9f);
    for (long t = 0; t < length; t++) {
        float v = src[t];
        dst[t] = v + sin_squared(a * v) * inv;
    }
}

/* out = x + sin(alpha x)^2 / (alpha + 1e-9), alpha per channel; out may be x. */
void dac_snake(float *out, const float *x, const float *alpha, long batch, long channels, long length) {
    for (long b = 0; b < batch; b++)
        for (long c = 0; c < channels; c++)
            snake_row(out + (b * channels + c) * length, x + (b * channels + c) * length, alpha[c], length);
}

#define BLOCK 512

/* acc[0..n) = bias + sum_c sum_k w[c, k] x[c, start + i + k dilation - pad] (rows of ``length``; zero outside). */
static void conv_block(float *acc, const float *x, const float *w, float bias, long in_ch, long length, long kernel,
                       long dilation, long pad, long start, long n) {
    for (long i = 0; i < n; i++) acc[i] = bias;
    for (long c = 0; c < in_ch; c++) {
        const float *row = x + c * length;
        const float *taps = w + c * kernel;
        for (long k = 0; k < kernel; k++) {
            const float tap = taps[k];
            const long shift = start + k * dilation - pad;  /* input index of acc[0] */
            long lo = -shift > 0 ? -shift : 0;              /* first i with a valid input */
            long hi = length - shift < n ? length - shift : n;
            if (lo > n) lo = n;
            const float *src = row + shift;
            for (long i = lo; i < hi; i++) acc[i] += tap * src[i];
        }
    }
}

/* out[b, o, t] = bias[o] + sum_c sum_k w[o, c, k] x[b, c, t + k dilation - pad] (zero outside [0, T)). */
void dac_conv1d(float *out, const float *x, const float *w, const float *bias, long batch, long in_ch, long out_ch,
                long length, long kernel, long dilation, long pad) {
    float acc[BLOCK];
    for (long b = 0; b < batch; b++) {
        for (long start = 0; start < length; start += BLOCK) {
            const long n = length - start < BLOCK ? length - start : BLOCK;
            for (long o = 0; o < out_ch; o++) {
                conv_block(acc, x + b * in_ch * length, w + o * in_ch * kernel, bias ? bias[o] : 0.0f, in_ch,
                           length, kernel, dilation, pad, start, n);
                float *dst = out + (b * out_ch + o) * length + start;
                for (long i = 0; i < n; i++) dst[i] = acc[i];
            }
        }
    }
}

/* DAC's residual unit: out = x + w2 snake2(conv(snake1(x), w1, b1, dilation)) + b2, every conv keeping the length
 * (w1 [C, C, K], w2 [C, C, 1]). Returns 0, or -1 where its scratch could not be allocated (out untouched). */
int dac_residual_unit(float *out, const float *x, const float *alpha1, const float *w1, const float *b1,
                      long dilation, const float *alpha2, const float *w2, const float *b2, long batch, long channels,
                      long length, long kernel) {
    float *snaked = malloc(sizeof(float) * channels * length);
    float *hidden = malloc(sizeof(float) * channels * BLOCK);
    if (!snaked || !hidden) {
        free(snaked);
        free(hidden);
        return -1;
    }
    const long pad = dilation * (kernel - 1) / 2;
    for (long b = 0; b < batch; b++) {
        const float *xb = x + b * channels * length;
        for (long c = 0; c < channels; c++) snake_row(snaked + c * length, xb + c * length, alpha1[c], length);
        for (long start = 0; start < length; start += BLOCK) {
            const long n = length - start < BLOCK ? length - start : BLOCK;
            for (long c = 0; c < channels; c++) {
                float *h = hidden + c * BLOCK;
                conv_block(h, snaked, w1 + c * channels * kernel, b1[c], channels, length, kernel, dilation, pad,
                           start, n);
                snake_row(h, h, alpha2[c], n);
            }
            for (long o = 0; o < channels; o++) {
                float *dst = out + (b * channels + o) * length + start;
                const float *src = xb + o * length + start;
                for (long i = 0; i < n; i++) dst[i] = src[i] + b2[o];
                for (long c = 0; c < channels; c++) {
                    const float tap = w2[o * channels + c], *h = hidden + c * BLOCK;
                    for (long i = 0; i < n; i++) dst[i] += tap * h[i];
                }
            }
        }
    }
    free(snaked);
    free(hidden);
    return 0;
}

/* DAC's upsampling ConvTranspose1d (kernel 2s, padding ceil(s / 2), output padding s % 2): T frames in, T s out.
 * Output m s + r - pad reads inputs m (tap r) and m - 1 (tap r + s): each phase r is computed over a block of m
 * (vectorised), then the phases are interleaved into place. w is [in, out, 2s]. */
void dac_conv_transpose(float *out, const float *x, const float *w, const float *bias, long batch, long in_ch,
                        long out_ch, long length, long stride) {
    enum { MB = 256 };
    float phase[16][MB + 1];
    if (stride > 16) return;
    const long pad = (stride + 1) / 2, kernel = 2 * stride, total = length * stride;
    for (long b = 0; b < batch; b++) {
        const float *xb = x + b * in_ch * length;
        for (long o = 0; o < out_ch; o++) {
            float *dst = out + (b * out_ch + o) * total;
            for (long m0 = 0; m0 <= length; m0 += MB) {  /* m runs to T: its tap r + s reads x[T - 1] */
                const long n = length + 1 - m0 < MB ? length + 1 - m0 : MB;
                for (long r = 0; r < stride; r++) {
                    float *acc = phase[r];
                    for (long i = 0; i < n; i++) acc[i] = bias ? bias[o] : 0.0f;
                    for (long c = 0; c < in_ch; c++) {
                        const float *row = xb + c * length;
                        const float now = w[(c * out_ch + o) * kernel + r];
                        const float before = w[(c * out_ch + o) * kernel + r + stride];
                        for (long i = 0; i < n; i++) {
                            const long m = m0 + i;
                            const float cur = m < length ? row[m] : 0.0f;
                            const float prev = m > 0 ? row[m - 1] : 0.0f;
                            acc[i] += now * cur + before * prev;
                        }
                    }
                }
                for (long i = 0; i < n; i++) {
                    const long base = (m0 + i) * stride - pad;
                    for (long r = 0; r < stride; r++) {
                        const long t = base + r;
                        if (t >= 0 && t < total) dst[t] = phase[r][i];
                    }
                }
            }
        }
    }
}
