/* The control plane's frames, in C: libshare/protocol/wire.py's format over the arbiter's socket.
 *
 * A frame is a 16-byte header (magic "LSCT", version 1, reserved, JSON length, payload length,
 * little-endian), a JSON object and a payload; file descriptors travel beside its first bytes
 * with SCM_RIGHTS. The driver trusts nothing it reads: a bad magic or version, a length past
 * LS_ICD_MAX_FRAME or more descriptors than the caller expects end the exchange with a negative
 * code (descriptors beyond the expected ones are closed at once), and every read is bounded by
 * the caller's timeout. ls_icd_dial checks that the listener runs as this user or root, and
 * while a control daemon supervises the pipe directory it waits for an arbiter that is not
 * listening yet (one is on its way), up to the caller's bound, as wire.py's dial does
 * (ls_icd_supervised says whether one does). ls_icd_send_fds sends descriptors with a frame
 * (reattach.c's import of a kept memfd). Functions return 0 (or a descriptor) or a negative errno. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "icd.h"

#define MAGIC 0x4C534354u
#define VERSION 1u
#define HEADER 16

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Connect to ``path``; long paths go through /proc/self/fd/N/NAME of their directory (sun_path
 * holds 108 bytes), as wire.py's unix_address does. */
static int connect_path(int sock, const char *path)
{
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    int directory = -1;
    int rc;
    if (strlen(path) < sizeof(address.sun_path)) {
        memcpy(address.sun_path, path, strlen(path) + 1);
    } else {
        const char *slash = strrchr(path, '/');
        char parent[4096];
        if (slash == NULL || (size_t)(slash - path) >= sizeof(parent))
            return -ENAMETOOLONG;
        memcpy(parent, path, (size_t)(slash - path));
        parent[slash - path] = '\0';
        directory = open(parent[0] ? parent : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (directory < 0)
            return -errno;
        rc = snprintf(address.sun_path, sizeof(address.sun_path), "/proc/self/fd/%d/%s", directory, slash + 1);
        if (rc < 0 || (size_t)rc >= sizeof(address.sun_path)) {
            close(directory);
            return -ENAMETOOLONG;
        }
    }
    rc = connect(sock, (struct sockaddr *)&address, sizeof(address)) < 0 ? -errno : 0;
    if (directory >= 0)
        close(directory);
    return rc;
}

/* Whether a control daemon supervises the directory of ``lock`` (it holds the lock): then no arbiter
 * listening means that a new one is on its way (paths.py's supervised). */
int ls_icd_supervised(const char *lock)
{
    int fd = open(lock, O_RDONLY | O_CLOEXEC);
    int held;
    if (fd < 0)
        return 0;
    held = flock(fd, LOCK_SH | LOCK_NB) < 0 && errno == EWOULDBLOCK;
    close(fd); /* (a lock taken here goes with the descriptor) */
    return held;
}

static int dial_once(const char *path)
{
    struct ucred peer;
    socklen_t size = sizeof(peer);
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int rc;
    if (sock < 0)
        return -errno;
    rc = connect_path(sock, path);
    if (rc == 0 && getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &size) < 0)
        rc = -errno;
    if (rc == 0 && peer.uid != 0 && peer.uid != getuid())
        rc = -EACCES; /* not an arbiter this user may trust with its data */
    if (rc < 0) {
        close(sock);
        return rc;
    }
    return sock;
}

int ls_icd_dial(const char *path, const char *supervisor_lock, int wait_ms)
{
    const struct timespec pause = {.tv_sec = 0, .tv_nsec = 10 * 1000 * 1000};
    int64_t deadline = now_ms() + wait_ms;
    for (;;) {
        int sock = dial_once(path);
        if (sock >= 0 || (sock != -ENOENT && sock != -ECONNREFUSED) || now_ms() >= deadline ||
            !ls_icd_supervised(supervisor_lock))
            return sock;
        nanosleep(&pause, NULL);
    }
}

static void put32(uint8_t *at, uint32_t value)
{
    for (int i = 0; i < 4; i++)
        at[i] = (uint8_t)(value >> (8 * i));
}

static uint32_t get32(const uint8_t *at)
{
    return (uint32_t)at[0] | (uint32_t)at[1] << 8 | (uint32_t)at[2] << 16 | (uint32_t)at[3] << 24;
}

int ls_icd_send(int sock, const char *json, size_t json_len, const void *payload, size_t payload_len)
{
    return ls_icd_send_fds(sock, json, json_len, payload, payload_len, NULL, 0);
}

/* The header's first byte with ``fds`` beside it (SCM_RIGHTS): 1 (sent), or a negative errno. */
static int send_fds(int sock, const uint8_t *header, const int *fds, int nfds)
{
    union {
        char buffer[CMSG_SPACE(LS_ICD_MAX_FDS * sizeof(int))];
        struct cmsghdr align;
    } control;
    struct iovec vector = {.iov_base = (void *)header, .iov_len = 1};
    struct msghdr message = {.msg_iov = &vector, .msg_iovlen = 1, .msg_control = control.buffer,
                             .msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int))};
    struct cmsghdr *c;
    ssize_t n;
    memset(&control, 0, sizeof(control));
    c = CMSG_FIRSTHDR(&message);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, (size_t)nfds * sizeof(int));
    do
        n = sendmsg(sock, &message, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : (int)n;
}

int ls_icd_send_fds(int sock, const char *json, size_t json_len, const void *payload, size_t payload_len,
                    const int *fds, int nfds)
{
    uint8_t header[HEADER];
    const struct {
        const void *bytes;
        size_t length;
    } parts[3] = {{header, HEADER}, {json, json_len}, {payload, payload_len}};
    if (json_len > LS_ICD_MAX_FRAME || payload_len > LS_ICD_MAX_FRAME - json_len)
        return -EMSGSIZE;
    put32(header, MAGIC);
    header[4] = VERSION & 0xff;
    header[5] = VERSION >> 8;
    header[6] = header[7] = 0;
    put32(header + 8, (uint32_t)json_len);
    put32(header + 12, (uint32_t)payload_len);
    if (nfds < 0 || nfds > LS_ICD_MAX_FDS)
        return -EINVAL;
    for (int part = 0; part < 3; part++) {
        size_t sent = 0;
        if (part == 0 && nfds > 0) { /* the descriptors travel beside the frame's first byte */
            int rc = send_fds(sock, header, fds, nfds);
            if (rc < 0)
                return rc;
            sent = (size_t)rc;
        }
        while (sent < parts[part].length) {
            ssize_t n = send(sock, (const uint8_t *)parts[part].bytes + sent, parts[part].length - sent, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                return -errno;
            sent += (size_t)n;
        }
    }
    return 0;
}

/* Keep the descriptors of one message's control data, up to ``max_fds`` in all; close the rest.
 * Returns 0, or -EPROTO when the frame carried descriptors it should not. */
static int take_fds(struct msghdr *message, struct ls_icd_frame *frame, int max_fds)
{
    int rc = (message->msg_flags & MSG_CTRUNC) ? -EPROTO : 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(message); c != NULL; c = CMSG_NXTHDR(message, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (frame->nfds < max_fds) {
                frame->fds[frame->nfds++] = fd;
            } else {
                close(fd);
                rc = -EPROTO;
            }
        }
    }
    return rc;
}

/* Read exactly ``size`` bytes into ``into`` before ``deadline`` (ms), taking descriptors. */
static int read_exactly(int sock, uint8_t *into, size_t size, struct ls_icd_frame *frame, int max_fds,
                        int64_t deadline)
{
    size_t got = 0;
    while (got < size) {
        union {
            char buffer[CMSG_SPACE(LS_ICD_MAX_FDS * sizeof(int))];
            struct cmsghdr align;
        } control;
        struct iovec vector = {.iov_base = into + got, .iov_len = size - got};
        struct msghdr message = {.msg_iov = &vector, .msg_iovlen = 1, .msg_control = control.buffer,
                                 .msg_controllen = sizeof(control.buffer)};
        struct pollfd waiting = {.fd = sock, .events = POLLIN};
        int64_t left = deadline - now_ms();
        int rc;
        if (left <= 0)
            return -ETIMEDOUT;
        rc = poll(&waiting, 1, (int)(left > 60000 ? 60000 : left));
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0)
            return -errno;
        if (rc == 0)
            continue;
        ssize_t n = recvmsg(sock, &message, MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0)
            return -errno;
        rc = take_fds(&message, frame, max_fds);
        if (rc < 0)
            return rc;
        if (n == 0)
            return -ECONNRESET; /* the arbiter went away */
        got += (size_t)n;
    }
    return 0;
}

void ls_icd_frame_free(struct ls_icd_frame *frame)
{
    free(frame->json);
    free(frame->payload);
    for (int i = 0; i < frame->nfds; i++)
        close(frame->fds[i]);
    memset(frame, 0, sizeof(*frame));
}

int ls_icd_recv(int sock, struct ls_icd_frame *frame, int max_fds, int timeout_ms)
{
    uint8_t header[HEADER];
    int64_t deadline = now_ms() + timeout_ms;
    uint32_t json_len, payload_len;
    int rc;
    memset(frame, 0, sizeof(*frame));
    if (max_fds < 0 || max_fds > LS_ICD_MAX_FDS)
        return -EINVAL;
    rc = read_exactly(sock, header, HEADER, frame, max_fds, deadline);
    if (rc < 0)
        goto fail;
    json_len = get32(header + 8);
    payload_len = get32(header + 12);
    if (get32(header) != MAGIC || (header[4] | header[5] << 8) != VERSION || json_len == 0 ||
        json_len > LS_ICD_MAX_FRAME || payload_len > LS_ICD_MAX_FRAME - json_len) {
        rc = -EPROTO;
        goto fail;
    }
    frame->json = malloc((size_t)json_len + 1);
    frame->payload = malloc(payload_len ? payload_len : 1);
    if (frame->json == NULL || frame->payload == NULL) {
        rc = -ENOMEM;
        goto fail;
    }
    rc = read_exactly(sock, (uint8_t *)frame->json, json_len, frame, max_fds, deadline);
    if (rc == 0)
        rc = read_exactly(sock, frame->payload, payload_len, frame, max_fds, deadline);
    if (rc < 0)
        goto fail;
    frame->json[json_len] = '\0';
    frame->json_len = json_len;
    frame->payload_len = payload_len;
    return 0;
fail:
    ls_icd_frame_free(frame);
    return rc;
}
