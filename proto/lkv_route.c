/* lkv_route.c: routing hash and weighted rendezvous hashing (see lkv_route.h). */
#include "lkv_route.h"

#include <math.h>
#include <string.h>

#include <sodium.h>

static uint64_t le64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | b[i];
    }
    return v;
}

uint64_t lkv_route_hash(const uint8_t fp[LKV_ROUTE_FP_BYTES], const uint32_t *tokens, size_t n)
{
    static const char label[] = "lazykv-route-v1";
    crypto_generichash_state st;
    uint8_t out[16];
    crypto_generichash_init(&st, NULL, 0, sizeof(out));
    crypto_generichash_update(&st, (const uint8_t *)label, sizeof(label) - 1);
    crypto_generichash_update(&st, fp, LKV_ROUTE_FP_BYTES);
    uint8_t buf[4 * 256];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t t = tokens[i];
        buf[k++] = (uint8_t)t;
        buf[k++] = (uint8_t)(t >> 8);
        buf[k++] = (uint8_t)(t >> 16);
        buf[k++] = (uint8_t)(t >> 24);
        if (k == sizeof(buf)) {
            crypto_generichash_update(&st, buf, k);
            k = 0;
        }
    }
    if (k > 0) {
        crypto_generichash_update(&st, buf, k);
    }
    crypto_generichash_final(&st, out, sizeof(out));
    return le64(out);
}

uint64_t lkv_route_seed(const char *id)
{
    static const char label[] = "lazykv-member-v1";
    crypto_generichash_state st;
    uint8_t out[16];
    crypto_generichash_init(&st, NULL, 0, sizeof(out));
    crypto_generichash_update(&st, (const uint8_t *)label, sizeof(label) - 1);
    crypto_generichash_update(&st, (const uint8_t *)id, strlen(id));
    crypto_generichash_final(&st, out, sizeof(out));
    return le64(out);
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

double lkv_route_score(uint64_t seed, uint64_t weight, uint64_t route)
{
    uint64_t x = splitmix64(seed ^ route);
    double u = ((double)(x >> 11) + 0.5) / 9007199254740992.0;
    return (double)(weight == 0 ? 1 : weight) / -log(u);
}

int lkv_route_pick(const lkv_route_member *m, size_t n, uint64_t route)
{
    int best = -1;
    double bs = 0;
    for (size_t i = 0; i < n; i++) {
        double s = lkv_route_score(m[i].seed, m[i].weight, route);
        if (best < 0 || s > bs || (s == bs && strcmp(m[i].id, m[best].id) < 0)) {
            best = (int)i;
            bs = s;
        }
    }
    return best;
}
