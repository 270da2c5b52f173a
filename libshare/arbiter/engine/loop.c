/*
 * The engine's loop: the arbiter's data path, in C, on its own thread (run). engine.h is the
 * engine's interface, internal.h the structs its files share; each file opens with its part of
 * the design.
 *
 * One thread loops over three steps, holding the engine's mutex for a step at a
 * time and never across a sleep or a call into Python:
 *
 *   retire   the oldest submissions whose fence has signalled: read their
 *            timestamps, post one completion per descriptor (and the fences,
 *            LS_OP_NOPs, that wait on it), release the objects they used
 *            (flights.c, answers.c);
 *   drain    pop each waiting client's descriptors (at most what its completion
 *            ring can still answer: take), check each against the client's object
 *            table (ls_desc_check ran on the private copy in ls_sq_pop; check_desc,
 *            validate.c, is the rest of the one validator), look each valid one up in
 *            the client's recordings (recordings.c) and submit the pass's recordings
 *            in one pooled primary command buffer (vkCmdExecuteCommands) with one fence;
 *   wait     (wait.c) with work in flight, poll the oldest fence (and the rings, while
 *            another submission may go) if it holds a command or two, else sleep
 *            on it (in naps while another submission may go: polling through a
 *            longer one costs as much CPU as lavapipe spends running it); with none,
 *            watch the rings for spin_ns after work (a client that waits for each
 *            completion pushes its next descriptor microseconds later), then arm
 *            every ring (NEED_WAKEUP) and sleep in ppoll() on the engine's eventfd
 *            and every heard doorbell. A client with work in its ring and no free
 *            completion slot for its answer is not waiting (takeable): its ring is
 *            armed with LS_NEED_ROOM as well, and its next read of completions rings
 *            its doorbell (polled, such a ring would keep a core busy for as long as
 *            its client chose not to read, and fairshare would count it as least
 *            served). On lavapipe with 8 clients, sleeping at every wait, most of the
 *            arbiter's time goes to futex sleeps and wake-ups (61% in the kernel), so
 *            the steady state polls where a wait is short. Placed (ls_engine_place:
 *            the daemon has put this thread and the driver's on one core,
 *            policy/placement.py), every poll yields that core between looks, since
 *            what the engine waits for (lavapipe's queue thread running the
 *            submission) needs it; see "Cores" in wait.c.
 *
 * Which clients a pass takes, and how much of each, is the scheduling policy: planned in
 * Python (policy/scheduler.py), enforced here with the engine's part of it
 * (policy/engine_policy.c: plans and ranks, lingering, pieces).
 */
#include "internal.h"

#include <unistd.h>

/* ------------------------------------------------------------------ drain */

/* Check and record one popped descriptor d of client slot into the open flight (or answer it, a
 * fence (an LS_OP_NOP, or a checked LS_OP_BARRIER: every command before it already ends with one) or a
 * refusal); a dispatch may begin a cut, an LS_OP_LIST a run (lists.c): 1 then. */
static int take_one(ls_engine *e, uint32_t slot, const struct ls_desc *d, uint32_t cut_us, int streaming)
{
    struct client *c = &e->clients[slot];
    struct object *users[MOST_USERS];
    uint32_t nusers = 0;
    int status = d->opcode == LS_OP_BARRIER ? check_desc(e, c, d, users, &nusers) : 0;
    if (!status && (d->opcode == LS_OP_NOP || d->opcode == LS_OP_BARRIER) && !d->flags) {  /* a fence */
        if (!c->last || add_fence(e, c->last, d->ticket))
            answer(e, slot, d->ticket, 0, 0);
        return 0;
    }
    if (!status)
        status = check_desc(e, c, d, users, &nusers);
    if (!status && d->opcode == LS_OP_LIST) {
        start_run(e, slot, users[0], d);
        return 1;
    }
    struct flight *f = status ? NULL : flight_with_room(e);
    uint32_t dim = 0, pieces = f ? pieces_for(e, c, d, users, nusers, cut_us, &dim) : 0;
    if (pieces) {
        start_cut(e, slot, d, users, nusers, dim, pieces);
        add_piece(e, slot, 0);
        return 1;
    }
    struct recording *r = f ? recording_in(e, c, d, users, nusers, f) : NULL;
    if (!r) {
        answer(e, slot, d->ticket, status ? status : -LS_EFAULT, 0);
        return 0;
    }
    r->uses++;
    f->urgent |= !streaming;
    f->secondaries[f->count] = r->cb;
    struct entry *en = &f->entries[f->count++];
    en->client = slot;
    en->ticket = d->ticket;
    en->recording = r;
    en->groups = d->opcode == LS_OP_DISPATCH ? d->groups[0] * d->groups[1] * d->groups[2] : 0;
    en->piece = 0;
    en->listed = 0;
    en->indirect = d->opcode == LS_OP_DISPATCH_INDIRECT;
    en->list_status = 0;
    en->nusers = nusers;
    en->fences = NO_FENCE;
    hold_objects(en->users, users, nusers);
    c->last = en;
    return 0;
}

/* budget, at most LS_ENGINE_POP and what the flights have room for. */
static int64_t within_room(ls_engine *e, int64_t budget)
{
    int64_t most = room(e) < LS_ENGINE_POP ? room(e) : LS_ENGINE_POP;
    return budget < most ? budget : most;
}

/* A turn of client slot whose list runs, or whose descriptors popped behind one wait (lists.c): the
 * list's next commands, then what waited behind it; budget commands at most. How many went. */
static int take_after(ls_engine *e, uint32_t slot, int64_t budget, uint32_t cut_us)
{
    struct client *c = &e->clients[slot];
    budget = within_room(e, budget);
    if (budget <= 0)
        return 0;
    c->popped = e->popped = 1;
    volatile uint32_t *busy = ls_load_acquire(&e->busy);  /* pairs with ls_engine_set_busy_word's ls_store_release */
    if (busy)
        *busy = slot + 1;               /* as in take(): a crash recording it is this client's */
    int ran = c->run.list != NULL;
    int n = ran ? run_list(e, slot, budget, cut_us) : 0;
    ran = ran && !c->run.list;          /* it ended (and was answered, when it ended early) */
    while (!c->run.list && !c->cut.active && n < budget && c->after_at < c->nafter) {
        n++;
        if (take_one(e, slot, &c->after[c->after_at++], cut_us, 0) && c->cut.active)
            break;
    }
    if (c->after_at >= c->nafter)
        c->nafter = c->after_at = 0;
    if (busy)
        *busy = 0;
    flush_posts(e);
    settle_drops(e, slot);
    return n ? n : ran;
}

/* Pop up to limit of a client's descriptors; record the good ones, answer the rest. Returns how
 * many were popped. May submit (a full batch) and open a new flight on the way. */
static int take(ls_engine *e, uint32_t slot, uint32_t limit, uint32_t cut_us)
{
    struct client *c = &e->clients[slot];
    if (!c->region || c->closing)
        return 0;
    if (c->cut.active)                  /* its cut's next piece first: what it pushed after waits for it */
        return c->cut.tail ? 0 : add_piece(e, slot, 0);
    int space = ls_cq_space(c->region);
    if (space < 0) {
        drop_client(e, slot, space);
        return 0;
    }
    int64_t budget = (int64_t)space - c->outstanding;
    if (budget > limit)
        budget = limit;
    if (cut_us && budget > 1)
        budget = 1;                     /* a cut turn takes one command */
    int64_t owner = cut_us && e->cuts ? cut_under_way(e, e->pass_rank) : -1;
    if (owner >= 0) {                   /* the turn is the cut's under way (its own turn may never come) */
        struct client *o = &e->clients[owner];
        int goes = !o->cut.tail && !o->closing && o->cut.rank == e->pass_rank;
        return goes ? add_piece(e, (uint32_t)owner, 0) : 0;
    }
    if (c->run.list || c->after_at < c->nafter)  /* its list's commands, then what waited behind it */
        return take_after(e, slot, cut_us ? 1 : limit, cut_us);
    budget = within_room(e, budget);
    if (budget <= 0)
        return 0;
    int streaming = streams(c, space);
    int n = ls_sq_pop(c->region, (char *)e->descs, (uint32_t)budget);
    if (n < 0) {
        drop_client(e, slot, n);
        return 0;
    }
    if (n == 0)
        return 0;
    c->outstanding += n;
    c->stats.submitted += n;
    c->stats.popped_since += n;
    c->popped = e->popped = 1;
    volatile uint32_t *busy = ls_load_acquire(&e->busy);  /* pairs with ls_engine_set_busy_word's ls_store_release */
    if (busy)
        *busy = slot + 1;               /* a crash from here on is this client's descriptor's */
    for (int i = 0; i < n; i++) {
        if (!take_one(e, slot, &e->descs[i], cut_us, streaming) || !c->run.list)
            continue;
        int kept = i + 1 < n ? stash_after(c, &e->descs[i + 1], (uint32_t)(n - i - 1)) : 0;  /* they wait for it */
        for (int k = i + 1; kept && k < n; k++)
            answer(e, slot, e->descs[k].ticket, kept, 0);
        run_list(e, slot, within_room(e, budget - i), cut_us);  /* its first commands, in this turn */
        break;
    }
    if (busy)
        *busy = 0;
    flush_posts(e);
    settle_drops(e, slot);
    return n;
}

/* Descriptors of client c that the engine can pop now: those waiting in its ring, but none while
 * its completion ring has no free slot past the answers it still owes (the client has not read
 * its completions, and popping more would leave answers nowhere to go). Such a client is not
 * waiting: it is woken for when it reads (sleep_on_bells). Negative: its ring failed validation. */
int takeable(struct client *c)
{
    int pending = ls_sq_pending(c->region);
    if (pending <= 0)
        return pending;
    int space = ls_cq_space(c->region);
    if (space < 0)
        return space;
    return (int64_t)space > (int64_t)c->outstanding ? pending : 0;
}

/* What client c waits to have taken: the next piece of its cut once the last has retired, the next
 * commands of its list (then what waits behind it), else its ring's. */
int waits(struct client *c)
{
    if (c->cut.active)
        return !c->cut.tail;
    if (c->run.list)
        return (int)(c->run.list->count - c->run.next);
    return c->after_at < c->nafter ? (int)(c->nafter - c->after_at) : takeable(c);
}

/* Read every takeable client's pending count into its stats; how many clients wait. */
uint32_t look(ls_engine *e)
{
    uint32_t waiting = 0;
    int32_t top = INT32_MIN;
    uint64_t sig = e->nflights;
    for (uint32_t i = 0; i < e->nactive; i++) {
        uint32_t slot = e->active[i];
        struct client *c = &e->clients[slot];
        if (c->closing) {
            c->stats.pending = 0;
            continue;
        }
        int pending = waits(c);
        if (pending < 0) {
            drop_client(e, slot, pending);
            pending = 0;
        }
        c->stats.pending = (uint32_t)pending;
        waiting += pending > 0;
        if (pending > 0)
            sig += (uint64_t)(slot + 1) * 0x9e3779b97f4a7c15ull;
        if (pending > 0 && !c->cut.active && c->rank > top)
            top = c->rank;
    }
    e->waiting_sig = sig;
    e->waiting_rank = top;
    return waiting;
}

/* Pop the waiting clients' work: the plan's turns, in order (planned), else all each client has, round
 * robin. Submits the open flight unless it lingers or waits for a higher rank (engine_policy.c). */
static int drain(ls_engine *e)
{
    int popped = 0;
    if (e->policy.planned) {
        for (uint32_t t = 0; t < e->nplan; t++) {
            struct ls_engine_turn turn = e->plan[t];
            if (turn.client >= e->cfg.max_clients)
                continue;
            at_rank(e, turn.rank);      /* a higher priority's fence must not wait for lower work */
            popped |= take(e, turn.client, turn.budget, turn.cut_us) > 0;
        }
    } else {
        e->pass_rank = 0;
        uint32_t n = e->nactive, start = n ? e->rotate++ % n : 0;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t slot = e->active[(start + i) % n];
            if (e->clients[slot].stats.pending)
                popped |= take(e, slot, LS_ENGINE_POP, 0) > 0;
        }
    }
    if (!hold(e) && !deferred(e))
        submit(e);
    return popped;
}

/* ------------------------------------------------------------------ the loop */

/* Answer with status every descriptor client slot's ring still holds, unrun. */
void cancel_queued(ls_engine *e, uint32_t slot, int32_t status)
{
    struct client *c = &e->clients[slot];
    for (;;) {
        int space = ls_cq_space(c->region);
        int64_t budget = (int64_t)space - c->outstanding;
        if (space < 0 || budget <= 0)
            return;
        int n = ls_sq_pop(c->region, (char *)e->descs, budget < LS_ENGINE_POP ? (uint32_t)budget : LS_ENGINE_POP);
        if (n <= 0)
            return;
        c->outstanding += n;
        c->stats.submitted += n;
        for (int i = 0; i < n; i++)
            answer(e, slot, e->descs[i].ticket, status, 0);
        flush_posts(e);
    }
}

/* After the loop: cancel what waits, give what runs stop_timeout_ns, then answer and abandon the rest. */
static void shutdown_engine(ls_engine *e)
{
    pthread_mutex_lock(&e->lock);
    submit(e);                          /* a lingering submission: answered below like the rest */
    for (uint32_t i = 0; i < e->nactive; i++) {
        uint32_t slot = e->active[i];
        if (!e->clients[slot].closing)
            cancel_queued(e, slot, -LS_ECANCELED);
        cancel_after(e, slot, -LS_ECANCELED);
        int gone = e->faulted || e->device_lost;
        if (e->clients[slot].cut.active && gone)
            end_cut(e, slot, -LS_EFAULT);
        else if (e->clients[slot].cut.active)
            finish_cut(e, slot);        /* it runs: it gets the time running work gets (a list's goes on) */
        if (e->clients[slot].run.list && !gone)
            run_list(e, slot, room(e), 0);  /* it runs: what the flights take */
        end_run(e, slot, gone ? -LS_EFAULT : -LS_ECANCELED);
    }
    flush_posts(e);
    submit(e);
    pthread_mutex_unlock(&e->lock);
    int64_t deadline = ls_now_ns() + e->stop_timeout_ns;
    for (uint32_t k = 0; k < e->nflights; k++) {
        int64_t left = deadline - ls_now_ns();
        VkFence fence = flight_at(e, k)->fence;
        if (e->vk.WaitForFences(e->device, 1, &fence, VK_TRUE, left > 0 ? (uint64_t)left : 0) != VK_SUCCESS)
            break;
    }
    pthread_mutex_lock(&e->lock);
    retire(e);
    e->abandoned = (int)e->nflights;
    int32_t status = e->faulted ? -LS_EFAULT : -LS_ECANCELED;
    while (e->nflights) {               /* answered, never released: it still runs on the device */
        struct flight *f = flight_at(e, 0);
        for (uint32_t k = 0; k < f->count; k++)
            finish_entry(e, &f->entries[k], status, 0, 0, 1);
        flush_posts(e);
        f->count = 0;
        e->head = (e->head + 1) % NFLIGHT;
        e->nflights--;
    }
    pthread_mutex_unlock(&e->lock);
}

/* The engine's thread: retire, drain, wait, until ls_engine_stop; then shutdown_engine. */
void *run(void *arg)
{
    ls_engine *e = arg;
    pthread_setname_np(pthread_self(), "libshare-engine");  /* for ps -L, top -H and the tests */
    ls_store_release(&e->tid, (int32_t)gettid());  /* pairs with ls_engine_start's ls_load_acquire */
    for (;;) {
        pthread_mutex_lock(&e->lock);
        if (e->stopping) {
            pthread_mutex_unlock(&e->lock);
            break;
        }
        int busy = retire(e);
        check_watchdog(e);
        int can_pop = !e->faulted && !e->device_lost && e->nflights < e->policy.max_in_flight && !deferred(e);
        uint32_t waiting = can_pop ? look(e) : 0;
        int planned = e->policy.planned;
        int piece = can_pop && piece_now(e);  /* a cut goes on: the turn that began it holds */
        int replan = plan_due(e, piece, waiting);
        uint64_t sig = e->waiting_sig;
        pthread_mutex_unlock(&e->lock);
        if (replan) {
            ls_engine_plan_cb(e);       /* Python sets the turns; no lock held */
            pthread_mutex_lock(&e->lock);
            e->plan_sig = sig;
            e->planned_at = ls_now_ns();
            pthread_mutex_unlock(&e->lock);
        }
        pthread_mutex_lock(&e->lock);
        e->withheld = 0;
        if (!piece && waiting && e->policy.planned == (uint32_t)planned && !e->faulted) {
            int popped = drain(e);
            busy |= popped;
            e->withheld = !popped;      /* the plan keeps them waiting: sleep on the fence (work_waiting) */
            e->withheld_sig = sig;
        }
        busy |= piece;
        if (e->cuts)
            busy |= continue_cuts(e);
        if (e->runs)
            busy |= continue_runs(e);
        int64_t linger = hold(e) ? LINGER_NS - (ls_now_ns() - flight_at(e, 0)->opened) : 0;
        if (linger <= 0 && !deferred(e))
            submit(e);                  /* a lingering submission's time is up (or none is open) */
        pthread_mutex_unlock(&e->lock);
        if (linger > 0)
            sleep_on_bells(e, linger);
        else if (!busy)
            wait_for_work(e);
    }
    shutdown_engine(e);
    return NULL;
}
