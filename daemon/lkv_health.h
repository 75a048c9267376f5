/*
 * lkv_health.h: the standard grpc.health.v1.Health service (Debian grpc-proto's health.proto).
 *
 * Check answers SERVING for the whole server (service "") and for each lazykv service name while
 * the daemon takes calls, NOT_SERVING while it starts (ready is 0: the cold index loads) and
 * once it drains, and NOT_FOUND for any other service name. Readiness probes ask this
 * (daemon/README.md, "Kubernetes probes"). Watch
 * is not registered: the engine answers it UNIMPLEMENTED, which the health protocol tells
 * clients to treat as "not supported, do not retry".
 */
#ifndef LKV_HEALTH_H
#define LKV_HEALTH_H

#include <stdatomic.h>

#include "lkv_server.h"

#define LKV_HEALTH_METHODS 1

typedef struct lkv_health {
    const char *const *services; /* NULL-terminated names reported SERVING (borrowed, static). */
    const atomic_int *ready;     /* Optional (NULL: always ready): NOT_SERVING while 0. */
} lkv_health;

/* Initialises *h (caller-owned) for services (borrowed, NULL-terminated). */
void lkv_health_init(lkv_health *h, const char *const *services);

/* Writes LKV_HEALTH_METHODS methods into out (entries borrow h); returns the count. */
int lkv_health_methods(lkv_health *h, lkv_method *out);

#endif
