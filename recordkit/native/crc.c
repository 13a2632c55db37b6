/*
 * recordkit.native._ext: CRC-32C, as TFRecord framing uses it (Castagnoli polynomial).
 *
 * Three back-ends, one chosen at import by rk_crc_init: slice-by-8 tables (every CPU,
 * ~1.5-2 GB/s), SSE4.2's crc32 instruction on three interleaved streams (x86-64), and
 * ARMv8's CRC instructions (when the compiler targets them). A hardware path is taken
 * only after it agrees with the tables on every code path (a self-test). Each comes
 * with a copy that computes the CRC of what it copies in the same pass over memory
 * (rk_crc32c_copy: the fused CRC-and-copy of large values).
 */
#include "recordkit.h"

#define CRC_POLY 0x82F63B78u /* Castagnoli, reflected */

static uint32_t crc_table[8][256];

static void crc_init_tables(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (CRC_POLY & (0u - (c & 1u)));
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
}

/* Slice-by-8: ~1.5-2 GB/s, the path when the CPU has no CRC instruction. */
uint32_t rk_crc32c_sw(uint32_t crc, const uint8_t *p, size_t len) {
    uint32_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
        len--;
    }
    while (len >= 8) {
        uint64_t w = ld64le(p) ^ c;
        c = crc_table[7][w & 0xFF] ^ crc_table[6][(w >> 8) & 0xFF] ^
            crc_table[5][(w >> 16) & 0xFF] ^ crc_table[4][(w >> 24) & 0xFF] ^
            crc_table[3][(w >> 32) & 0xFF] ^ crc_table[2][(w >> 40) & 0xFF] ^
            crc_table[1][(w >> 48) & 0xFF] ^ crc_table[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return ~c;
}

#define LONG_BLOCK 8192
#define SHORT_BLOCK 256

#ifdef RK_X86
/*
 * SSE4.2 crc32 has a latency of 3 cycles and a throughput of 1 per cycle, so
 * large buffers are split into three streams computed together and joined with
 * a "shift by N zero bytes" operator (Mark Adler's construction). The operator
 * for a fixed N is linear over GF(2), tabulated per byte of the CRC.
 */
static uint32_t crc_long[4][256];
static uint32_t crc_short[4][256];

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1) sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

/* The operator that appends len zero bytes (len a power of two) to a CRC register. */
static void crc_zeros_op(uint32_t *even, size_t len) {
    uint32_t odd[32];
    uint32_t row = 1;
    odd[0] = CRC_POLY; /* one zero bit */
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four zero bits */
    do {
        gf2_square(even, odd); /* first pass: one zero byte */
        len >>= 1;
        if (len == 0) return;
        gf2_square(odd, even);
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof(odd));
}

static void crc_zeros_table(uint32_t zeros[4][256], size_t len) {
    uint32_t op[32];
    crc_zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        zeros[0][n] = gf2_times(op, n);
        zeros[1][n] = gf2_times(op, n << 8);
        zeros[2][n] = gf2_times(op, n << 16);
        zeros[3][n] = gf2_times(op, n << 24);
    }
}

static inline uint32_t crc_shift(uint32_t zeros[4][256], uint32_t crc) {
    return zeros[0][crc & 0xFF] ^ zeros[1][(crc >> 8) & 0xFF] ^ zeros[2][(crc >> 16) & 0xFF] ^
           zeros[3][crc >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const uint8_t *p,
                                                               size_t len) {
    uint64_t c0 = crc ^ 0xFFFFFFFFu, c1, c2;
    while (len && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        len--;
    }
    while (len >= 3 * LONG_BLOCK) {
        const uint8_t *end = p + LONG_BLOCK;
        c1 = c2 = 0;
        do {
            c0 = _mm_crc32_u64(c0, ld64le(p));
            c1 = _mm_crc32_u64(c1, ld64le(p + LONG_BLOCK));
            c2 = _mm_crc32_u64(c2, ld64le(p + 2 * LONG_BLOCK));
            p += 8;
        } while (p < end);
        c0 = crc_shift(crc_long, (uint32_t)c0) ^ c1;
        c0 = crc_shift(crc_long, (uint32_t)c0) ^ c2;
        p += 2 * LONG_BLOCK;
        len -= 3 * LONG_BLOCK;
    }
    while (len >= 3 * SHORT_BLOCK) {
        const uint8_t *end = p + SHORT_BLOCK;
        c1 = c2 = 0;
        do {
            c0 = _mm_crc32_u64(c0, ld64le(p));
            c1 = _mm_crc32_u64(c1, ld64le(p + SHORT_BLOCK));
            c2 = _mm_crc32_u64(c2, ld64le(p + 2 * SHORT_BLOCK));
            p += 8;
        } while (p < end);
        c0 = crc_shift(crc_short, (uint32_t)c0) ^ c1;
        c0 = crc_shift(crc_short, (uint32_t)c0) ^ c2;
        p += 2 * SHORT_BLOCK;
        len -= 3 * SHORT_BLOCK;
    }
    const uint8_t *end = p + (len & ~(size_t)7);
    while (p < end) {
        c0 = _mm_crc32_u64(c0, ld64le(p));
        p += 8;
    }
    len &= 7;
    while (len--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return (uint32_t)c0 ^ 0xFFFFFFFFu;
}

/* The same, storing every word it reads to d: CRC and copy in one pass over memory. */
__attribute__((target("sse4.2"))) static uint32_t crc32c_copy_sse42(uint32_t crc, const uint8_t *p,
                                                                    uint8_t *d, size_t len) {
    uint64_t c0 = crc ^ 0xFFFFFFFFu, c1, c2, x, y, z;
    /* Align the stores, not the loads: a store split across cache lines costs
     * far more than a split load (half the throughput, measured). */
    while (len && ((uintptr_t)d & 7)) {
        *d++ = *p;
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        len--;
    }
#define RK_STEP3(B)                                                                              \
    do {                                                                                         \
        memcpy(&x, p, 8);                                                                        \
        memcpy(&y, p + (B), 8);                                                                  \
        memcpy(&z, p + 2 * (B), 8);                                                              \
        c0 = _mm_crc32_u64(c0, x);                                                               \
        c1 = _mm_crc32_u64(c1, y);                                                               \
        c2 = _mm_crc32_u64(c2, z);                                                               \
        memcpy(d, &x, 8);                                                                        \
        memcpy(d + (B), &y, 8);                                                                  \
        memcpy(d + 2 * (B), &z, 8);                                                              \
        p += 8;                                                                                  \
        d += 8;                                                                                  \
    } while (0)
    while (len >= 3 * LONG_BLOCK) {
        const uint8_t *end = p + LONG_BLOCK;
        c1 = c2 = 0;
        do RK_STEP3(LONG_BLOCK);
        while (p < end);
        c0 = crc_shift(crc_long, (uint32_t)c0) ^ c1;
        c0 = crc_shift(crc_long, (uint32_t)c0) ^ c2;
        p += 2 * LONG_BLOCK;
        d += 2 * LONG_BLOCK;
        len -= 3 * LONG_BLOCK;
    }
    while (len >= 3 * SHORT_BLOCK) {
        const uint8_t *end = p + SHORT_BLOCK;
        c1 = c2 = 0;
        do RK_STEP3(SHORT_BLOCK);
        while (p < end);
        c0 = crc_shift(crc_short, (uint32_t)c0) ^ c1;
        c0 = crc_shift(crc_short, (uint32_t)c0) ^ c2;
        p += 2 * SHORT_BLOCK;
        d += 2 * SHORT_BLOCK;
        len -= 3 * SHORT_BLOCK;
    }
#undef RK_STEP3
    while (len >= 8) {
        memcpy(&x, p, 8);
        c0 = _mm_crc32_u64(c0, x);
        memcpy(d, &x, 8);
        p += 8;
        d += 8;
        len -= 8;
    }
    while (len--) {
        *d++ = *p;
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    }
    return (uint32_t)c0 ^ 0xFFFFFFFFu;
}
#endif /* RK_X86 */

#ifdef RK_ARM
static uint32_t crc32c_arm(uint32_t crc, const uint8_t *p, size_t len) {
    uint32_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = __crc32cb(c, *p++);
        len--;
    }
    while (len >= 8) {
        c = __crc32cd(c, ld64le(p));
        p += 8;
        len -= 8;
    }
    while (len--) c = __crc32cb(c, *p++);
    return ~c;
}
#endif

rk_crc_fn rk_crc32c = rk_crc32c_sw;
const char *rk_crc32c_name = "software";

/* Copy and CRC in cache-sized pieces, so the CRC reads what the copy just touched. */
static uint32_t crc32c_copy_generic(uint32_t crc, const uint8_t *p, uint8_t *d, size_t len) {
    while (len) {
        size_t n = len < 65536 ? len : 65536;
        memcpy(d, p, n);
        crc = rk_crc32c(crc, p, n);
        p += n;
        d += n;
        len -= n;
    }
    return crc;
}

rk_crc_copy_fn rk_crc32c_copy = crc32c_copy_generic;

/* Pick the hardware path if the CPU has one and it agrees with the tables. */
void rk_crc_init(void) {
    static int done = 0;
    if (done) return;
    done = 1;
    crc_init_tables();
    rk_crc_fn hw = NULL;
    rk_crc_copy_fn hw_copy = NULL;
    const char *name = NULL;
#ifdef RK_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        crc_zeros_table(crc_long, LONG_BLOCK);
        crc_zeros_table(crc_short, SHORT_BLOCK);
        hw = crc32c_sse42;
        hw_copy = crc32c_copy_sse42;
        name = "sse4.2";
    }
#endif
#ifdef RK_ARM
    hw = crc32c_arm;
    name = "armv8-crc";
#endif
    if (!hw) return;
    /* Self-test over every code path (head alignment, both block sizes, tail). */
    static uint8_t probe[3 * LONG_BLOCK + 3 * SHORT_BLOCK + 77], copy[sizeof(probe)];
    uint32_t x = 0x12345678u;
    for (size_t i = 0; i < sizeof(probe); i++) {
        x = x * 1103515245u + 12345u;
        probe[i] = (uint8_t)(x >> 24);
    }
    static const size_t lens[] = {0, 1, 7, 8, 9, 767, 768, 769, 3 * LONG_BLOCK + 3 * SHORT_BLOCK + 70};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        for (size_t start = 0; start < 4; start++) {
            uint32_t want = rk_crc32c_sw(0x9E3779B9u, probe + start, lens[i]);
            if (hw(0x9E3779B9u, probe + start, lens[i]) != want) return;
            if (hw_copy) {
                memset(copy, 0, sizeof(copy));
                if (hw_copy(0x9E3779B9u, probe + start, copy + 1, lens[i]) != want ||
                    memcmp(copy + 1, probe + start, lens[i]) != 0)
                    return;
            }
        }
    }
    rk_crc32c = hw;
    rk_crc32c_name = name;
    if (hw_copy) rk_crc32c_copy = hw_copy;
}
