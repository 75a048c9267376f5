/*
 * kt_rng.h: the kernels tests' random source. One splitmix64 stream per test process, seeded
 * from LKV_TEST_SEED when set (decimal or 0x hex), otherwise from the clock; the seed is printed
 * first so that any failure can be replayed with LKV_TEST_SEED=<seed>.
 */
#ifndef KT_RNG_H
#define KT_RNG_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t kt_state;

static inline uint64_t kt_next(void)
{
    uint64_t z = (kt_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Seeds the stream (env LKV_TEST_SEED or the clock) and prints the seed. */
static inline void kt_seed(const char *name)
{
    const char *env = getenv("LKV_TEST_SEED");
    uint64_t seed;
    if (env != NULL && *env != '\0') {
        seed = strtoull(env, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec;
    }
    kt_state = seed;
    fprintf(stderr, "%s: seed %llu (replay with LKV_TEST_SEED=%llu)\n", name,
            (unsigned long long)seed, (unsigned long long)seed);
}

/* Uniform integer in [lo, hi]. */
static inline int64_t kt_int(int64_t lo, int64_t hi)
{
    return lo + (int64_t)(kt_next() % (uint64_t)(hi - lo + 1));
}

/* Uniform double in [0, 1). */
static inline double kt_unif(void)
{
    return (double)(kt_next() >> 11) * (1.0 / 9007199254740992.0);
}

/* Standard normal (Box-Muller). */
static inline double kt_normal(void)
{
    double u = kt_unif(), v = kt_unif();
    return sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * v);
}

#endif
