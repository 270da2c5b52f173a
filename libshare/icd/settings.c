/* The session's options, read from the environment as libshare/settings.py's client rows say.
 *
 * LIBSHARE_PIPE_DIRECTORY (else $XDG_RUNTIME_DIR/libshare when that directory is writable, else
 * /tmp/libshare-UID) holds the arbiter's socket, "control", and the control daemon's lock file,
 * "control-daemon.pid" (libshare/protocol/paths.py). LIBSHARE_CLIENT_NAME,
 * LIBSHARE_GROUP, LIBSHARE_CLIENT_PRIORITY and LIBSHARE_ACTIVE_THREAD_PERCENTAGE go into the
 * hello as text, and the arbiter checks them as it checks libshare.connect()'s;
 * LIBSHARE_DEVICE_MEM_LIMIT ("1G", "unlimited", or per device "0=1G,UUID=512M") is read here
 * into the hello's byte counts (hello.c) by ls_icd_parse_size. Returns 0 or a negative errno. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "icd.h"

/* The variable's value; NULL when it is unset or blank (settings.py's reading). */
static const char *variable(const char *name)
{
    const char *value = secure_getenv(name);
    for (const char *c = value; c != NULL && *c != '\0'; c++)
        if (!isspace((unsigned char)*c))
            return value;
    return NULL;
}

int ls_icd_read_settings(struct ls_icd_settings *settings)
{
    const char *given = variable("LIBSHARE_PIPE_DIRECTORY");
    const char *runtime = variable("XDG_RUNTIME_DIR");
    char directory[4000];
    int n;
    memset(settings, 0, sizeof(*settings));
    if (given != NULL)
        n = snprintf(directory, sizeof(directory), "%s", given);
    else if (runtime != NULL && access(runtime, W_OK) == 0)
        n = snprintf(directory, sizeof(directory), "%s/libshare", runtime);
    else
        n = snprintf(directory, sizeof(directory), "/tmp/libshare-%u", (unsigned)getuid());
    if (n < 0 || (size_t)n >= sizeof(directory))
        return -ENAMETOOLONG;
    snprintf(settings->socket_path, sizeof(settings->socket_path), "%s/control", directory);
    snprintf(settings->supervisor_lock, sizeof(settings->supervisor_lock), "%s/control-daemon.pid", directory);
    settings->name = variable("LIBSHARE_CLIENT_NAME");
    settings->group = variable("LIBSHARE_GROUP");
    settings->priority = variable("LIBSHARE_CLIENT_PRIORITY");
    settings->share = variable("LIBSHARE_ACTIVE_THREAD_PERCENTAGE");
    settings->mem_limit = variable("LIBSHARE_DEVICE_MEM_LIMIT");
    return 0;
}

/* Bytes in ``text`` as settings.py's parse_size reads it, exactly: spaces around, digits with an
 * optional fraction (up to 18 decimals here; settings.py takes more, this refuses them), spaces, an optional unit K, M, G or T (binary, any
 * case), an optional B or iB; the value truncated to whole bytes, at most settings.py's MAX_SIZE
 * (2^60). -EINVAL when it is not one. */
int ls_icd_parse_size(const char *text, uint64_t *bytes)
{
    const unsigned __int128 most = (unsigned __int128)1 << 60;
    unsigned __int128 whole = 0, fraction = 0, scale = 1, unit = 1, value;
    const char *c = text, *end = text + strlen(text);
    int digits = 0, decimals = 0;
    while (c < end && isspace((unsigned char)*c))
        c++;
    while (end > c && isspace((unsigned char)end[-1]))
        end--;
    for (; c < end && isdigit((unsigned char)*c); c++, digits++) {
        whole = whole * 10 + (unsigned)(*c - '0');
        if (whole > most)
            return -EINVAL;
    }
    if (digits == 0)
        return -EINVAL;
    if (c < end && *c == '.') {
        for (c++; c < end && isdigit((unsigned char)*c); c++, decimals++) {
            if (decimals == 18)
                return -EINVAL;
            fraction = fraction * 10 + (unsigned)(*c - '0');
            scale *= 10;
        }
        if (decimals == 0)
            return -EINVAL;
    }
    while (c < end && isspace((unsigned char)*c))
        c++;
    if (c < end && strchr("kKmMgGtT", *c) != NULL) {
        int shift = *c == 'k' || *c == 'K' ? 10 : *c == 'm' || *c == 'M' ? 20 : *c == 'g' || *c == 'G' ? 30 : 40;
        unit = (unsigned __int128)1 << shift;
        c++;
    }
    if (c < end && (*c == 'i' || *c == 'I')) { /* iB */
        if (c + 1 >= end || (c[1] != 'b' && c[1] != 'B'))
            return -EINVAL;
        c += 2;
    } else if (c < end && (*c == 'b' || *c == 'B')) {
        c++;
    }
    if (c != end)
        return -EINVAL;
    value = whole * unit + fraction * unit / scale;
    if (value > most)
        return -EINVAL;
    *bytes = (uint64_t)value;
    return 0;
}
