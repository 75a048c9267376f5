/* lkv_health.c: grpc.health.v1.Health/Check (see lkv_health.h). */
#include "lkv_health.h"

#include <stdio.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "lkv_err.h"

static int check(void *arg, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_health *h = arg;
    const Grpc__Health__V1__HealthCheckRequest *req =
        (const Grpc__Health__V1__HealthCheckRequest *)m;
    const char *name = req->service != NULL ? req->service : "";
    int known = name[0] == '\0';
    for (int i = 0; !known && h->services[i] != NULL; i++) {
        known = strcmp(name, h->services[i]) == 0;
    }
    if (!known) {
        char list[256];
        size_t n = 0;
        list[0] = '\0';
        for (int i = 0; h->services[i] != NULL && n < sizeof(list); i++) {
            int w = snprintf(list + n, sizeof(list) - n, ", %s", h->services[i]);
            n += w > 0 ? (size_t)w : 0;
        }
        return lkv_rpc_errorf(rpc, LKV_ENOTFOUND, "unknown service '%.100s' (known: ''%s)", name,
                              list);
    }
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    int ready = h->ready == NULL || atomic_load_explicit(h->ready, memory_order_acquire);
    resp.status = lkv_rpc_server_draining(rpc) || !ready
                      ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
                      : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    return lkv_rpc_reply(rpc, &resp.base);
}

void lkv_health_init(lkv_health *h, const char *const *services)
{
    h->services = services;
    h->ready = NULL;
}

int lkv_health_methods(lkv_health *h, lkv_method *out)
{
    lkv_method m = {.path = "/grpc.health.v1.Health/Check",
                    .kind = LKV_RPC_UNARY,
                    .req_desc = &grpc__health__v1__health_check_request__descriptor,
                    .svc = h,
                    .unary = check,
                    /* A service name: 4 KiB is ample (lkv_method.max_request_bytes). */
                    .max_request_bytes = 4096};
    out[0] = m;
    return LKV_HEALTH_METHODS;
}
