/*
 * Surviving the arbiter: reattach(), the C half of Reattacher.reattach_external
 * in libshare/client/reattach.py. Compiled after capi.c and capi_control.c, in
 * the unit that build.py makes.
 *
 * When a push or a wait meets the ring's end (-LS_EPEERDEAD), the thread takes
 * both locks, so no other thread uses the old ring, reads what its completion
 * ring still holds, and hands the tickets still pending to the Python session
 * (lsx_py_reattach). Under a control daemon that session moves to the new
 * arbiter (the buffers' memory and ids, the programs' ids stay), reads what the
 * old ring still answers, sends the work the old arbiter never ran to the new
 * one under the same tickets and fails the work it took and never answered
 * with -LS_ERESTARTED; it says which for each ticket, and C opens its view of
 * the new ring (a new lane) and goes on: a push is made there, a wait waits
 * there. `generation` counts the rings, so that threads that met the same end
 * reattach once. Device buffers do not survive: their ids are refused
 * (-LS_EBUFFERLOST) until freed, since the new arbiter may give them out again.
 * Otherwise (embedded, no control daemon, terminated, a fault) the loss is
 * sticky: -LS_ELOST (or -LS_ECORRUPT) on every call. A control call that meets
 * the restart first (-LS_ERESTARTED from Python) reattaches too and is made
 * again.
 */

/* Ask Python which buffers the reattach could not carry over (into lost_ids). Caller holds lock. */
static int note_lost_buffers(ls_session *s)
{
    uint32_t count = 0, capacity;
    int rc;
    do {
        capacity = count;
        uint32_t *ids = realloc(s->lost_ids, (capacity + 1) * sizeof *ids);
        if (ids == NULL)
            return fail(-ENOMEM, "out of memory for the lost buffers");
        s->lost_ids = ids;
        rc = hooked(PYTHON(lsx_py_lost_buffers(s->handle, ids, capacity, &count)));
    } while (rc == 0 && count > capacity);
    s->nlost = rc == 0 ? count : 0;
    return rc;
}

/* Forget a lost buffer id: freed, or given to a new buffer. */
static void forget_lost(ls_session *s, uint32_t buffer_id)
{
    pthread_mutex_lock(&s->lock);
    for (uint32_t i = 0; i < s->nlost; i++)
        if (s->lost_ids[i] == buffer_id)
            s->lost_ids[i--] = s->lost_ids[--s->nlost];
    pthread_mutex_unlock(&s->lock);
}

/*
 * Move the session to the arbiter that replaced a lost one (see the top of this file). Caller holds
 * cq_lock; this takes lock for the whole move (other threads wait: milliseconds with the control
 * daemon's standby, the session's timeout at most). Returns 0 on the new ring, or the sticky loss.
 */
static int reattach(ls_session *s)
{
    int rc = collect_ready(s);          /* what the old ring still holds for us */
    if (rc < 0 && rc != -LS_EPEERDEAD)
        return mark_lost(s, rc);
    pthread_mutex_lock(&s->lock);
    uint32_t count = ls_tickets_pending(s->book);  /* (nothing adds to the book while we hold lock) */
    struct lsx_flight *flights = calloc(count + 1, sizeof *flights);
    uint64_t *tickets = calloc(count + 1, sizeof *tickets);
    uint8_t *marks = calloc(count + 1, 1);
    if (flights && tickets && marks) {
        count = (uint32_t)ls_tickets_list(s->book, tickets, marks, count);
        for (uint32_t i = 0; i < count; i++)
            flights[i] = (struct lsx_flight){.ticket = tickets[i], .moved = (marks[i] & LS_TICKET_MOVED) != 0};
    } else {
        free(flights);
        flights = NULL;                 /* (-ENOMEM below) */
    }
    free(tickets);
    free(marks);
    /* Let go of the old ring while it is mapped: Python unmaps it during the move. */
    ls_producer_close(s->producer);
    ls_region_close(s->region);
    s->producer = NULL;
    s->region = NULL;
    if (s->peer_pidfd >= 0)
        close(s->peer_pidfd);
    s->peer_pidfd = -1;
    struct lsx_conn conn = {.peer_pidfd = -1};
    rc = flights ? hooked(PYTHON(lsx_py_reattach(s->handle, flights, count, &conn))) : -ENOMEM;
    if (rc == 0) {
        ls_tickets_resent(s->book);     /* (no longer moved: sent to the new arbiter) */
        for (uint32_t i = 0; i < count; i++)
            if (flights[i].done)
                ls_tickets_settle(s->book, flights[i].ticket, flights[i].status, flights[i].device_ns);
        s->peer_pidfd = conn.peer_pidfd;
        s->info.client_id = conn.client_id;
        rc = open_ring(s, &conn);
        if (rc == 0)
            rc = note_lost_buffers(s);
        ls_store_relaxed(&s->generation, s->generation + 1);
    }
    if (rc < 0)
        mark_lost(s, rc);
    pthread_mutex_unlock(&s->lock);
    free(flights);
    return rc < 0 ? is_lost(s) : 0;
}
