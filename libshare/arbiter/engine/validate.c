/*
 * The one descriptor validator.
 *
 * The descriptor layout has one writer, ls_push_op in ring.c, and one reader, this engine.
 * Anything a client writes into its ring is untrusted: ls_sq_pop copies each descriptor out
 * and applies ls_desc_check (ring.c) to the private copy, and check_desc completes the check
 * against the client's object table (objects.c) and the device's limits. It runs on every
 * descriptor the engine pops (take, loop.c), before the recording cache is looked at: a cached
 * recording (recordings.c) only saves the recording, never a check. A command list's commands
 * (lists.c) pass it when the list is registered, and again each time one runs.
 *
 * What each opcode must hold (every refusal goes to that client's ticket alone):
 *   LS_OP_DISPATCH   its program's bindings and push size, aligned offsets inside each buffer, each
 *                    group count 1..the device's limit and their product at most 2^32 - 1;
 *   LS_OP_COPY       two buffers, a non-empty range inside each, not overlapping in one buffer;
 *   LS_OP_FILL       one buffer, push_size 4 (the value), offset[0] and size offset[1] multiples of
 *                    4, size not 0, the range inside the buffer; program and groups 0;
 *   LS_OP_UPDATE     one buffer, push_size a multiple of 4 (4..LS_MAX_PUSH), offset[0] a multiple
 *                    of 4 with push_size bytes inside the buffer; program and groups 0;
 *   LS_OP_BARRIER    every field 0 (it names nothing);
 *   LS_OP_DISPATCH_INDIRECT  a dispatch's checks but the groups: groups[0] names a buffer of the
 *                    client's own, and the 12 bytes of counts at the offset groups[1..2] spell (a
 *                    multiple of 4) lie inside it. The counts themselves are read by the device at
 *                    run time and clamped there (recordings.c, "Indirect dispatches"): their buffer
 *                    is a user of the command, held until it retires like its bindings.
 */
#include "internal.h"

/* LS_OP_FILL and LS_OP_UPDATE: 0 when d writes a range of its one buffer (users[0]), else the LS_E*. */
static int check_write(const struct ls_desc *d, struct object **users)
{
    if (d->program || d->groups[0] || d->groups[1] || d->groups[2])
        return -LS_EBADSLOT;
    if (d->nbuffers != 1)
        return -LS_EBINDINGS;
    uint64_t at = d->offset[0], size = d->opcode == LS_OP_FILL ? d->offset[1] : d->push_size;
    if (d->opcode == LS_OP_FILL ? d->push_size != 4 : d->push_size == 0 || d->push_size % 4)
        return -LS_EPUSH;
    if (size == 0 || size % 4 || at % 4 || size > users[0]->size || at > users[0]->size - size)
        return -LS_ERANGE;
    return 0;
}

/* LS_OP_DISPATCH_INDIRECT: 0 when its counts (buffer groups[0], 12 bytes at groups[1..2]) are a client
 * buffer's, into *counts; else the LS_E*. */
static int check_counts(struct client *c, const struct ls_desc *d, struct object **counts)
{
    struct object **slot = table_find(&c->objects, LS_KIND_BUFFER, d->groups[0]);
    if (!slot)
        return -LS_ENOBUFFER;
    uint64_t at = d->groups[1] | (uint64_t)d->groups[2] << 32, size = (*slot)->size;
    if (at % 4 || size < 12 || at > size - 12)
        return -LS_ERANGE;
    *counts = *slot;
    return 0;
}

/*
 * 0 when the descriptor (a private copy, ls_desc_check already applied by ls_sq_pop) may run
 * for client c, with its objects in users[] (program last); else the negative LS_E* status.
 */
int check_desc(ls_engine *e, struct client *c, const struct ls_desc *d, struct object **users,
               uint32_t *nusers)
{
    if (d->opcode == LS_OP_BAD || d->flags)
        return -LS_EBADSLOT;
    if (d->opcode == LS_OP_LIST) {      /* its commands are checked as each runs (lists.c) */
        if (d->nbuffers || d->push_size || d->groups[0] || d->groups[1] || d->groups[2])
            return -LS_EBADSLOT;
        struct object **list = table_find(&c->objects, LS_KIND_LIST, d->program);
        if (!list)
            return -LS_ENOPROGRAM;
        users[0] = *list;
        *nusers = 1;
        return 0;
    }
    if (d->opcode == LS_OP_BARRIER) {
        int fields = d->program || d->nbuffers || d->push_size || d->groups[0] || d->groups[1] || d->groups[2];
        for (int k = 0; k < LS_MAX_BUFFERS; k++)
            fields |= d->buffer[k] || d->offset[k];
        return fields ? -LS_EBADSLOT : 0;
    }
    for (uint32_t k = 0; k < d->nbuffers; k++) {
        struct object **slot = table_find(&c->objects, LS_KIND_BUFFER, d->buffer[k]);
        if (!slot)
            return -LS_ENOBUFFER;
        users[k] = *slot;
    }
    *nusers = d->nbuffers;
    if (d->opcode == LS_OP_COPY) {
        if (d->nbuffers != 2)
            return -LS_EBINDINGS;
        uint64_t src = d->offset[0], dst = d->offset[1], size = d->offset[2];
        if (size == 0 || size > users[0]->size || src > users[0]->size - size || size > users[1]->size ||
            dst > users[1]->size - size)
            return -LS_ERANGE;
        if (users[0] == users[1] && (src > dst ? src - dst : dst - src) < size)
            return -LS_ERANGE;
        return 0;
    }
    if (d->opcode == LS_OP_FILL || d->opcode == LS_OP_UPDATE)
        return check_write(d, users);
    if (d->opcode != LS_OP_DISPATCH && d->opcode != LS_OP_DISPATCH_INDIRECT)
        return -LS_EBADSLOT;
    struct object **slot = table_find(&c->objects, LS_KIND_PROGRAM, d->program);
    if (!slot)
        return -LS_ENOPROGRAM;
    struct object *program = *slot;
    if (d->nbuffers != program->bindings)
        return -LS_EBINDINGS;
    if (d->push_size > program->push_size || d->push_size % 4)
        return -LS_EPUSH;
    for (uint32_t k = 0; k < d->nbuffers; k++) {
        uint64_t alignment = program->uniform_mask >> k & 1 ? e->cfg.uniform_offset_alignment : e->cfg.offset_alignment;
        if (d->offset[k] >= users[k]->size || d->offset[k] % alignment)
            return -LS_ERANGE;
    }
    if (d->opcode == LS_OP_DISPATCH_INDIRECT) {
        int status = check_counts(c, d, &users[*nusers]);
        if (status)
            return status;
        (*nusers)++;                    /* the counts' buffer, before the program (a dispatch's last user) */
    }
    for (int k = 0; k < 3 && d->opcode == LS_OP_DISPATCH; k++)
        if (d->groups[k] < 1 || d->groups[k] > e->cfg.max_groups[k])
            return -LS_EGROUPS;
    /* lavapipe counts the workgroups of a dispatch in 32 bits: past that it runs the product's remainder
     * and reports success (65535^3 runs 196,607 of 2.8e14) */
    if (d->opcode == LS_OP_DISPATCH && (uint64_t)d->groups[0] * d->groups[1] * d->groups[2] > UINT32_MAX)
        return -LS_EGROUPS;
    users[(*nusers)++] = program;
    return 0;
}
