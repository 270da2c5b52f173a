/*
 * What the engine says: completions to clients, events to the control plane.
 *
 * Completions go out in batches: consecutive answers to one client are posted to its
 * completion ring in one ls_cq_post (flush_posts). Every answer has its slot: take pops no
 * more than the client's free completion slots past the answers it still owes. A fence (an
 * LS_OP_NOP) is answered with the last command its client pushed before it, or at once when
 * none is outstanding. A closing client is drained of nothing more, and LS_EV_IDLE says when
 * its last descriptor has been answered. Events (LS_EV_*) queue for the control plane, which
 * reads them with ls_engine_events; the first one queued writes the control plane's eventfd.
 */
#include "internal.h"

#include <unistd.h>

/* ------------------------------------------------------------------ events */

/* Queue an event for the control plane (ls_engine_events). */
void emit(ls_engine *e, uint32_t type, uint32_t client, int32_t code, uint32_t kind, uint64_t a, uint64_t b)
{
    if (e->nevents == e->events_cap) {
        uint32_t cap = e->events_cap ? 2 * e->events_cap : 64;
        struct ls_engine_event *grown = realloc(e->events, cap * sizeof *grown);
        if (!grown)
            return;                     /* out of memory: the event is lost, the engine goes on */
        e->events = grown, e->events_cap = cap;
    }
    e->events[e->nevents++] = (struct ls_engine_event){type, client, code, kind, a, b};
    if (e->nevents == 1 && e->cfg.event_fd >= 0) {
        uint64_t one = 1;
        ssize_t written = write(e->cfg.event_fd, &one, sizeof one);
        (void)written;                  /* a saturated eventfd is readable already */
    }
}

/* ------------------------------------------------------------------ completions */

/* Close a client's ring as corrupt (LS_EV_DROPPED), and drain nothing more of it. */
void drop_client(ls_engine *e, uint32_t slot, int code)
{
    struct client *c = &e->clients[slot];
    if (c->closing)
        return;
    c->closing = 1;
    ls_store_release(&c->dropped, 1);  /* pairs with ls_engine_dropped's ls_load_acquire (unlocked) */
    ls_close_consumer(c->region, LS_ECORRUPT);
    emit(e, LS_EV_DROPPED, slot, code, 0, 0, 0);
    cancel_after(e, slot, -LS_ECANCELED);
    end_run(e, slot, -LS_ECANCELED);
    if (c->cut.active) {
        end_cut(e, slot, -LS_ECANCELED);
        flush_posts(e);                 /* an answer now says LS_EV_IDLE when it was the last */
    } else if (c->outstanding == 0) {
        emit(e, LS_EV_IDLE, slot, 0, 0, 0, 0);
    } else {
        flush_posts(e);                 /* the answers of its stash and list, and LS_EV_IDLE when the last */
    }
}

/* Post the queued completions of one client (answer), and say LS_EV_IDLE when a closing client's
 * last one went. */
void flush_posts(ls_engine *e)
{
    if (!e->post_count)
        return;
    struct client *c = &e->clients[e->post_client];
    uint32_t n = e->post_count;
    e->post_count = 0;
    c->outstanding -= n;
    if ((!c->closing || c->handed_over) && c->region) {
        int posted = ls_cq_post(c->region, (const char *)e->post_buf, n);
        if (posted != (int)n) {         /* the budget in take() makes a short post impossible */
            drop_client(e, e->post_client, posted < 0 ? posted : -LS_ECORRUPT);  /* and says when idle */
            return;
        }
    }
    if (c->closing && c->outstanding == 0 && c->region)
        emit(e, LS_EV_IDLE, e->post_client, 0, 0, 0, 0);
}

/* Queue one completion; consecutive ones of a client go out in one post. */
void answer(ls_engine *e, uint32_t client, uint64_t ticket, int32_t status, uint64_t ns)
{
    if (e->post_count && (e->post_client != client || e->post_count == LS_ENGINE_POP))
        flush_posts(e);
    e->post_client = client;
    e->post_buf[e->post_count++] = (struct ls_cqe){.ticket = ticket, .status = status, .device_ns = ns};
    struct ls_engine_stats *s = &e->clients[client].stats;
    if (status == 0)
        s->completed++;
    else if (status != -LS_EFAULT && status != -LS_ECANCELED)
        s->errors++;
}

/* Answer one entry and the fences after it; with keep, its objects stay counted (abandoned work).
 * held_ns: its share of the time its submission held the device (0: not known). */
void finish_entry(ls_engine *e, struct entry *en, int32_t status, uint64_t ns, uint64_t held_ns, int keep)
{
    struct client *c = &e->clients[en->client];
    uint64_t charge = held_ns > ns ? held_ns : ns;  /* a piece's: the gaps between pieces are its own */
    int answers = 1;
    if (en->listed) {                   /* a list's command: billed as it retires, answered by the last (lists.c) */
        int32_t whole_status = status;  /* a piece's: the whole command's, at its last piece */
        uint64_t whole_ns = ns, whole_charge = charge;
        int whole = !en->piece || book_piece(c, en, &whole_status, &whole_ns, &whole_charge);
        if (whole && !whole_status && whole_ns && en->groups && (double)whole_ns / en->groups > c->ns_per_group)
            c->ns_per_group = (double)whole_ns / en->groups;
        if (!status) {
            c->stats.device_ns += ns;
            c->stats.charged_since += whole;
            c->stats.charged_ns_since += en->piece ? charge : ns;
        }
        answers = book_list(c, en, &status, &ns);
    } else if (en->piece) {
        answers = book_piece(c, en, &status, &ns, &charge);
    }
    if (answers) {
        if (!en->listed && !status && ns && en->groups && (double)ns / en->groups > c->ns_per_group)
            c->ns_per_group = (double)ns / en->groups;  /* the estimate cuts go by (engine_policy.c, "Pieces") */
        answer(e, en->client, en->ticket, status, ns);
        for (int32_t f = en->fences; f != NO_FENCE;) {
            struct fence_node *node = &e->fence_nodes[f];
            answer(e, en->client, node->ticket, status, 0);
            int32_t next = node->next;
            node->next = e->fence_free, e->fence_free = f;
            f = next;
        }
        en->fences = NO_FENCE;
        if (c->last == en)
            c->last = NULL;
        if (status == 0 && !en->listed) {
            c->stats.device_ns += ns;
            c->stats.charged_since++;
            c->stats.charged_ns_since += en->piece ? charge : ns;
        }
    }
    if (keep)
        return;
    for (uint32_t k = 0; k < en->nusers; k++)
        release(e, en->users[k]);
    unuse(e, en->recording);
}

/* Have the fence ticket answered with entry en; -ENOMEM: answer it now. */
int add_fence(ls_engine *e, struct entry *en, uint64_t ticket)
{
    if (e->fence_free == NO_FENCE) {
        uint32_t cap = e->fence_cap ? 2 * e->fence_cap : 256;
        struct fence_node *grown = realloc(e->fence_nodes, cap * sizeof *grown);
        if (!grown)
            return -ENOMEM;
        for (uint32_t i = e->fence_cap; i < cap; i++)
            grown[i].next = i + 1 < cap ? (int32_t)(i + 1) : e->fence_free;
        e->fence_free = (int32_t)e->fence_cap;
        e->fence_nodes = grown, e->fence_cap = cap;
    }
    int32_t f = e->fence_free;
    e->fence_free = e->fence_nodes[f].next;
    e->fence_nodes[f] = (struct fence_node){ticket, NO_FENCE};
    if (en->fences == NO_FENCE)
        en->fences = f;
    else
        e->fence_nodes[en->fences_tail].next = f;
    en->fences_tail = f;
    return 0;
}
