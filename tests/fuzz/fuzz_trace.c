/*
 * fuzz_trace.c: libFuzzer target for the hit-rate simulator's trace reader
 * (bench/hitrate/lkv_sim.c, lkv_sim_trace_load). The input is the trace file. Oracles: 0 or an
 * error with a message; an accepted trace has every document index below n_docs, and running
 * the simulator on it under a small budget succeeds.
 */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "lkv_err.h"
#include "lkv_sim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16) {
        return 0;
    }
    const char *path = fuzz_memfd_path(data, size);
    lkv_sim_trace t;
    memset(&t, 0, sizeof(t));
    char err[256];
    err[0] = '\0';
    int rc = lkv_sim_trace_load(path, 64, &t, err, sizeof(err));
    if (rc != 0) {
        if (err[0] == '\0') {
            abort();
        }
        return 0;
    }
    if (t.nreq == 0 || t.req_off[0] != 0) {
        abort();
    }
    for (uint64_t r = 0; r < t.nreq; r++) {
        if (t.req_off[r + 1] <= t.req_off[r]) {
            abort(); /* An empty request was kept (blank lines are skipped). */
        }
    }
    for (uint64_t i = 0; i < t.req_off[t.nreq]; i++) {
        if (t.docs[i] >= t.ndocs || t.doc_tokens[t.docs[i]] == 0) {
            abort();
        }
    }
    lkv_sim_cfg c;
    lkv_sim_cfg_default(&c);
    c.budget = 1u << 20;
    c.bytes_per_token = 64;
    lkv_sim_result res;
    if (lkv_sim_run(&t, &c, &res) != 0 || res.requests != t.nreq) {
        abort();
    }
    lkv_sim_trace_free(&t);
    return 0;
}
