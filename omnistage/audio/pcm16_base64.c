/* Float samples to the base64 text of their little-endian PCM16, in one pass (omnistage/audio/pcm_base64.py).
 *
 * Each sample is clipped to [-1, 1], scaled by 32767 in float32 and truncated toward zero, as
 * float_to_pcm16 does with numpy (NaN, which numpy's cast leaves undefined, is written as 0). Streamed chat
 * audio is sent this way: the numpy conversion, binascii's base64 (a byte at a time) and the copies between them
 * were a tenth of the API server's CPU at 64 streams. No -ffast-math: the clip and the product must round as
 * numpy's do.
 */
#include <stdint.h>
#include <string.h>

static const char ALPHABET[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static char PAIRS[4096][2];  /* two characters for each 12 bits: half the lookups of one per 6 bits */
static int ready;

#define BLOCK 1536  /* samples converted at a time (a multiple of 3): a loop the compiler vectorises */

static void fill_pairs(void) {
    for (int v = 0; v < 4096; v++) {
        PAIRS[v][0] = ALPHABET[v >> 6];
        PAIRS[v][1] = ALPHABET[v & 63];
    }
    ready = 1;
}

/* Little-endian machines only (x86, arm64 as Linux runs them): the int16 values are the PCM16 bytes. */
static void to_pcm16(const float *x, long n, int16_t *pcm) {
    for (long i = 0; i < n; i++) {
        float v = x[i];
        float c = v < -1.0f ? -1.0f : (v > 1.0f ? 1.0f : v);
        pcm[i] = v != v ? 0 : (int16_t)(c * 32767.0f);
    }
}

static char *put3(char *out, const uint8_t *b) {
    uint32_t v = ((uint32_t)b[0] << 16) | ((uint32_t)b[1] << 8) | b[2];
    memcpy(out, PAIRS[v >> 12], 2);
    memcpy(out + 2, PAIRS[v & 4095], 2);
    return out + 4;
}

/* Writes 4 * ceil(2n / 3) characters to out; returns how many. */
long pcm16_base64(const float *samples, long n, char *out) {
    if (!ready) fill_pairs();  /* the same table whichever thread fills it first */
    int16_t pcm[BLOCK];
    const uint8_t *bytes = (const uint8_t *)pcm;
    char *start = out;
    long i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        to_pcm16(samples + i, BLOCK, pcm);
        for (int j = 0; j < 2 * BLOCK; j += 3) out = put3(out, bytes + j);
    }
    long left = n - i;
    to_pcm16(samples + i, left, pcm);
    long whole = 2 * left / 3 * 3, j = 0;
    for (; j < whole; j += 3) out = put3(out, bytes + j);
    if (2 * left - whole == 1) {
        uint32_t v = (uint32_t)bytes[j] << 16;
        out[0] = ALPHABET[v >> 18];
        out[1] = ALPHABET[(v >> 12) & 63];
        out[2] = out[3] = '=';
        out += 4;
    } else if (2 * left - whole == 2) {
        uint32_t v = ((uint32_t)bytes[j] << 16) | ((uint32_t)bytes[j + 1] << 8);
        out[0] = ALPHABET[v >> 18];
        out[1] = ALPHABET[(v >> 12) & 63];
        out[2] = ALPHABET[(v >> 6) & 63];
        out[3] = '=';
        out += 4;
    }
    return (long)(out - start);
}
