/*
 * svc_tcp.h: the loopback TCP ceiling of the service benchmark.
 *
 * A plain TCP server on 127.0.0.1 (port 0), in the benchmark's own process, one thread per
 * accepted connection, and the matching client operations. It moves the same bytes as the
 * lazykv RPCs it stands beside, with nothing else: no framing beyond a 9-byte header, no
 * copies beyond the kernel's, no storage. It is the ceiling of what the RPCs could reach over
 * the same loopback on the same cores.
 *
 * Wire format of one request (client to server):
 *
 *     offset  size  field
 *     0       1     op: 'P' (put), 'G' (get), 'E' (echo)
 *     1       8     n, little-endian uint64
 *     9       n     payload ('P' and 'E' only)
 *
 * Replies: 'P' one byte (0) once all n bytes were received (into a 2 MiB scratch buffer, block
 * by block, as a server would stage blocks); 'G' n bytes of the shared source buffer; 'E' the
 * same n bytes back (n <= SVC_TCP_ECHO_MAX). TCP_NODELAY is set on both ends.
 *
 * Thread safety: the server runs its own threads; a client connection (an fd) is used by one
 * thread at a time.
 */
#ifndef SVC_TCP_H
#define SVC_TCP_H

#include <stddef.h>
#include <stdint.h>

#define SVC_TCP_ECHO_MAX 4096

typedef struct svc_tcp_server svc_tcp_server; /* Opaque. */

/* Starts a server on 127.0.0.1 with an ephemeral port. src (src_len bytes) is the source of
 * 'G' replies; it is borrowed and must outlive the server. *out is owned by the caller, freed
 * with svc_tcp_server_stop. Returns 0 or LKV_EIO. */
int svc_tcp_server_start(const void *src, size_t src_len, svc_tcp_server **out);

/* Port the server listens on. */
int svc_tcp_server_port(const svc_tcp_server *s);

/* Stops accepting, shuts every open connection down, joins the threads and frees s. Clients
 * should have closed their connections first. s may be NULL. */
void svc_tcp_server_stop(svc_tcp_server *s);

/* Connects to 127.0.0.1:port with TCP_NODELAY. Returns an fd (owned by the caller, close()) or
 * LKV_EIO. */
int svc_tcp_connect(int port);

/* Sends a 'P' request with len bytes of data (borrowed) and waits for the one-byte reply. */
int svc_tcp_put(int fd, const void *data, size_t len);

/* Sends a 'G' request for len bytes and receives them into scratch (scratch_len bytes, reused
 * cyclically: the bytes are received, not kept). */
int svc_tcp_get(int fd, size_t len, void *scratch, size_t scratch_len);

/* Sends len bytes (<= SVC_TCP_ECHO_MAX) of msg and receives them back into reply. */
int svc_tcp_echo(int fd, const void *msg, size_t len, void *reply);

#endif
