/*
 * The one descriptor validator.
 *
 * The descriptor layout has one writer, ls_push_op in ring.c, and one reader, this engine.
 * Anything a client writes into its ring is untrusted: ls_sq_pop copies each descriptor out
 * and applies ls_desc_check (ring.c) to the private copy, and check_desc completes the check
 * against the client's object table (objects.c) and the device's limits. It runs on every
 * descriptor the engine pops (take, loop.c), before the recording cache is looked at: a cached
 * recording (recordings.c) only saves the recording, never a check. A command list's commands
 * (lists.c) pass it when the list is registered (those with parameters as far as they can), and
 * again each time one runs, its submission's parameters substituted; an LS_OP_LIST descriptor's
 * parameters pass check_args (lists.c) here.
 */
#include "internal.h"

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
        if (d->groups[0] || d->groups[1] || d->groups[2])
            return -LS_EBADSLOT;
        struct object **list = table_find(&c->objects, LS_KIND_LIST, d->program);
        if (!list)
            return -LS_ENOPROGRAM;
        users[0] = *list;
        *nusers = 1;
        return check_args(c, *list, d);  /* its parameters: buffers and push constants */
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
    if (d->opcode != LS_OP_DISPATCH)
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
    for (int k = 0; k < 3; k++)
        if (d->groups[k] < 1 || d->groups[k] > e->cfg.max_groups[k])
            return -LS_EGROUPS;
    /* lavapipe counts the workgroups of a dispatch in 32 bits: past that it runs the product's remainder
     * and reports success (65535^3 runs 196,607 of 2.8e14) */
    if ((uint64_t)d->groups[0] * d->groups[1] * d->groups[2] > UINT32_MAX)
        return -LS_EGROUPS;
    users[(*nusers)++] = program;
    return 0;
}
