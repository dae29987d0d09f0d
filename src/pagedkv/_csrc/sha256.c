/* SHA-256 (FIPS 180-4, section 6.2) for the compiled core; see sha256.h.
 *
 * The round constants K (section 4.2.2: the first 32 bits of the fractional parts of the
 * cube roots of the first 64 primes) and the initial hash value H(0) (section 5.3.3: the
 * same for the square roots of the first 8 primes) were computed with integer roots. */
#include "sha256.h"

#include <string.h>

static const uint32_t K256[64] = {
    0x428a2f98U, 0x71374491U, 0xb5c0fbcfU, 0xe9b5dba5U, 0x3956c25bU, 0x59f111f1U, 0x923f82a4U, 0xab1c5ed5U,
    0xd807aa98U, 0x12835b01U, 0x243185beU, 0x550c7dc3U, 0x72be5d74U, 0x80deb1feU, 0x9bdc06a7U, 0xc19bf174U,
    0xe49b69c1U, 0xefbe4786U, 0x0fc19dc6U, 0x240ca1ccU, 0x2de92c6fU, 0x4a7484aaU, 0x5cb0a9dcU, 0x76f988daU,
    0x983e5152U, 0xa831c66dU, 0xb00327c8U, 0xbf597fc7U, 0xc6e00bf3U, 0xd5a79147U, 0x06ca6351U, 0x14292967U,
    0x27b70a85U, 0x2e1b2138U, 0x4d2c6dfcU, 0x53380d13U, 0x650a7354U, 0x766a0abbU, 0x81c2c92eU, 0x92722c85U,
    0xa2bfe8a1U, 0xa81a664bU, 0xc24b8b70U, 0xc76c51a3U, 0xd192e819U, 0xd6990624U, 0xf40e3585U, 0x106aa070U,
    0x19a4c116U, 0x1e376c08U, 0x2748774cU, 0x34b0bcb5U, 0x391c0cb3U, 0x4ed8aa4aU, 0x5b9cca4fU, 0x682e6ff3U,
    0x748f82eeU, 0x78a5636fU, 0x84c87814U, 0x8cc70208U, 0x90befffaU, 0xa4506cebU, 0xbef9a3f7U, 0xc67178f2U,
};

static const uint32_t H0[8] = {
    0x6a09e667U, 0xbb67ae85U, 0x3c6ef372U, 0xa54ff53aU,
    0x510e527fU, 0x9b05688cU, 0x1f83d9abU, 0x5be0cd19U,
};

typedef void (*compress_fn)(uint32_t state[8], const uint8_t *blocks, size_t num_blocks);

static inline uint32_t rotr(uint32_t x, unsigned n) { return (x >> n) | (x << (32 - n)); }

static inline uint32_t load_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline void store_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Section 6.2.2, steps 1-4, once per 64-byte block. */
static void compress_portable(uint32_t state[8], const uint8_t *blocks, size_t num_blocks) {
    uint32_t w[64];
    for (size_t b = 0; b < num_blocks; b++, blocks += 64) {
        for (int t = 0; t < 16; t++) w[t] = load_be32(blocks + 4 * t);
        for (int t = 16; t < 64; t++) {
            uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
            uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
            w[t] = s1 + w[t - 7] + s0 + w[t - 16];
        }
        uint32_t a = state[0], b_ = state[1], c = state[2], d = state[3];
        uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
        for (int t = 0; t < 64; t++) {
            uint32_t big_s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
            uint32_t ch = (e & f) ^ (~e & g);
            uint32_t t1 = h + big_s1 + ch + K256[t] + w[t];
            uint32_t big_s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
            uint32_t maj = (a & b_) ^ (a & c) ^ (b_ & c);
            uint32_t t2 = big_s0 + maj;
            h = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b_;
            b_ = a;
            a = t1 + t2;
        }
        state[0] += a;
        state[1] += b_;
        state[2] += c;
        state[3] += d;
        state[4] += e;
        state[5] += f;
        state[6] += g;
        state[7] += h;
    }
}

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define PK_HAVE_SHANI 1
#include <cpuid.h>
#include <immintrin.h>

/* Four rounds of group g (message words w = W[4g .. 4g+3]): two SHA256RNDS2, each two
 * rounds; the first leaves the new ABEF in cdgh, the second the next one in abef, so cdgh
 * then holds the state two rounds back: this group's C, D, G, H. */
#define SHANI_ROUNDS4(g, w)                                                          \
    do {                                                                             \
        __m128i wk_ = _mm_add_epi32((w), _mm_loadu_si128((const __m128i *)&K256[4 * (g)])); \
        cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk_);                               \
        abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk_, 0x0E));      \
    } while (0)

/* The next four message words over w16 (section 6.2.2 step 1: W[t] = s1(W[t-2]) +
 * W[t-7] + s0(W[t-15]) + W[t-16]) from the four groups before them, oldest first. */
#define SHANI_SCHEDULE(w16, w12, w8, w4)                                             \
    (w16) = _mm_sha256msg2_epu32(                                                    \
        _mm_add_epi32(_mm_sha256msg1_epu32((w16), (w12)), _mm_alignr_epi8((w4), (w8), 4)), (w4))

/* The same compression on the SHA extensions. The state lives in two registers, ABEF and
 * CDGH (A and C in the top lanes), as SHA256RNDS2 expects; each SHA256RNDS2 does two
 * rounds, SHA256MSG1/MSG2 extend the message schedule four words at a time. */
__attribute__((target("sha,sse4.1,ssse3")))
static void compress_shani(uint32_t state[8], const uint8_t *blocks, size_t num_blocks) {
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    __m128i abcd = _mm_loadu_si128((const __m128i *)&state[0]);
    __m128i efgh = _mm_loadu_si128((const __m128i *)&state[4]);
    __m128i badc = _mm_shuffle_epi32(abcd, 0xB1);  /* lanes B A D C */
    __m128i hgfe = _mm_shuffle_epi32(efgh, 0x1B);  /* lanes H G F E */
    __m128i abef = _mm_alignr_epi8(badc, hgfe, 8);  /* lanes F E B A */
    __m128i cdgh = _mm_blend_epi16(hgfe, badc, 0xF0);  /* lanes H G D C */
    for (size_t b = 0; b < num_blocks; b++, blocks += 64) {
        __m128i saved_abef = abef, saved_cdgh = cdgh;
        __m128i m0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(blocks + 0)), bswap);
        __m128i m1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(blocks + 16)), bswap);
        __m128i m2 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(blocks + 32)), bswap);
        __m128i m3 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(blocks + 48)), bswap);
        SHANI_ROUNDS4(0, m0);
        SHANI_ROUNDS4(1, m1);
        SHANI_ROUNDS4(2, m2);
        SHANI_ROUNDS4(3, m3);
        for (int g = 4; g < 16; g += 4) {
            SHANI_SCHEDULE(m0, m1, m2, m3);
            SHANI_ROUNDS4(g, m0);
            SHANI_SCHEDULE(m1, m2, m3, m0);
            SHANI_ROUNDS4(g + 1, m1);
            SHANI_SCHEDULE(m2, m3, m0, m1);
            SHANI_ROUNDS4(g + 2, m2);
            SHANI_SCHEDULE(m3, m0, m1, m2);
            SHANI_ROUNDS4(g + 3, m3);
        }
        abef = _mm_add_epi32(abef, saved_abef);
        cdgh = _mm_add_epi32(cdgh, saved_cdgh);
    }
    __m128i feba = _mm_shuffle_epi32(abef, 0x1B);  /* lanes A B E F */
    __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);  /* lanes G H C D */
    abcd = _mm_blend_epi16(feba, dchg, 0xF0);
    efgh = _mm_alignr_epi8(dchg, feba, 8);
    _mm_storeu_si128((__m128i *)&state[0], abcd);
    _mm_storeu_si128((__m128i *)&state[4], efgh);
}

static int cpu_has_shani(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    int sse41 = (c >> 19) & 1, ssse3 = (c >> 9) & 1;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return sse41 && ssse3 && ((b >> 29) & 1);
}
#endif

static compress_fn compress = compress_portable;
static int accelerated = 0;
static int detected = 0;

void pk_sha256_init(void) {
#ifdef PK_HAVE_SHANI
    if (cpu_has_shani()) detected = 1;
#endif
    pk_sha256_force_portable(0);
}

void pk_sha256_force_portable(int portable) {
#ifdef PK_HAVE_SHANI
    if (detected && !portable) {
        compress = compress_shani;
        accelerated = 1;
        return;
    }
#endif
    (void)portable;
    compress = compress_portable;
    accelerated = 0;
}

int pk_sha256_accelerated(void) { return accelerated; }

/* Section 5.1.1 padding: 0x80, zeros, then the message length in bits (64-bit big
 * endian), to a multiple of 64 bytes. */
void pk_sha256(const uint8_t *data, size_t len, uint8_t out[32]) {
    uint32_t state[8];
    memcpy(state, H0, sizeof state);
    size_t full = len / 64;
    if (full) compress(state, data, full);
    uint8_t tail[128];
    size_t rest = len - full * 64;
    memcpy(tail, data + full * 64, rest);
    tail[rest] = 0x80;
    size_t tail_len = rest + 9 <= 64 ? 64 : 128;
    memset(tail + rest + 1, 0, tail_len - rest - 1);
    uint64_t bits = (uint64_t)len * 8;
    for (int i = 0; i < 8; i++) tail[tail_len - 1 - i] = (uint8_t)(bits >> (8 * i));
    compress(state, tail, tail_len / 64);
    for (int i = 0; i < 8; i++) store_be32(out + 4 * i, state[i]);
}
