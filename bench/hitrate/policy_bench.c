/*
 * policy_bench.c: per-operation cost and memory of every eviction policy kind
 * (storage/lkv_policy.c), all kinds in the same run, LRU first as the baseline.
 *
 *   policy_bench [--requests N] [--ids N] [--entries N] [--json FILE]
 *
 * A request is what lazykvd and the simulator do per document use: record (sketch), touch; on
 * a miss would_admit and admit (evicting); then pin and unpin (the in-flight lease). Ids are
 * drawn Zipf(0.9) over --ids (1,000,000) ids, precomputed so the RNG is not timed; sizes are
 * 1 to 64 units (by id) against a budget of --entries (20,000) x 32.5 units, so the cache is
 * full and evicts on most misses. Time is CPU time (CLOCK_PROCESS_CPUTIME_ID) of the request
 * loop only. Memory per tracked entry: the entry and its hash slots (worst case after a
 * table doubling), plus the sketch divided by the entries present.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lkv_log.h"
#include "lkv_policy.h"

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t x = *s;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int main(int argc, char **argv)
{
    uint64_t nreq = 5000000, nids = 1000000, entries = 20000;
    const char *json = NULL;
    static const struct option lo[] = {{"requests", 1, 0, 'r'},
                                       {"ids", 1, 0, 'i'},
                                       {"entries", 1, 0, 'e'},
                                       {"json", 1, 0, 'j'},
                                       {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'r':
            nreq = strtoull(optarg, NULL, 10);
            break;
        case 'i':
            nids = strtoull(optarg, NULL, 10);
            break;
        case 'e':
            entries = strtoull(optarg, NULL, 10);
            break;
        case 'j':
            json = optarg;
            break;
        default:
            fprintf(stderr, "usage: policy_bench [--requests N] [--ids N] [--entries N] "
                            "[--json FILE]\n");
            return 2;
        }
    }
    if (nreq == 0 || nids == 0 || entries == 0) {
        return 2;
    }
    /* Zipf(0.9) over nids by inversion of a cumulative table (built once, not timed). */
    double *cdf = lkv_xmalloc(nids * sizeof(double));
    double sum = 0;
    for (uint64_t i = 0; i < nids; i++) {
        sum += pow((double)(i + 1), -0.9);
        cdf[i] = sum;
    }
    uint64_t *ids = lkv_xmalloc(nreq * sizeof(uint64_t)), s = 42;
    for (uint64_t q = 0; q < nreq; q++) {
        double u = (double)(next(&s) >> 11) * 0x1.0p-53 * sum;
        uint64_t lo_i = 0, hi = nids - 1;
        while (lo_i < hi) {
            uint64_t mid = (lo_i + hi) / 2;
            if (cdf[mid] > u) {
                hi = mid;
            } else {
                lo_i = mid + 1;
            }
        }
        /* Scrambled ids (the store's slot ids are not dense); the low 6 bits give the size. */
        uint64_t h = lo_i * 0x9e3779b97f4a7c15ull;
        ids[q] = ((h ^ (h >> 29)) & ~63ull) | (lo_i & 63);
    }
    free(cdf);
    uint64_t budget = entries * 65 / 2;
    FILE *js = json != NULL ? fopen(json, "w") : NULL;
    if (json != NULL && js == NULL) {
        perror(json);
        return 1;
    }
    printf("# %llu requests, Zipf(0.9) over %llu ids, sizes 1..64, budget %llu units (about "
           "%llu entries); CPU time of the request loop\n",
           (unsigned long long)nreq, (unsigned long long)nids, (unsigned long long)budget,
           (unsigned long long)entries);
    printf("%-10s %8s %10s %10s %8s %8s %12s %12s\n", "policy", "hit%", "ns/req", "Mreq/s",
           "vs lru", "entries", "B/entry", "sketch B/e");
    if (js != NULL) {
        fprintf(js,
                "{\n  \"requests\": %llu, \"ids\": %llu, \"budget_units\": %llu,\n  \"kinds\": [",
                (unsigned long long)nreq, (unsigned long long)nids, (unsigned long long)budget);
    }
    double lru_ns = 0;
    for (int k = 0; k < LKV_POLICY__COUNT; k++) {
        lkv_policy *p;
        if (lkv_policy_create(k, budget, &p) != 0) {
            return 1;
        }
        (void)lkv_policy_sketch_size(p, 4 * entries);
        uint64_t hits = 0;
        double t0 = cpu_s();
        for (uint64_t q = 0; q < nreq; q++) {
            uint64_t id = ids[q], bytes = 1 + (id & 63);
            lkv_policy_record(p, id);
            if (lkv_policy_touch(p, id) == 0) {
                hits++;
            } else if (!lkv_policy_would_admit(p, id, bytes, 1) ||
                       lkv_policy_admit(p, id, bytes, 1, NULL, NULL) != 0) {
                continue;
            }
            (void)lkv_policy_pin(p, id);
            (void)lkv_policy_unpin(p, id);
        }
        double dt = cpu_s() - t0;
        double ns = dt * 1e9 / (double)nreq;
        lru_ns = k == LKV_POLICY_LRU ? ns : lru_ns;
        uint64_t n = lkv_policy_count(p);
        double sk = n ? (double)lkv_policy_sketch_bytes(p) / (double)n : 0;
        printf("%-10s %8.2f %10.1f %10.2f %7.2fx %8llu %12llu %12.1f\n", lkv_policy_name(k),
               100.0 * (double)hits / (double)nreq, ns, 1e3 / ns, ns / lru_ns,
               (unsigned long long)n, (unsigned long long)lkv_policy_entry_bytes(), sk);
        if (js != NULL) {
            fprintf(js,
                    "%s\n    {\"policy\": \"%s\", \"hit_pct\": %.3f, \"ns_per_request\": %.2f, "
                    "\"mreq_per_cpu_s\": %.3f, \"vs_lru\": %.3f, \"entries\": %llu, "
                    "\"entry_bytes\": %llu, \"sketch_bytes_per_entry\": %.2f}",
                    k ? "," : "", lkv_policy_name(k), 100.0 * (double)hits / (double)nreq, ns,
                    1e3 / ns, ns / lru_ns, (unsigned long long)n,
                    (unsigned long long)lkv_policy_entry_bytes(), sk);
        }
        lkv_policy_destroy(p);
    }
    if (js != NULL) {
        fprintf(js, "\n  ]\n}\n");
        fclose(js);
    }
    free(ids);
    return 0;
}
