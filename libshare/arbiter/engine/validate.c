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
 *
 * Bind groups. A program binds up to LS_ENGINE_MAX_BINDINGS buffers; a descriptor carries
 * LS_MAX_BUFFERS. A dispatch of a program with more (or any dispatch that wants a per-binding
 * range) names a bind group instead: flags LS_DESC_GROUP, nbuffers 0, buffer[0] the group's id.
 * A group (LS_KIND_GROUP, ls_engine_put_group: the bind_group request) is an object of its
 * client's table holding, for one program's layout (its buffer count, which are uniform buffers,
 * which continue an array of buffers), a buffer id, an offset and a range (0: to the end) per
 * binding. check_group checks its entries when it is made and again at every dispatch that names
 * it, through the very check a plain descriptor's buffers pass (check_binding): the buffer is the
 * client's own and in its table now (one freed since answers LS_ENOBUFFER, and nothing of it is
 * touched), the offset is inside it and aligned (a uniform buffer's to its own alignment), the
 * range is inside it and at most the device's storage or uniform range. The group holds ids, never
 * the buffers: freeing a buffer a group names is allowed, and ends that group's dispatches. A
 * dispatch's program must have the group's layout (else LS_EBINDINGS); its objects are its buffers,
 * the group, then the program, each held until it retires.
 *
 * Texel buffers. At a binding its program declares a texel buffer, a dispatch (or a bind group's
 * entry, or a command list's parameter slot substituted there) names a view (LS_KIND_VIEW,
 * objects.c) of the client's own, and check_binding looks it up as a view, never as a buffer (and a
 * buffer binding's id never as a view), so a view passed for a buffer, or a buffer for a view, is an
 * unknown id (LS_ENOBUFFER). The view's uses must include the binding's kind (storage or uniform)
 * and its format must be one the binding takes (LS_EBINDINGS); its offset and range in the
 * descriptor or the group are 0 (the view has its own range: LS_ERANGE); a view whose buffer was
 * dropped is refused (LS_ENOBUFFER). A group copies its program's texel bindings and their formats
 * into its layout, so a program must match those too.
 *
 * What each opcode must hold (every refusal goes to that client's ticket alone):
 *   LS_OP_DISPATCH   its program's bindings (its own or a bind group's, below) and push size, aligned
 *                    offsets inside each buffer, each group count 1..the device's limit and their
 *                    product at most 2^32 - 1; with a base (LS_DESC_BASE, a group dispatch only: its
 *                    first workgroup in buffer[1..3], dispatch_base), each base plus its count at most
 *                    the limit;
 *   LS_OP_COPY       two buffers, a non-empty range inside each, not overlapping in one buffer;
 *   LS_OP_FILL       one buffer, push_size 4 (the value), offset[0] and size offset[1] multiples of
 *                    4, size not 0, the range inside the buffer; program and groups 0;
 *   LS_OP_UPDATE     one buffer, push_size a multiple of 4 (4..LS_MAX_PUSH), offset[0] a multiple
 *                    of 4 with push_size bytes inside the buffer; program and groups 0;
 *   LS_OP_TIMESTAMP  a device whose queue has timestamps (else LS_EUNSUPPORTED), one buffer, offset[0] a
 *                    multiple of 8 with 16 bytes (the stamp, its availability) inside the buffer; program,
 *                    groups and push_size 0;
 *   LS_OP_BARRIER    every field 0 (it names nothing);
 *   LS_OP_DISPATCH_INDIRECT  a dispatch's checks (a bind group too) but the groups: groups[0] names a buffer of the
 *                    client's own, and the 12 bytes of counts at the offset groups[1..2] spell (a
 *                    multiple of 4) lie inside it. The counts themselves are read by the device at
 *                    run time and clamped there (recordings.c, "Indirect dispatches"): their buffer
 *                    is a user of the command, held until it retires like its bindings.
 */
#include "internal.h"

/* Buffer id (a view's at a texel binding) as binding k of layout (a program or a group) at offset, range
 * bytes (0: to its end), with the buffer or view in *out; else LS_ENOBUFFER, LS_EBINDINGS or LS_ERANGE.
 * The one check of a bound object. */
static int check_binding(ls_engine *e, struct client *c, const struct object *layout, uint32_t k, uint32_t id,
                         uint64_t offset, uint64_t range, struct object **out)
{
    int texel = layout->texel_mask >> k & 1, uniform = layout->uniform_mask >> k & 1;
    struct object **slot = table_find(&c->objects, texel ? LS_KIND_VIEW : LS_KIND_BUFFER, id);
    if (!slot || (texel && (*slot)->of->freed))
        return -LS_ENOBUFFER;
    struct object *buffer = *slot;
    if (texel) {                        /* a view: of the binding's uses and formats, with its own range */
        if (!(buffer->uses & (uniform ? LS_VIEW_UNIFORM : LS_VIEW_STORAGE)) ||
            !(layout->formats[k] >> buffer->format & 1))
            return -LS_EBINDINGS;
        if (offset || range)
            return -LS_ERANGE;
        *out = buffer;
        return 0;
    }
    uint64_t alignment = uniform ? e->cfg.uniform_offset_alignment : e->cfg.offset_alignment;
    uint64_t most = uniform ? e->cfg.max_uniform_range : e->cfg.max_storage_range;
    if (offset >= buffer->size || offset % alignment || range > buffer->size - offset || range > most)
        return -LS_ERANGE;
    *out = buffer;
    return 0;
}

/* 0 when the count entries of a group over layout may be bound now, their buffers in buffers[]; else the
 * first bad entry's refusal, its index in *bad. */
int check_group(ls_engine *e, struct client *c, const struct object *layout, const struct group_entry *entries,
                uint32_t count, struct object **buffers, uint32_t *bad)
{
    for (uint32_t k = 0; k < count; k++) {
        *bad = k;
        int status = check_binding(e, c, layout, k, entries[k].buffer, entries[k].offset, entries[k].range,
                                   &buffers[k]);
        if (status)
            return status;
    }
    return 0;
}

/* The bindings of dispatch d of program into users[]: from its group (then users[bindings]) or its own
 * buffer ids and offsets. */
static int check_bindings(ls_engine *e, struct client *c, const struct ls_desc *d, const struct object *program,
                          struct object **users)
{
    uint32_t bad;
    if (!(d->flags & LS_DESC_GROUP)) {
        if (d->nbuffers != program->bindings)
            return -LS_EBINDINGS;
        for (uint32_t k = 0; k < d->nbuffers; k++) {
            int status = check_binding(e, c, program, k, d->buffer[k], d->offset[k], 0, &users[k]);
            if (status)
                return status;
        }
        return 0;
    }
    struct object **slot = table_find(&c->objects, LS_KIND_GROUP, d->buffer[0]);
    if (!slot)
        return -LS_ENOBUFFER;
    struct object *group = *slot;
    if (group->bindings != program->bindings || group->uniform_mask != program->uniform_mask ||
        group->array_mask != program->array_mask || group->texel_mask != program->texel_mask ||
        memcmp(group->formats, program->formats, sizeof group->formats))
        return -LS_EBINDINGS;
    users[program->bindings] = group;
    return check_group(e, c, group, group_entries(group), group->bindings, users, &bad);
}

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

/* LS_OP_TIMESTAMP: 0 when d writes its 16 bytes (the timestamp, then its availability) at a multiple of 8
 * inside its one buffer (users[0]), else the LS_E*. */
static int check_stamp(const struct ls_desc *d, struct object **users)
{
    if (d->program || d->groups[0] || d->groups[1] || d->groups[2] || d->push_size)
        return -LS_EBADSLOT;
    if (d->nbuffers != 1)
        return -LS_EBINDINGS;
    if (d->offset[0] % 8 || users[0]->size < 16 || d->offset[0] > users[0]->size - 16)
        return -LS_ERANGE;
    return 0;
}

/* LS_OP_COPY, LS_OP_FILL, LS_OP_UPDATE and LS_OP_TIMESTAMP: 0 when d's buffers (users[]) are the client's
 * and its ranges lie inside them, else the LS_E*. */
static int check_transfer(struct client *c, const struct ls_desc *d, struct object **users, uint32_t *nusers)
{
    if (d->opcode != LS_OP_COPY && d->opcode != LS_OP_FILL && d->opcode != LS_OP_UPDATE &&
        d->opcode != LS_OP_TIMESTAMP)
        return -LS_EBADSLOT;
    for (uint32_t k = 0; k < d->nbuffers; k++) {
        struct object **slot = table_find(&c->objects, LS_KIND_BUFFER, d->buffer[k]);
        if (!slot)
            return -LS_ENOBUFFER;
        users[k] = *slot;
    }
    *nusers = d->nbuffers;
    if (d->opcode == LS_OP_TIMESTAMP)
        return check_stamp(d, users);
    if (d->opcode != LS_OP_COPY)
        return check_write(d, users);
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

/*
 * 0 when the descriptor (a private copy, ls_desc_check already applied by ls_sq_pop) may run
 * for client c, with its objects in users[] (buffers, then its group if any, program last); else the
 * negative LS_E* status.
 */
int check_desc(ls_engine *e, struct client *c, const struct ls_desc *d, struct object **users,
               uint32_t *nusers)
{
    int dispatch = d->opcode == LS_OP_DISPATCH || d->opcode == LS_OP_DISPATCH_INDIRECT;
    if (d->opcode == LS_OP_BAD || (d->flags & ~(LS_DESC_GROUP | LS_DESC_BASE)))
        return -LS_EBADSLOT;
    if ((d->flags & LS_DESC_BASE) && (!(d->flags & LS_DESC_GROUP) || d->opcode != LS_OP_DISPATCH))
        return -LS_EBADSLOT;
    if ((d->flags & LS_DESC_BASE) && !e->vk.CmdDispatchBase)
        return -LS_EUNSUPPORTED;        /* a Vulkan 1.0 device */
    if (d->flags && (!dispatch || d->nbuffers))
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
    if (d->opcode == LS_OP_BARRIER) {
        int fields = d->program || d->nbuffers || d->push_size || d->groups[0] || d->groups[1] || d->groups[2];
        for (int k = 0; k < LS_MAX_BUFFERS; k++)
            fields |= d->buffer[k] || d->offset[k];
        return fields ? -LS_EBADSLOT : 0;
    }
    if (d->opcode == LS_OP_TIMESTAMP && !e->cfg.timestamp_mask)
        return -LS_EUNSUPPORTED;        /* a queue without timestamps (timestampValidBits 0) */
    if (!dispatch)
        return check_transfer(c, d, users, nusers);
    struct object **slot = table_find(&c->objects, LS_KIND_PROGRAM, d->program);
    if (!slot)
        return -LS_ENOPROGRAM;
    struct object *program = *slot;
    int status = check_bindings(e, c, d, program, users);
    if (status)
        return status;
    if (d->push_size > program->push_size || d->push_size % 4)
        return -LS_EPUSH;
    *nusers = program->bindings + (d->flags & LS_DESC_GROUP ? 1 : 0);
    if (d->opcode == LS_OP_DISPATCH_INDIRECT) {
        status = check_counts(c, d, &users[*nusers]);
        if (status)
            return status;
        (*nusers)++;                    /* the counts' buffer, before the program (a dispatch's last user) */
    }
    for (int k = 0; k < 3 && d->opcode == LS_OP_DISPATCH; k++)
        if (d->groups[k] < 1 || (uint64_t)d->groups[k] + dispatch_base(d, k) > e->cfg.max_groups[k])
            return -LS_EGROUPS;         /* (Vulkan bounds the base plus the count) */
    /* lavapipe counts the workgroups of a dispatch in 32 bits: past that it runs the product's remainder
     * and reports success (65535^3 runs 196,607 of 2.8e14) */
    if (d->opcode == LS_OP_DISPATCH && (uint64_t)d->groups[0] * d->groups[1] * d->groups[2] > UINT32_MAX)
        return -LS_EGROUPS;
    users[(*nusers)++] = program;
    return 0;
}
