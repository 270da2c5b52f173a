/*
 * Command lists. A client registers a sequence of dispatches, copies, fills, updates, barriers and
 * indirect dispatches over its own objects once (ls_engine_put_list: the control request
 * load_list), and one LS_OP_LIST descriptor,
 * naming the list as its program, runs all of them and is answered once: with the device time
 * of every command and the first failure among them.
 *
 * A list is an object of its client's table (LS_KIND_LIST) like a program or a buffer, its
 * commands stored with it (list_commands), at most LS_ENGINE_MAX_LIST. Each command passes
 * ls_desc_check and check_desc when the list is registered (a list that names another client's
 * objects, or none, is refused then), and passes check_desc again each time it runs: the
 * objects it names may have been freed since, and a command that finds one gone ends its list
 * with that refusal (LS_ENOBUFFER, ...), never touching what was freed.
 *
 * Running. The popped LS_OP_LIST descriptor starts a run (start_run): the client's turns then
 * put the list's next commands into flights (run_list), as many as the turn's budget (one in a
 * cut turn, when a higher priority is active: engine_policy.c, "Pieces"), each through the path
 * of a popped descriptor (check_desc, its recording from the client's cache, an entry that holds
 * its objects), so that the watchdog and each command's device time see every command, and a
 * higher priority's turn goes between two commands of a long list. A command's entry answers
 * nothing (LIST_COMMAND); the last one's (LIST_LAST) answers the ticket for all (book_list, as
 * a cut's last piece does). A list ended early (a command refused at its turn, a close, a
 * fault) makes its command on the device the last (end_run), or is answered at once when none
 * is. Its commands' device time is billed as each retires (charged_ns_since).
 *
 * Order. Descriptors popped behind the LS_OP_LIST in the same pop wait in the client's stash
 * (stash_after) until the run is over, then go on as popped ones, so a session's order holds
 * between lists and single descriptors; a free waits for them as for descriptors still in the
 * ring (objects.c, settle_drops). A list runs no command of another list inside it
 * (LS_OP_LIST and LS_OP_NOP are refused in a list) and never runs in pieces: its commands run
 * whole, each under the watchdog.
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

/* 0 when every command of list may run for client c now (each passes the one
 * validator; no LS_OP_NOP or LS_OP_LIST), else the first one's refusal, its index in *bad. */
int check_list(ls_engine *e, struct client *c, struct object *list, uint32_t *bad)
{
    struct ls_desc *d = list_commands(list);
    for (uint32_t k = 0; k < list->count; k++) {
        struct object *users[MAX_USERS];
        uint32_t nusers = 0;
        *bad = k;
        int status = ls_desc_check(&d[k]);
        if (!status && (d[k].opcode == LS_OP_NOP || d[k].opcode == LS_OP_LIST))
            status = -LS_EBADSLOT;
        if (!status)
            status = check_desc(e, c, &d[k], users, &nusers);
        if (status)
            return status;
    }
    return 0;
}

/* ------------------------------------------------------------------ running */

/* Start running list (checked by check_desc) for ticket of client slot: the run holds it. */
void start_run(ls_engine *e, uint32_t slot, struct object *list, uint64_t ticket)
{
    struct client *c = &e->clients[slot];
    c->run = (struct run){.list = list, .ticket = ticket};
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
 * status as it retires; with none there, it is answered now (the caller flushes). */
void end_run(ls_engine *e, uint32_t slot, int32_t status)
{
    struct client *c = &e->clients[slot];
    struct run r = c->run;
    if (!r.list)
        return;
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

/* Put up to budget of the next commands of client slot's run into flights (the caller keeps budget
 * within room()); how many went in. A command refused now ends the run with its refusal. */
int run_list(ls_engine *e, uint32_t slot, int64_t budget)
{
    struct client *c = &e->clients[slot];
    struct run *r = &c->run;
    int added = 0;
    volatile uint32_t *busy = ls_load_acquire(&e->busy);  /* pairs with ls_engine_set_busy_word's ls_store_release */
    uint32_t was = busy ? *busy : 0;
    if (busy)
        *busy = slot + 1;               /* as in take(): a crash recording its commands is this client's */
    while (r->list && added < budget) {
        struct ls_desc d = list_commands(r->list)[r->next];
        d.ticket = r->ticket;
        struct object *users[MAX_USERS];
        uint32_t nusers = 0;
        int status = check_desc(e, c, &d, users, &nusers);
        if (!status && d.opcode == LS_OP_BARRIER) {  /* nothing to record: every command ends with one */
            if (++r->next == r->list->count)
                end_run(e, slot, 0);    /* answered with its last command in a flight, or now */
            continue;
        }
        struct flight *f = status ? NULL : flight_with_room(e);
        struct recording *rec = f ? recording_in(e, c, &d, users, nusers, f) : NULL;
        if (!rec) {
            end_run(e, slot, status ? status : -LS_EFAULT);
            break;
        }
        rec->uses++;
        f->urgent = 1;                  /* the turn's commands go in together: nothing to linger for */
        f->secondaries[f->count] = rec->cb;
        struct entry *en = &f->entries[f->count++];
        int last = ++r->next == r->list->count;
        *en = (struct entry){.client = slot, .ticket = r->ticket, .recording = rec, .nusers = nusers,
                             .groups = d.opcode == LS_OP_DISPATCH ? d.groups[0] * d.groups[1] * d.groups[2] : 0,
                             .listed = last ? LIST_LAST : LIST_COMMAND, .fences = NO_FENCE,
                             .indirect = d.opcode == LS_OP_DISPATCH_INDIRECT};
        hold_objects(en->users, users, nusers);
        r->added++;
        c->stats.listed++;
        added++;
        if (last) {
            c->last = en;
            close_run(e, c);
        } else {
            r->tail = en;
        }
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
            added |= run_list(e, slot, room(e)) > 0;
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
