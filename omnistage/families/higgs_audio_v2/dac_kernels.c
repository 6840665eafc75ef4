/* The tiny-channel passes of a DAC decoder, in one pass over memory each (built at first use by NativeLibrary).
 *
 * At a few channels and 4-24 kHz, a decode is many short passes: torch's Snake is four (a product, sin, square,
 * add), and a convolution an im2col copy and a product whose inner dimension is C * K. Here the Snake is one
 * loop with its own sin (reduced by pi, an odd polynomial of degree 11: within ~1e-7 of libm's on the reduced
 * range), and a convolution accumulates its taps into a block of outputs that stays in L1.
 * Layout: float32, contiguous [B, C, T]; weights [O, C, K]; stride 1, zero padding, output length T.
 */
#include <math.h>

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

/* out = x + sin(alpha x)^2 / (alpha + 1e-9), alpha per channel; out may be x. */
void dac_snake(float *out, const float *x, const float *alpha, long batch, long channels, long length) {
    for (long b = 0; b < batch; b++) {
        for (long c = 0; c < channels; c++) {
            const float a = alpha[c], inv = 1.0f / (a + 1e-9f);
            const float *src = x + (b * channels + c) * length;
            float *dst = out + (b * channels + c) * length;
            for (long t = 0; t < length; t++) {
                float v = src[t];
                dst[t] = v + sin_squared(a * v) * inv;
            }
        }
    }
}

#define BLOCK 512

/* out[b, o, t] = bias[o] + sum_c sum_k w[o, c, k] x[b, c, t + k dilation - pad] (zero outside [0, T)). */
void dac_conv1d(float *out, const float *x, const float *w, const float *bias, long batch, long in_ch, long out_ch,
                long length, long kernel, long dilation, long pad) {
    float acc[BLOCK];
    for (long b = 0; b < batch; b++) {
        for (long start = 0; start < length; start += BLOCK) {
            const long n = length - start < BLOCK ? length - start : BLOCK;
            for (long o = 0; o < out_ch; o++) {
                const float b0 = bias ? bias[o] : 0.0f;
                for (long i = 0; i < n; i++) acc[i] = b0;
                for (long c = 0; c < in_ch; c++) {
                    const float *row = x + (b * in_ch + c) * length;
                    const float *taps = w + (o * in_ch + c) * kernel;
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
                float *dst = out + (b * out_ch + o) * length + start;
                for (long i = 0; i < n; i++) dst[i] = acc[i];
            }
        }
    }
}
