/* Lossless codecs on KV-cache chunks through libzstd / liblz4 directly (what a C++ daemon would link), one thread.
 *
 *   cc -O3 -march=native -o cbench cbench.c -lzstd -llz4
 *   ./cbench FILE LAYERS TOKENS KV_HEADS HEAD_DIM ESIZE CHUNK_TOKENS REPS
 *
 * FILE is the KV in Cake's order [layer][K,V][token][kv_head][head_dim]; a chunk is the rows of CHUNK_TOKENS
 * consecutive tokens for every layer, laid out the same way (cake.ChunkLayout). Every scheme encodes each chunk on
 * its own; GB/s = raw bytes / median seconds over REPS passes over all chunks. Every decode is checked bit for bit.
 */
#define _POSIX_C_SOURCE 199309L
#include <lz4.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zstd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* little-endian esize-byte elements -> planes, most significant byte plane first */
static void shuffle(const uint8_t *in, uint8_t *out, size_t n, int e) {
    size_t count = n / e;
    if (e == 2) {
        uint8_t *hi = out, *lo = out + count;
        for (size_t i = 0; i < count; i++) { lo[i] = in[2 * i]; hi[i] = in[2 * i + 1]; }
    } else if (e == 4) {
        uint8_t *p3 = out, *p2 = out + count, *p1 = out + 2 * count, *p0 = out + 3 * count;
        for (size_t i = 0; i < count; i++) {
            p0[i] = in[4 * i]; p1[i] = in[4 * i + 1]; p2[i] = in[4 * i + 2]; p3[i] = in[4 * i + 3];
        }
    } else {
        for (size_t i = 0; i < count; i++)
            for (int k = 0; k < e; k++) out[(size_t)(e - 1 - k) * count + i] = in[i * e + k];
    }
}

static void unshuffle(const uint8_t *in, uint8_t *out, size_t n, int e) {
    size_t count = n / e;
    if (e == 2) {
        const uint8_t *hi = in, *lo = in + count;
        for (size_t i = 0; i < count; i++) { out[2 * i] = lo[i]; out[2 * i + 1] = hi[i]; }
    } else if (e == 4) {
        const uint8_t *p3 = in, *p2 = in + count, *p1 = in + 2 * count, *p0 = in + 3 * count;
        for (size_t i = 0; i < count; i++) {
            out[4 * i] = p0[i]; out[4 * i + 1] = p1[i]; out[4 * i + 2] = p2[i]; out[4 * i + 3] = p3[i];
        }
    } else {
        for (size_t i = 0; i < count; i++)
            for (int k = 0; k < e; k++) out[i * e + k] = in[(size_t)(e - 1 - k) * count + i];
    }
}

enum { Z1, Z3, LZ, SHUF_Z1_CONCAT, SHUF_Z1_SEP, SHUF_LZ_SEP, SHUF_Z1_HI_ONLY, SHUF_ONLY, NSCHEMES };
static const char *NAMES[] = {"zstd-1", "zstd-3", "lz4 (LZ4_compress_default)", "planes(concat)+zstd-1",
                              "planes(separate, raw if <3%)+zstd-1", "planes(separate, raw if <3%)+lz4",
                              "planes: zstd-1 on MSB plane only, rest raw", "shuffle only (no codec)"};

static ZSTD_CCtx *cctx;
static ZSTD_DCtx *dctx;
static int ESIZE;

static size_t zc(int lvl, const void *in, size_t n, void *out, size_t cap) {
    size_t r = ZSTD_compressCCtx(cctx, out, cap, in, n, lvl);
    if (ZSTD_isError(r)) { fprintf(stderr, "zstd: %s\n", ZSTD_getErrorName(r)); exit(1); }
    return r;
}
static size_t zd(const void *in, size_t n, void *out, size_t cap) {
    size_t r = ZSTD_decompressDCtx(dctx, out, cap, in, n);
    if (ZSTD_isError(r)) { fprintf(stderr, "zstd: %s\n", ZSTD_getErrorName(r)); exit(1); }
    return r;
}
static size_t lzc(const void *in, size_t n, void *out, size_t cap) {
    int r = LZ4_compress_default(in, out, (int)n, (int)cap);
    if (r <= 0) { fprintf(stderr, "lz4 compress failed\n"); exit(1); }
    return (size_t)r;
}
static size_t lzd(const void *in, size_t n, void *out, size_t cap) {
    int r = LZ4_decompress_safe(in, out, (int)n, (int)cap);
    if (r < 0) { fprintf(stderr, "lz4 decompress failed\n"); exit(1); }
    return (size_t)r;
}

/* Per-plane container: [u32 stored size | flag in the top bit] per plane, then the planes' payloads. */
static size_t enc_planes(int scheme, const uint8_t *in, size_t n, uint8_t *out, size_t cap, uint8_t *tmp) {
    int e = ESIZE;
    size_t plane = n / e, pos = 4 * (size_t)e;
    shuffle(in, tmp, n, e);
    for (int k = 0; k < e; k++) {
        const uint8_t *src = tmp + k * plane;
        size_t got = 0;
        int compress = scheme != SHUF_Z1_HI_ONLY || k == 0;
        if (compress)
            got = scheme == SHUF_LZ_SEP ? lzc(src, plane, out + pos, cap - pos) : zc(1, src, plane, out + pos, cap - pos);
        if (!compress || got > plane * 97 / 100) { memcpy(out + pos, src, plane); got = plane; compress = 0; }
        uint32_t hdr = (uint32_t)got | (compress ? 0x80000000u : 0);
        memcpy(out + 4 * k, &hdr, 4);
        pos += got;
    }
    return pos;
}

static void dec_planes(int scheme, const uint8_t *in, size_t n, uint8_t *out, uint8_t *tmp) {
    int e = ESIZE;
    size_t plane = n / e, pos = 4 * (size_t)e;
    for (int k = 0; k < e; k++) {
        uint32_t hdr;
        memcpy(&hdr, in + 4 * k, 4);
        size_t got = hdr & 0x7fffffffu;
        if (hdr & 0x80000000u) {
            size_t r = scheme == SHUF_LZ_SEP ? lzd(in + pos, got, tmp + k * plane, plane) : zd(in + pos, got, tmp + k * plane, plane);
            if (r != plane) { fprintf(stderr, "plane size\n"); exit(1); }
        } else {
            memcpy(tmp + k * plane, in + pos, plane);
        }
        pos += got;
    }
    unshuffle(tmp, out, n, e);
}

static size_t encode(int s, const uint8_t *in, size_t n, uint8_t *out, size_t cap, uint8_t *tmp) {
    switch (s) {
    case Z1: return zc(1, in, n, out, cap);
    case Z3: return zc(3, in, n, out, cap);
    case LZ: return lzc(in, n, out, cap);
    case SHUF_Z1_CONCAT: shuffle(in, tmp, n, ESIZE); return zc(1, tmp, n, out, cap);
    case SHUF_ONLY: shuffle(in, out, n, ESIZE); return n;
    default: return enc_planes(s, in, n, out, cap, tmp);
    }
}

static void decode(int s, const uint8_t *in, size_t len, size_t n, uint8_t *out, uint8_t *tmp) {
    switch (s) {
    case Z1: case Z3: zd(in, len, out, n); return;
    case LZ: lzd(in, len, out, n); return;
    case SHUF_Z1_CONCAT: zd(in, len, tmp, n); unshuffle(tmp, out, n, ESIZE); return;
    case SHUF_ONLY: unshuffle(in, out, n, ESIZE); return;
    default: dec_planes(s, in, n, out, tmp);
    }
}

int main(int argc, char **argv) {
    if (argc != 9) { fprintf(stderr, "usage: %s FILE L T H D ESIZE CHUNK_TOKENS REPS\n", argv[0]); return 2; }
    size_t L = atol(argv[2]), T = atol(argv[3]), H = atol(argv[4]), D = atol(argv[5]);
    ESIZE = atoi(argv[6]);
    size_t ct = atol(argv[7]);
    int reps = atoi(argv[8]);
    size_t row = H * D * ESIZE, total = L * 2 * T * row;
    uint8_t *all = malloc(total);
    FILE *f = fopen(argv[1], "rb");
    if (!f || fread(all, 1, total, f) != total) { fprintf(stderr, "read %s\n", argv[1]); return 1; }
    fclose(f);
    size_t nchunks = T / ct, cb = L * 2 * ct * row;
    uint8_t **chunk = malloc(nchunks * sizeof *chunk), **enc = malloc(nchunks * sizeof *enc);
    size_t *enclen = malloc(nchunks * sizeof *enclen);
    size_t cap = ZSTD_compressBound(cb) + LZ4_compressBound((int)cb) + 64;
    for (size_t c = 0; c < nchunks; c++) {   /* chunk c = [:, :, c*ct:(c+1)*ct] of [L][2][T][H][D] */
        chunk[c] = malloc(cb);
        enc[c] = malloc(cap);
        for (size_t lk = 0; lk < L * 2; lk++)
            memcpy(chunk[c] + lk * ct * row, all + (lk * T + c * ct) * row, ct * row);
    }
    uint8_t *tmp = malloc(cb), *out = malloc(cb);
    cctx = ZSTD_createCCtx();
    dctx = ZSTD_createDCtx();
    double *te = malloc(reps * sizeof(double)), *td = malloc(reps * sizeof(double));
    printf("{\"file\":\"%s\",\"chunk_tokens\":%zu,\"chunks\":%zu,\"chunk_bytes\":%zu,\"zstd\":\"%s\",\"lz4\":\"%s\",\"schemes\":{",
           argv[1], ct, nchunks, cb, ZSTD_versionString(), LZ4_versionString());
    for (int s = 0; s < NSCHEMES; s++) {
        size_t enc_total = 0;
        double rmin = 1e9, rmax = 0;
        for (size_t c = 0; c < nchunks; c++) {
            enclen[c] = encode(s, chunk[c], cb, enc[c], cap, tmp);
            memset(out, 0, cb);
            decode(s, enc[c], enclen[c], cb, out, tmp);
            if (memcmp(out, chunk[c], cb)) { fprintf(stderr, "%s: round trip differs\n", NAMES[s]); return 1; }
            enc_total += enclen[c];
            double r = (double)cb / enclen[c];
            if (r < rmin) rmin = r;
            if (r > rmax) rmax = r;
        }
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            for (size_t c = 0; c < nchunks; c++) enclen[c] = encode(s, chunk[c], cb, enc[c], cap, tmp);
            te[r] = now() - t0;
            t0 = now();
            for (size_t c = 0; c < nchunks; c++) decode(s, enc[c], enclen[c], cb, out, tmp);
            td[r] = now() - t0;
        }
        qsort(te, reps, sizeof(double), cmpd);
        qsort(td, reps, sizeof(double), cmpd);
        double raw = (double)cb * nchunks;
        printf("%s\"%s\":{\"ratio_aggregate\":%.4f,\"ratio_min_chunk\":%.4f,\"ratio_max_chunk\":%.4f,"
               "\"encode_GBps\":%.3f,\"decode_GBps\":%.3f}",
               s ? "," : "", NAMES[s], raw / enc_total, rmin, rmax, raw / te[reps / 2] / 1e9, raw / td[reps / 2] / 1e9);
        fflush(stdout);
    }
    printf("}}\n");
    return 0;
}
