/*
 * The scheduling policy's C part: what the engine's loop (engine/loop.c) does with the plans of
 * the scheduler (scheduler.py, beside this file), and the choices it makes on its own thread
 * between two plans: when a plan is asked for, which submission waits for which, when a
 * submission lingers, and which dispatches run in pieces. It is compiled into the engine
 * (engine/_build.py) and works on the engine's structs (engine/internal.h).
 *
 * Policy. With policy.planned == 0 every waiting client gets all it has, in turn
 * (round robin start), in one submission. With planned == 1 the engine calls
 * ls_engine_plan_cb (Python, the scheduler) before a pass; it reads the
 * clients' counters and sets the pass's turns with ls_engine_set_plan, and the
 * engine pops exactly that, one submission per rank. A plan holds for later
 * passes while the same clients wait and as many submissions run, for at most
 * policy.plan_ns (1 ms): the scheduler's picture (device time decaying over
 * 250 ms, slices of 200 us) changes little within it, and a client that starts
 * waiting, a realtime one say, is planned for at once (plan_due). An empty plan
 * holds too: asked again at every look, the scheduler (and the GIL) would be called
 * 50,000 times a second while one low-priority dispatch runs and the next one waits.
 * Nor is work that the plan keeps waiting work to wake for: while a submission
 * runs, the engine sleeps on its fence (work_waiting, new_only) until other clients
 * wait than those the last pass withheld. Looking again at once, the engine would
 * poll at half a core while low-priority work waits behind a running one, on the
 * core where lavapipe's queue thread runs that work (in bench 2 of
 * test_scheduler_bench.py the queue thread would wait 665 ms for the core in 1.5 s,
 * p99 1.9 ms a wait, and the realtime client's round trip take 400-490 us at p50
 * where the low commands ahead of it run 280 us each).
 * A pass submits each rank of its plan separately (at_rank), so that a higher
 * priority's fence never waits for lower work, and the lower submission waits in
 * the engine until every higher one in flight has ended (deferred): submitted behind
 * it, it would run on lavapipe's queue thread as soon as the higher one ends, on the
 * core the engine shares with that thread, and the engine would get the core back to
 * answer the higher priority's client only once it has run (180 us in bench 2, for a
 * 2 us realtime dispatch behind 75 us low ones). The device idles meanwhile for as
 * long as the engine takes to retire one submission and submit the next.
 * The control plane switches to planned only when clients differ (priorities,
 * compute shares, fairshare), so the common case never touches the GIL.
 *
 * Lingering. On lavapipe the costs of a submission (vkQueueSubmit waking the
 * queue thread, its sleep after, the engine's sleep on the fence and its wake-up:
 * a timed futex sleep costs 10 to 20 us of CPU in this VM) are paid per
 * submission, and a client that pushes tiny dispatches one by one from Python
 * (one per 2.5 us) is slower than the device: a pass that submitted at once would
 * take the few that had arrived, and the engine would spend 1 to 2 us per dispatch
 * submitting and waiting.
 * So when nothing runs and every command popped comes from a streaming client
 * (one with completions it has not read: it pushes without waiting for answers),
 * the open submission lingers up to LINGER_NS (200 us), while it holds fewer
 * than LINGER_BATCH commands, taking what arrives meanwhile: the engine sleeps
 * on the bells of every other client (their pushes end the wait, and their work
 * makes the submission urgent) and on its eventfd. A client that waits for each
 * answer (its completion ring read) is never delayed, nor is planned work (the
 * scheduler decides there), nor work while a fault is being handled; a
 * streaming client's work waits at most LINGER_NS more, when the device is idle.
 *
 * Pieces. A device that cannot preempt makes a realtime dispatch that comes while
 * a low one runs wait for all that is left of it: in bench 2 of
 * test_scheduler_bench.py (240 us low commands), with every dispatch run whole, the
 * realtime p99 is 2.5-3.2x its p99 alone, above the 2x target.
 * So while a higher priority is active, the scheduler's turn for lower work
 * carries cut_us (50 us, or the top priority's own command length if longer:
 * scheduler.py, Scheduler._cut_ns) and takes one command, and a dispatch estimated
 * (below) at over CUT_OVER times cut_us runs in pieces (pieces_for): each a
 * vkCmdDispatchBase over a slice of its workgroups along its longest dimension,
 * recorded on its own and submitted alone, LS_ENGINE_MAX_PIECES at most. A piece
 * goes on the device only when nothing else is there: at once when no client of
 * a higher rank than the cut's waits (piece_now, without asking the scheduler,
 * whose turn holds for every piece of its command: asked between two pieces, it
 * would keep the device idle meanwhile), else at the client's next turn. So a
 * realtime dispatch waits for one piece at most. One lower command in all holds
 * across the passes of a cut: while one is under way, a cut turn of its rank begins
 * no new command and goes to that cut instead (cut_under_way). Each realtime
 * arrival's plan gives the lower clients a turn: were a new command to begin at
 * each, another client's command would go in between two pieces every time, and a
 * cut client would get a fraction of an uncut neighbour's device time; were the
 * turn merely refused, the plan's one lower turn could keep going to the refused
 * client and never to the cut. The workgroups of a dispatch run in any
 * order and may not wait for each other, so the pieces compute what the whole
 * does, but for a shader that reads gl_NumWorkGroups (each piece sees its own
 * count): its program is not cuttable (programs/spirv.py finds the built-in).
 * Pipelines are made with VK_PIPELINE_CREATE_DISPATCH_BASE_BIT. The estimate is the
 * most device time per workgroup that a timed dispatch of the client has taken, all
 * its pieces together, whatever its program (untimed, nothing is cut); a client
 * with none yet has its dispatches run in as many pieces as may be. A narrower
 * estimate can be gamed by its client: a recording's own last run misses a heavy
 * dispatch whose push constants change at every dispatch, and a program's worst
 * misses heavy dispatches that each come from a new program first run on empty
 * workgroups. A client can only raise the worst it has shown, which cuts its own
 * work finer; a new session starts over, so one heavy dispatch per session can run
 * whole. No cut splits a workgroup: the pieces of a dispatch whose
 * workgroups differ in cost are uneven, and one workgroup's run (which the
 * watchdog bounds) is the least a realtime dispatch may wait. The cut holds the
 * dispatch's objects until its last piece is in a flight; each piece's entry
 * holds them too, and only the last answers, with the device time of all (and
 * the first failure among them: book_piece). A command of a list is cut the same way
 * (run_list, engine/lists.c): its pieces answer into the list (each an entry of the list, its
 * device time and failure booked by book_list; the list's next command waits for its last
 * piece), and the end of such a cut is the end of its list (end_cut hands it to end_run).
 * A client closed or dropped mid-cut: the
 * rest never runs, and the ticket is answered (LS_ECANCELED, or the close's reason)
 * as the piece on the device retires; a hand-over (LS_EMOVED) runs the rest piece by
 * piece (continue_cuts: what runs is finished, and the retiring arbiter waits for it); a stop
 * runs the rest at once, in one piece (finish_cut); a fault answers LS_EFAULT. In bench 2 the
 * realtime p99 is 1.1-1.25x its p99 alone; the low clients get about 2.5 s of device
 * time in 4 s instead of 3.45 s, for the device idles between two pieces while the
 * engine retires one and records the next (about 24 us, by the counts), and their
 * dispatches run in 8 or 9 pieces where about 5 would do (a client's worst
 * includes the machine's slow moments). A client whose worst is high has even its
 * cheap dispatches cut, 64 pieces at most: such a command costs the device up to
 * 64 of those gaps, as a dispatch of that length (about 1.5 ms) would. So a cut
 * command is billed (charged_ns_since) the time each piece's submission held the
 * device, gaps included, where its ticket says its device time: billed device
 * time alone, such clients would take much of the other low clients' device time,
 * and fairshare would take them for the least served. (Throughput mode gives turns
 * by command, so there they take what 1.5 ms dispatches would.)
 */
#include "internal.h"

#define LINGER_BATCH 128                /* a lingering submission holds fewer commands than this */
#define CUT_OVER 1.5                    /* a dispatch runs in pieces past this many cut_us */

/* ------------------------------------------------------------------ plans and ranks */

/* Whether the loop asks the scheduler for a new plan before this pass ("Policy"): planned, some client
 * waits (waiting, from look), and no piece of a cut goes on now (piece: the turn that began it holds). A
 * plan holds while the same clients wait and as many submissions run as when it was made (waiting_sig),
 * under the same policy, for at most plan_ns. */
int plan_due(ls_engine *e, int piece, uint32_t waiting)
{
    int due = !piece && e->policy.planned && waiting &&
              (e->waiting_sig != e->plan_sig || e->plan_stale || ls_now_ns() - e->planned_at > (int64_t)e->policy.plan_ns);
    if (due)
        e->plan_stale = 0;              /* a policy set from here on asks again */
    return due;
}

/* Whether the open submission waits for a higher rank's in flight ("Policy"). */
int deferred(ls_engine *e)
{
    if (!e->policy.planned || !e->nflights || e->nflights >= NFLIGHT)
        return 0;
    struct flight *open = flight_at(e, e->nflights);
    if (!open->open || !open->count)
        return 0;
    for (uint32_t k = 0; k < e->nflights; k++)
        if (flight_at(e, k)->rank > open->rank)
            return 1;
    return 0;
}

/* Open the flight for work of rank: one of another rank, open with work, is submitted first ("Policy"). */
void at_rank(ls_engine *e, int32_t rank)
{
    struct flight *open = e->nflights < NFLIGHT ? flight_at(e, e->nflights) : NULL;
    if (open && open->open && open->count && open->rank != rank)
        submit(e);
    e->pass_rank = rank;
}

/* Commands the free flight slots can still take: popping more would leave some without one. */
int64_t room(ls_engine *e)
{
    if (e->nflights >= NFLIGHT)
        return 0;
    struct flight *f = flight_at(e, e->nflights);
    int64_t open = f->open ? LS_ENGINE_MAX_BATCH - f->count : LS_ENGINE_MAX_BATCH;
    return open + (int64_t)LS_ENGINE_MAX_BATCH * (NFLIGHT - 1 - e->nflights);
}

/* ------------------------------------------------------------------ lingering */

/* Whether client c has completions it has not read yet (space: its free completion slots): it
 * pushes work without waiting for the answers to what it pushed before. */
int streams(struct client *c, int space)
{
    if ((uint32_t)space > c->cq_size)
        c->cq_size = (uint32_t)space;
    return (uint32_t)space < c->cq_size;
}

/* Whether the open submission lingers ("Lingering"): nothing runs, the policy is unplanned,
 * no fault, and it holds fewer than LINGER_BATCH commands, all of streaming clients, opened less
 * than LINGER_NS ago. run() submits it once this no longer holds; shutdown_engine at once. */
int hold(ls_engine *e)
{
    if (e->nflights || e->policy.planned || e->faulted || e->device_lost)
        return 0;
    struct flight *f = flight_at(e, 0);
    return f->open && f->count && !f->urgent && f->count < LINGER_BATCH && ls_now_ns() - f->opened < LINGER_NS;
}

/* ------------------------------------------------------------------ pieces */

/* How many pieces dispatch d of client c (checked, its program last in users[]) runs in for a turn cut at
 * cut_us, along the dimension put in *dim; 0: it runs whole ("Pieces"). */
uint32_t pieces_for(ls_engine *e, const struct client *c, const struct ls_desc *d, struct object **users,
                    uint32_t nusers, uint32_t cut_us, uint32_t *dim)
{
    if (!cut_us || d->opcode != LS_OP_DISPATCH || !users[nusers - 1]->cuttable || !e->vk.CmdDispatchBase ||
        !e->policy.timed || !e->cfg.timestamp_mask)
        return 0;
    double groups = (double)d->groups[0] * d->groups[1] * d->groups[2], piece_ns = cut_us * 1000.0;
    double estimate = c->ns_per_group * groups;  /* none yet: as many pieces as may be */
    if (c->ns_per_group && estimate <= CUT_OVER * piece_ns)
        return 0;
    *dim = d->groups[1] > d->groups[0] ? 1 : 0;
    if (d->groups[2] > d->groups[*dim])
        *dim = 2;
    double wanted = c->ns_per_group ? estimate / piece_ns : LS_ENGINE_MAX_PIECES;
    uint32_t pieces = wanted < LS_ENGINE_MAX_PIECES ? (uint32_t)wanted + (wanted > (uint32_t)wanted)
                                                    : LS_ENGINE_MAX_PIECES;  /* wanted, rounded up */
    if (pieces > d->groups[*dim])
        pieces = d->groups[*dim];
    return pieces > 1 ? pieces : 0;
}

/* Start running client slot's dispatch d in pieces along dim: the cut holds its objects until its last
 * piece is in a flight. */
void start_cut(ls_engine *e, uint32_t slot, const struct ls_desc *d, struct object **users, uint32_t nusers,
               uint32_t dim, uint32_t pieces)
{
    struct client *c = &e->clients[slot];
    struct cut *k = &c->cut;
    *k = (struct cut){.active = 1, .dim = dim, .end = d->groups[dim], .step = (d->groups[dim] + pieces - 1) / pieces,
                      .rank = e->pass_rank, .waited_from = ls_now_ns(), .desc = *d, .nusers = nusers};
    hold_objects(k->users, users, nusers);
    e->cuts++;
    c->stats.cut++;
}

/* Put the next piece of client slot's cut in the open flight (with rest, all that is left of it): 1 when it
 * went in (or the cut ended: Vulkan could not record it), 0 when no flight has room. The last piece answers. */
int add_piece(ls_engine *e, uint32_t slot, int rest)
{
    struct client *c = &e->clients[slot];
    struct cut *k = &c->cut;
    struct flight *f = flight_with_room(e);
    if (!f)
        return 0;
    uint32_t base[3] = {0, 0, 0}, count[3] = {k->desc.groups[0], k->desc.groups[1], k->desc.groups[2]};
    uint32_t left = k->end - k->next;
    base[k->dim] = k->next;
    count[k->dim] = rest || left < k->step ? left : k->step;
    volatile uint32_t *busy = ls_load_acquire(&e->busy);  /* pairs with ls_engine_set_busy_word's ls_store_release */
    uint32_t was = busy ? *busy : 0;
    if (busy)
        *busy = slot + 1;               /* as in take(): a crash recording it is this client's */
    struct recording *r = record(e, c, &k->desc, k->users, k->nusers, base, count);
    if (busy)
        *busy = was;
    if (!r) {
        end_cut(e, slot, -LS_EFAULT);
        flush_posts(e);
        return 1;
    }
    k->next += count[k->dim];
    k->waited_from = ls_now_ns();
    r->uses++;
    f->urgent = 1;
    f->secondaries[f->count] = r->cb;
    struct entry *en = &f->entries[f->count++];
    int last = k->next >= k->end;
    uint32_t groups = k->desc.groups[0] * k->desc.groups[1] * k->desc.groups[2];
    *en = (struct entry){.client = slot, .ticket = k->desc.ticket, .recording = r, .groups = last ? groups : 0,
                         .piece = last ? LAST_PIECE : PIECE, .nusers = k->nusers, .fences = NO_FENCE};
    hold_objects(en->users, k->users, k->nusers);
    c->stats.pieces++;
    if (k->listed) {                    /* a list's command: its pieces answer into the list (lists.c) */
        int ends = last && c->run.next == c->run.list->count;
        en->listed = ends ? LIST_LAST : LIST_COMMAND;
        c->run.added++;
        c->run.tail = ends ? NULL : en;
        if (last)
            close_cut(e, c);
        else
            k->tail = en;
        if (ends) {
            c->last = en;
            close_run(e, c);
        }
    } else if (en->piece == LAST_PIECE) {
        c->last = en;                   /* fences popped after it wait for it */
        close_cut(e, c);
    } else {
        k->tail = en;
    }
    return 1;
}

/* Let go of the cut's holds: its last piece is in a flight (which holds them now), or it ended. */
void close_cut(ls_engine *e, struct client *c)
{
    struct cut *k = &c->cut;
    for (uint32_t i = 0; i < k->nusers; i++)
        release(e, k->users[i]);
    k->active = 0;
    k->tail = NULL;
    e->cuts--;
}

/* End client slot's cut before its last piece: the piece on the device answers its ticket with status
 * as it retires (with none on the device, it is answered now; the caller flushes). The rest never runs. */
void end_cut(ls_engine *e, uint32_t slot, int32_t status)
{
    struct client *c = &e->clients[slot];
    if (!c->cut.active)
        return;
    if (c->cut.listed) {                /* a list's command: the list ends with it */
        end_run(e, slot, status);
        return;
    }
    if (!c->cut_status)
        c->cut_status = status;
    if (c->cut.tail) {
        c->cut.tail->piece = LAST_PIECE;
        c->last = c->cut.tail;
    } else {
        answer(e, slot, c->cut.desc.ticket, c->cut_status, 0);
        c->cut_status = 0, c->cut_ns = 0, c->cut_charge = 0;
    }
    close_cut(e, c);
}

/* The slot of a client whose cut of rank or higher is under way, or -1. A cut turn of that rank then
 * begins no new command, for it would overtake that one at every pass its pieces leave free (one lower
 * command in all, as the scheduler says; see "Pieces"): the turn goes to that cut. */
int64_t cut_under_way(ls_engine *e, int32_t rank)
{
    for (uint32_t i = 0; i < e->nactive && e->cuts; i++) {
        const struct cut *k = &e->clients[e->active[i]].cut;
        if (k->active && k->rank >= rank)
            return e->active[i];
    }
    return -1;
}

/* The next piece of a cut into a flight now, without asking the scheduler, when nothing runs or waits to
 * be submitted and no client of a higher rank than the cut's waits: the turn that began the cut holds
 * for all its pieces. (Asked between two pieces, the scheduler would keep the device idle meanwhile.) */
int piece_now(ls_engine *e)
{
    if (!e->cuts || !e->policy.planned || e->nflights || (flight_at(e, 0)->open && flight_at(e, 0)->count))
        return 0;
    uint32_t best = UINT32_MAX;         /* the highest rank's, the longest waiting of them */
    for (uint32_t i = 0; i < e->nactive; i++) {
        uint32_t slot = e->active[i];
        struct client *c = &e->clients[slot];
        if (!c->cut.active || c->cut.tail || c->closing)
            continue;
        struct cut *b = best == UINT32_MAX ? NULL : &e->clients[best].cut;
        if (!b || c->cut.rank > b->rank || (c->cut.rank == b->rank && c->cut.waited_from < b->waited_from))
            best = slot;
    }
    if (best == UINT32_MAX || e->clients[best].cut.rank < e->waiting_rank)
        return 0;
    at_rank(e, e->clients[best].cut.rank);
    return add_piece(e, best, 0);
}

/* Put all that is left of client slot's cut into a flight now, in one piece, behind its piece on the
 * device if one is: what runs is finished (a hand-over, a stop). With no flight free, it ends LS_ECANCELED. */
int finish_cut(ls_engine *e, uint32_t slot)
{
    at_rank(e, e->clients[slot].cut.rank);
    if (add_piece(e, slot, 1))
        return 1;
    end_cut(e, slot, -LS_ECANCELED);
    return 0;
}

/* The cuts that go on outside their client's turns: a faulted engine ends each (LS_EFAULT), and a client
 * handed over (closed LS_EMOVED; any other close ended its cut) goes on with its cut piece by piece, each
 * once the one before has retired: the other clients' work already in flights is never queued behind the
 * whole rest of a long dispatch, and each piece stays under the watchdog. 1 when a piece went into a flight. */
int continue_cuts(ls_engine *e)
{
    int added = 0;
    for (uint32_t i = 0; i < e->nactive && e->cuts; i++) {
        uint32_t slot = e->active[i];
        struct client *c = &e->clients[slot];
        if (!c->cut.active)
            continue;
        if (e->faulted || e->device_lost)
            end_cut(e, slot, -LS_EFAULT);
        else if (c->closing && !c->cut.tail) {
            at_rank(e, c->cut.rank);
            added |= add_piece(e, slot, 0);  /* no flight free: at a later pass */
        }
    }
    flush_posts(e);
    return added;
}

/* Book a retired piece of client c's cut dispatch, which held the device *charge ns; 1 when it is the
 * last, which answers for all of them (*status, *ns and *charge become theirs: the first failure, the
 * device time and the charge of all). */
int book_piece(struct client *c, struct entry *en, int32_t *status, uint64_t *ns, uint64_t *charge)
{
    if (c->cut.tail == en)
        c->cut.tail = NULL;
    if (*status && !c->cut_status)
        c->cut_status = *status;
    c->cut_ns += *status ? 0 : *ns;
    c->cut_charge += *status ? 0 : *charge;
    if (en->piece != LAST_PIECE)
        return 0;
    *status = c->cut_status, *ns = c->cut_ns, *charge = c->cut_charge;
    c->cut_status = 0, c->cut_ns = 0, c->cut_charge = 0;
    return 1;
}
