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
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "icd.h"

static const char *variable(const char *name)
{
    const char *value = secure_getenv(name);
    return value != NULL && value[0] != '\0' ? value : NULL;
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

/* Bytes in ``text`` as settings.py's parse_size reads it: a number (a fraction allowed) and an
 * optional unit K, M, G or T (binary), then an optional B or iB. -EINVAL when it is not one. */
int ls_icd_parse_size(const char *text, uint64_t *bytes)
{
    const uint64_t most = (uint64_t)1 << 62; /* settings.py's MAX_SIZE bound, at most this */
    char *end = NULL;
    double number, scale = 1;
    while (*text == ' ')
        text++;
    if (*text < '0' || *text > '9')
        return -EINVAL;
    number = strtod(text, &end);
    switch (*end) {
    case 'k': case 'K': scale = 1024.0; end++; break;
    case 'm': case 'M': scale = 1048576.0; end++; break;
    case 'g': case 'G': scale = 1073741824.0; end++; break;
    case 't': case 'T': scale = 1099511627776.0; end++; break;
    default: break;
    }
    if (scale > 1 && (end[0] == 'i' || end[0] == 'I') && (end[1] == 'b' || end[1] == 'B'))
        end += 2;
    else if (end[0] == 'b' || end[0] == 'B')
        end++;
    while (*end == ' ')
        end++;
    if (*end != '\0' || !(number * scale <= (double)most))
        return -EINVAL;
    *bytes = (uint64_t)(number * scale);
    return 0;
}
