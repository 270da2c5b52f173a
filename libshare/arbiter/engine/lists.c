/*
 * Command lists. A client registers a sequence of dispatches, copies, fills, updates, barriers,
 * indirect dispatches and timestamps over its own objects once (ls_engine_put_list: the control request
 * load_list; a dispatch may bind a bind group, validate.c, checked as a single dispatch's is),
 * and one LS_OP_LIST descriptor,
 * naming the list as its program, runs all of them and is answered once: with the device time
 * of every command and the first failure among them.
 *
 * A list is an object of its client's table (LS_KIND_LIST) like a program or a buffer, its
 * commands stored with it (list_commands), at most LS_ENGINE_MAX_LIST. Each command passes
 * ls_desc_check and check_desc when the list is registered (one with parameters as far as it can:
 * "Parameters", below; a list that names another client's
 * objects, or none, is refused then), and passes check_desc again each time it runs: the
 * objects it names may have been freed since, and a command that finds one gone ends its list
 * with that refusal (LS_ENOBUFFER, ...), never touching what was freed.
 *
 * Parameters. A command's buffer id LS_LIST_ARG | k names the buffer in slot k of the LS_OP_LIST
 * descriptor that submits it (buffer[k], at offset[k] past the command's own offset), and a dispatch
 * flagged LS_DESC_SUBMISSION_PUSH (push_size 0) takes that descriptor's push constants. No object id
 * has the high bit (serve/clients.py, Client.new_id; the engine refuses one). At registration such a
 * command is checked as far as it can be (check_template: its own objects, its program's bindings,
 * a slot under LS_MAX_BUFFERS, a program that takes push constants); the list records the slots its
 * commands use (bindings: one past the highest) and the push bytes all of them take (push_size:
 * the least of their programs'). Each submission must give exactly that many slots, each a buffer or a
 * texel view of its client (LS_EBINDINGS, LS_ENOBUFFER; which one a slot must be is told as each
 * command runs, by the binding it lands at), and push bytes its commands take (LS_EPUSH): check_args,
 * from check_desc, before anything runs. Each command then runs with the parameters substituted
 * into a private copy (bind_args), a plain descriptor that passes check_desc as any other; that copy
 * is what is recorded and cached, so the recording cache (keyed by content) serves a list with
 * parameters as it serves the same commands written inline.
 *
 * Running. The popped LS_OP_LIST descriptor starts a run (start_run): the client's turns then
 * put the list's next commands into flights (run_list), as many as the turn's budget (one in a
 * cut turn, when a higher priority is active: engine_policy.c, "Pieces"), each through the path
 * of a popped descriptor (check_desc, its recording from the client's cache, an entry that holds
 * its objects), so that the watchdog and each command's device time see every command, and a
 * higher priority's turn goes between two commands of a long list. A command's entry answers
 * nothing (LIST_COMMAND); the last one's (LIST_LAST) answers the ticket for all (book_list, as
 * a cut's last piece does). A dispatch that would run in pieces alone (pieces_for, in a turn cut
 * at cut_us) runs in pieces inside its list too: it begins a cut marked listed, whose pieces go in
 * as a cut's do (engine_policy.c, "Pieces") and answer into the list, each piece an entry
 * LIST_COMMAND (the run's tail) and the last piece of the list's last command LIST_LAST; the
 * list's next command goes in only once the cut's last piece has. A listed cut ends with its run
 * (end_run; end_cut hands it there). A list ended early (a command refused at its turn, a close, a
 * fault) makes its command on the device the last (end_run), or is answered at once when none
 * is. Its commands' device time is billed as each retires (charged_ns_since).
 *
 * Order. Descriptors popped behind the LS_OP_LIST in the same pop wait in the client's stash
 * (stash_after) until the run is over, then go on as popped ones, so a session's order holds
 * between lists and single descriptors; a free waits for them as for descriptors still in the
 * ring (objects.c, settle_drops). A list runs no command of another list inside it
 * (LS_OP_LIST and LS_OP_NOP are refused in a list); each command, and each piece, runs under the
 * watchdog.
 *
 * Barriers. Every command's recording ends with a full compute and transfer barrier
 * (recordings.c, record_barrier), so a list's order and visibility are already those of a
 * barrier between every two commands: an LS_OP_BARRIER command is checked (check_desc: every
 * field 0) as it runs and skipped, putting nothing in a flight; a list that ends with one (or
 * holds nothing else) ends there, answered with its last command in a flight or at once.
 * An indirect dispatch in a list reads its counts when it runs, after the commands before it
 * (recordings.c, "Indirect dispatches"); a refused count fails only that command, and the list's
 * ticket carries the failure as any command's.
 */
#include "internal.h"

/* ------------------------------------------------------------------ registration */

/* A new list object holding count commands (tickets zeroed); NULL when out of memory. */
struct object *new_list(const char *commands, uint32_t count)
{
    struct object *o = calloc(1, sizeof *o + (size_t)count * sizeof(struct ls_desc));
    if (!o)
        return NULL;
    o->kind = LS_KIND_LIST;
    o->count = count;
    struct ls_desc *d = list_commands(o);
    memcpy(d, commands, (size_t)count * sizeof *d);
    for (uint32_t k = 0; k < count; k++)
        d[k].ticket = 0;
    return o;
}

/* Whether id names a buffer or a texel view of client c: what a list's template or parameter may name
 * before the command it lands in says which (check_binding tells, as the command runs). */
static int is_bindable(struct client *c, uint32_t id)
{
    return table_find(&c->objects, LS_KIND_BUFFER, id) || table_find(&c->objects, LS_KIND_VIEW, id);
}

/* 0 when command d of list may run for client c as far as it can be told before its submission: a
 * command with parameters (LS_LIST_ARG buffers, LS_DESC_SUBMISSION_PUSH) names only its own objects, a
 * slot under LS_MAX_BUFFERS, its program's bindings, and push constants its program takes; its ranges and
 * groups are checked as it runs, the parameters substituted. The slots it uses and the push bytes it
 * takes go into list->bindings and *push (the least of its commands' programs'). */
static int check_template(ls_engine *e, struct client *c, struct object *list, const struct ls_desc *d,
                          uint32_t *push)
{
    uint32_t takes_push = d->flags & LS_DESC_SUBMISSION_PUSH, args = 0;
    if (takes_push && ((d->opcode != LS_OP_DISPATCH && d->opcode != LS_OP_DISPATCH_INDIRECT) || d->push_size))
        return -LS_EPUSH;
    for (uint32_t k = 0; k < d->nbuffers; k++) {
        uint32_t slot = d->buffer[k] & ~(uint32_t)LS_LIST_ARG;
        if (!(d->buffer[k] & LS_LIST_ARG) && !is_bindable(c, d->buffer[k]))
            return -LS_ENOBUFFER;
        if (d->buffer[k] & LS_LIST_ARG && slot >= LS_MAX_BUFFERS)
            return -LS_EBINDINGS;
        if (d->buffer[k] & LS_LIST_ARG && slot >= list->bindings)
            list->bindings = slot + 1;
        args |= d->buffer[k] & LS_LIST_ARG;
    }
    if (!args && !takes_push) {         /* none: checked whole, as a popped descriptor */
        struct object *users[MOST_USERS];
        uint32_t nusers = 0;
        return check_desc(e, c, d, users, &nusers);
    }
    if (d->opcode == LS_OP_COPY)
        return d->nbuffers == 2 ? 0 : -LS_EBINDINGS;
    if (d->opcode == LS_OP_FILL || d->opcode == LS_OP_UPDATE || d->opcode == LS_OP_TIMESTAMP)
        return d->nbuffers == 1 ? 0 : -LS_EBINDINGS;  /* its range is checked as it runs */
    struct object **program = table_find(&c->objects, LS_KIND_PROGRAM, d->program);
    if (!program)
        return -LS_ENOPROGRAM;
    if (!(d->flags & LS_DESC_GROUP) && d->nbuffers != (*program)->bindings)
        return -LS_EBINDINGS;           /* a group's bindings are checked as it runs */
    if (takes_push && !(*program)->push_size)
        return -LS_EPUSH;
    if (takes_push && (*program)->push_size < *push)
        *push = (*program)->push_size;
    if (d->push_size > (*program)->push_size || d->push_size % 4)
        return -LS_EPUSH;
    return 0;
}

/* 0 when every command of list may run for client c now (each passes the one validator, or with
 * parameters as far as check_template tells; no LS_OP_NOP or LS_OP_LIST), else the first one's refusal,
 * its index in *bad. The list's parameters are known after it: list->bindings slots, list->push_size bytes. */
int check_list(ls_engine *e, struct client *c, struct object *list, uint32_t *bad)
{
    struct ls_desc *d = list_commands(list);
    uint32_t push = UINT32_MAX;         /* none takes the submission's push constants yet */
    for (uint32_t k = 0; k < list->count; k++) {
        struct ls_desc plain = d[k];
        plain.flags &= ~(uint32_t)LS_DESC_SUBMISSION_PUSH;  /* the range check of a popped descriptor */
        *bad = k;
        int status = ls_desc_check(&plain);
        if (!status && (d[k].opcode == LS_OP_NOP || d[k].opcode == LS_OP_LIST))
            status = -LS_EBADSLOT;
        if (!status)
            status = check_template(e, c, list, &d[k], &push);
        if (status)
            return status;
    }
    list->push_size = push == UINT32_MAX ? 0 : push;
    return 0;
}

/* 0 when the LS_OP_LIST descriptor d gives list what it takes: a buffer of client c for every
 * parameter slot it uses (else LS_EBINDINGS, or LS_ENOBUFFER), push constants its commands take. */
int check_args(struct client *c, const struct object *list, const struct ls_desc *d)
{
    if (d->nbuffers != list->bindings)
        return -LS_EBINDINGS;
    if (d->push_size > list->push_size || d->push_size % 4)
        return -LS_EPUSH;
    for (uint32_t k = 0; k < d->nbuffers; k++)
        if (!is_bindable(c, d->buffer[k]))
            return -LS_ENOBUFFER;
    return 0;
}

/* Command cmd with the parameters of its submission args substituted, into the private copy out: slot k's
 * buffer for LS_LIST_ARG | k (at the command's offset past the slot's), the submission's push constants for
 * LS_DESC_SUBMISSION_PUSH. Out is a plain descriptor for check_desc; 0, or -LS_ERANGE (offsets past 2^64). */
static int bind_args(const struct ls_desc *cmd, const struct ls_desc *args, struct ls_desc *out)
{
    *out = *cmd;
    out->flags = cmd->flags & ~(uint32_t)LS_DESC_SUBMISSION_PUSH;  /* LS_DESC_GROUP stays */
    for (uint32_t k = 0; k < cmd->nbuffers; k++) {
        if (!(cmd->buffer[k] & LS_LIST_ARG))
            continue;
        uint32_t slot = cmd->buffer[k] & ~(uint32_t)LS_LIST_ARG;  /* < args->nbuffers: check_args */
        out->buffer[k] = args->buffer[slot];
        out->offset[k] = cmd->offset[k] + args->offset[slot];
        if (out->offset[k] < args->offset[slot])
            return -LS_ERANGE;
    }
    if (cmd->flags & LS_DESC_SUBMISSION_PUSH) {
        out->push_size = args->push_size;
        memset(out->push, 0, LS_MAX_PUSH);
        memcpy(out->push, args->push, args->push_size);
    }
    return 0;
}

/* ------------------------------------------------------------------ running */

/* Start running list (checked by check_desc) for client slot's LS_OP_LIST descriptor d (its ticket and
 * parameters): the run holds it. */
void start_run(ls_engine *e, uint32_t slot, struct object *list, const struct ls_desc *d)
{
    struct client *c = &e->clients[slot];
    c->run = (struct run){.list = list, .ticket = d->ticket, .args = *d};
    list->in_flight++;
    e->runs++;
}

/* Let go of the run's hold on its list: its last command is in a flight, or it ended. */
void close_run(ls_engine *e, struct client *c)
{
    struct object *list = c->run.list;
    if (!list)
        return;
    c->run.list = NULL;
    c->run.tail = NULL;
    e->runs--;
    release(e, list);
}

/* End client slot's run before its last command: its command on the device answers its ticket with
 * status as it retires; with none there, it is answered now (the caller flushes). A command of it
 * running in pieces ends too: its piece on the device is the last. */
void end_run(ls_engine *e, uint32_t slot, int32_t status)
{
    struct client *c = &e->clients[slot];
    struct run r = c->run;
    if (!r.list)
        return;
    if (c->cut.active && c->cut.listed) {
        if (c->cut.tail)
            c->cut.tail->piece = LAST_PIECE;  /* (the run's tail too) */
        else
            c->cut_status = 0, c->cut_ns = 0, c->cut_charge = 0;
        close_cut(e, c);
    }
    close_run(e, c);                    /* first: an answer may drop the client, which ends its run */
    if (r.tail) {
        r.tail->listed = LIST_LAST;
        r.tail->list_status = status;
        c->last = r.tail;               /* fences popped after the list wait for it */
    } else if (r.added) {               /* all of its commands retired: what they booked is theirs */
        int32_t first = c->list_status ? c->list_status : status;
        uint64_t ns = c->list_ns;
        c->list_status = 0, c->list_ns = 0;
        answer(e, slot, r.ticket, first, ns);
    } else {                            /* none ran: what is booked belongs to a list before it */
        answer(e, slot, r.ticket, status, 0);
    }
}

/* Put client slot's list command d (checked, its objects in users[]) into flight f: the run's last
 * command closes the run. */
static void add_command(ls_engine *e, uint32_t slot, struct flight *f, struct recording *rec,
                        const struct ls_desc *d, struct object **users, uint32_t nusers)
{
    struct client *c = &e->clients[slot];
    struct run *r = &c->run;
    rec->uses++;
    f->urgent = 1;                      /* the turn's commands go in together: nothing to linger for */
    f->secondaries[f->count] = rec->cb;
    struct entry *en = &f->entries[f->count++];
    int last = r->next == r->list->count;
    *en = (struct entry){.client = slot, .ticket = r->ticket, .recording = rec, .nusers = nusers,
                         .groups = d->opcode == LS_OP_DISPATCH ? d->groups[0] * d->groups[1] * d->groups[2] : 0,
                         .listed = last ? LIST_LAST : LIST_COMMAND, .fences = NO_FENCE,
                         .indirect = d->opcode == LS_OP_DISPATCH_INDIRECT};
    hold_objects(en->users, users, nusers);
    r->added++;
    if (last) {
        c->last = en;
        close_run(e, c);
    } else {
        r->tail = en;
    }
}

/* Put up to budget of the next commands of client slot's run into flights (the caller keeps budget
 * within room()), each with its submission's parameters; how many went in. A command refused now ends
 * the run with its refusal; one that runs in pieces in a turn cut at cut_us (pieces_for) begins a cut,
 * which ends the turn: the next command goes in once its last piece has (add_piece). */
int run_list(ls_engine *e, uint32_t slot, int64_t budget, uint32_t cut_us)
{
    struct client *c = &e->clients[slot];
    struct run *r = &c->run;
    int added = 0;
    volatile uint32_t *busy = ls_load_acquire(&e->busy);  /* pairs with ls_engine_set_busy_word's ls_store_release */
    uint32_t was = busy ? *busy : 0;
    if (busy)
        *busy = slot + 1;               /* as in take(): a crash recording its commands is this client's */
    while (r->list && !c->cut.active && added < budget) {
        struct ls_desc d;
        int status = bind_args(&list_commands(r->list)[r->next], &r->args, &d);
        d.ticket = r->ticket;
        struct object *users[MOST_USERS];
        uint32_t nusers = 0;
        if (!status)
            status = check_desc(e, c, &d, users, &nusers);
        if (!status && d.opcode == LS_OP_BARRIER) {  /* nothing to record: every command ends with one */
            if (++r->next == r->list->count)
                end_run(e, slot, 0);    /* answered with its last command in a flight, or now */
            continue;
        }
        struct flight *f = status ? NULL : flight_with_room(e);
        uint32_t dim = 0, pieces = f ? pieces_for(e, c, &d, users, nusers, cut_us, &dim) : 0;
        struct recording *rec = f && !pieces ? recording_in(e, c, &d, users, nusers, f) : NULL;
        if (!rec && !pieces) {
            end_run(e, slot, status ? status : -LS_EFAULT);
            break;
        }
        r->next++;
        c->stats.listed++;
        added++;
        if (pieces) {                   /* its pieces answer nothing but into the list (book_list) */
            start_cut(e, slot, &d, users, nusers, dim, pieces);
            c->cut.listed = 1;
            add_piece(e, slot, 0);
            break;
        }
        add_command(e, slot, f, rec, &d, users, nusers);
    }
    if (busy)
        *busy = was;
    return added;
}

/* The runs that go on outside their client's turns: a faulted engine ends each (LS_EFAULT), and a
 * client handed over (closed LS_EMOVED; any other close ended its run) runs the rest as flights
 * have room: what runs is finished. 1 when a command went into a flight. */
int continue_runs(ls_engine *e)
{
    int added = 0;
    for (uint32_t i = 0; i < e->nactive && e->runs; i++) {
        uint32_t slot = e->active[i];
        struct client *c = &e->clients[slot];
        if (!c->run.list)
            continue;
        if (e->faulted || e->device_lost)
            end_run(e, slot, -LS_EFAULT);
        else if (c->closing)
            added |= run_list(e, slot, room(e), 0) > 0;  /* (after its cut: continue_cuts) */
    }
    flush_posts(e);
    return added;
}

/* Book a retired command of client c's list; 1 when it is the last, which answers for all of them
 * (*status and *ns become theirs: the first failure and the device time of all). */
int book_list(struct client *c, struct entry *en, int32_t *status, uint64_t *ns)
{
    if (c->run.tail == en)
        c->run.tail = NULL;
    if (*status && !c->list_status)
        c->list_status = *status;
    c->list_ns += *status ? 0 : *ns;
    if (en->listed != LIST_LAST)
        return 0;
    if (en->list_status && !c->list_status)
        c->list_status = en->list_status;
    *status = c->list_status, *ns = c->list_ns;
    c->list_status = 0, c->list_ns = 0;
    return 1;
}

/* ------------------------------------------------------------------ what waits behind a list */

/* Keep n descriptors popped behind an LS_OP_LIST until its run is over. 0 or -ENOMEM. */
int stash_after(struct client *c, const struct ls_desc *descs, uint32_t n)
{
    if (!c->after && !(c->after = malloc(LS_ENGINE_POP * sizeof *c->after)))
        return -ENOMEM;
    memcpy(c->after, descs, n * sizeof *descs);
    c->nafter = n, c->after_at = 0;
    return 0;
}

/* Answer with status every descriptor of client slot's stash, unrun (the caller flushes). */
void cancel_after(ls_engine *e, uint32_t slot, int32_t status)
{
    struct client *c = &e->clients[slot];
    for (; c->after_at < c->nafter; c->after_at++)
        answer(e, slot, c->after[c->after_at].ticket, status, 0);
    c->nafter = c->after_at = 0;
}
