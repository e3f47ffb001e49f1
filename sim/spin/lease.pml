/*
 * lease.pml -- leases: ActiveGuard replicas against a Redis lock service.
 *
 * Replicas run ActiveGuard (core/src/guard/active.rs) and check their
 * SharedLease (core/src/guard/lease.rs) before every handler call; the
 * lock service has two nodes, a primary and an asynchronously replicated
 * replica that a failover promotes (LockService in sim/src/server.rs), and
 * runs the scripts of core/src/lock/redis.rs. Checks properties 1 and 2b
 * of README.md; fences are in fence.pml, slots in slots.pml.
 *
 * Time is discrete (one tick of true time is the unit of every duration
 * here) and every time is kept relative to the present: time left until a
 * deadline, time since a request was sent. A state is therefore the same
 * whatever the hour, states of different hours merge, and the search
 * covers runs of any length; only faults, pauses and step-downs are
 * counted (NFAULTS, NPAUSE, NDEMOTE per run).
 *
 * Clocks. A replica's monotonic clock advances by 0, 1 or 2 per tick and
 * keeps within CLOCKD of true time (its wander e[r] is in 0..CLOCKD): any
 * interval it measures is off by at most CLOCKD. The lock service's nodes
 * run at the rate of true time, node 1 NSKEW ticks ahead of node 0 (behind
 * if negative). A key's expiry is absolute on the node that wrote it
 * (Redis replicates absolute expiries), so after a failover it ends NSKEW
 * ticks earlier (or later) in true time. Property 1 holds when
 * CLOCKD + |NSKEW| <= DRIFT (see README.md).
 *
 * States are also reduced by symmetry (see canon): replicas are sorted
 * and token ids renumbered after every step.
 *
 * Scheduling. A running replica takes a due timeout, and handles a reply,
 * before time moves on; the service answers a request, or loses it or its
 * reply, within one tick of its sending. A lost call is reported as failed
 * at any later time (the runtime's timeout). A replica may pause for any
 * number of ticks, and a leader may carry a side effect it decided before
 * the pause (its SharedLease check passed) to the resource after it.
 *
 * Switches (spin -D...):
 *   LOSSY              a failover may lose writes its replica had not received,
 *                      and the primary may restart without persistence; by
 *                      default a failover happens only once the replica has
 *                      every write, and there is no restart: the assumption
 *                      property 1 needs
 *   NO_RENEW_DEADLINE  negative: no renew deadline (the leader acts until a
 *                      renewal says otherwise; the check has no deadline)
 *   RELEASE_BEFORE_DEMOTE  negative: a step-down releases first and demotes
 *                      once the release is answered
 *   KEYLOSS            the lock key alone may be lost (NLOSS times per run: an
 *                      operator's DEL, an eviction) while its grant record,
 *                      which every grant and renewal writes beside it with the
 *                      same TTL, stays; an acquisition is refused while the
 *                      record lives (ACQUIRE_SCRIPT's first line). Property 1
 *                      then reads "the service holds its lease or its grant
 *                      record". Not with LOSSY.
 *   NO_GRANT_RECORD    negative, with KEYLOSS: an acquisition ignores the
 *                      grant record (the script before it had one)
 */

/* ------------------------------------------------------------------ */
/* Bounds and timing, in ticks. The defaults are the quick run.        */

#ifndef NREP
#define NREP 2            /* replicas: 2 or 3 */
#endif
#ifndef TTL
#define TTL 5             /* ActiveConfig::ttl */
#endif
#ifndef DRIFT
#define DRIFT 2           /* ActiveConfig::drift: the margin in the renew deadline */
#endif
#ifndef INTERVAL
#define INTERVAL 1        /* ActiveConfig::interval (ttl / 3, rounded down) */
#endif
#ifndef CLOCKD
#define CLOCKD 1          /* how far a replica's clock wanders from true time */
#endif
#ifndef NSKEW
#define NSKEW 1           /* node 1's clock minus node 0's */
#endif
#ifndef DOWN
#define DOWN 2            /* a failover or restart leaves the service down this long */
#endif
#ifndef NFAULTS
#define NFAULTS 1         /* failovers plus restarts per run */
#endif
#ifndef NPAUSE
#define NPAUSE 1          /* pauses per run */
#endif
#ifndef NDEMOTE
#define NDEMOTE 1         /* step-downs the consumer asks for (ActiveGuard::demote) per run */
#endif
#ifndef GMAX
#define GMAX 9            /* token ids: more than can be referenced at once */
#endif

#ifndef NLOSS
#define NLOSS 1           /* lock keys lost alone per run (KEYLOSS) */
#endif
#if defined(KEYLOSS) && defined(LOSSY)
#error "KEYLOSS models a key lost alone; LOSSY loses the key and its record together"
#endif

#define RD (TTL - DRIFT)  /* ActiveConfig::renew_deadline */
#if NSKEW < 0
#define ASKEW (-(NSKEW))
#else
#define ASKEW (NSKEW)
#endif

#ifdef NO_RENEW_DEADLINE
#define ENFORCE 0
#define IN_TIME(left) 1
#define CHECK_OK(r) 1
#else
#define ENFORCE 1
#define IN_TIME(left) ((left) > 0)
#define CHECK_OK(r) (act_left[r] > 0)      /* Lease::valid_at: now < until */
#endif

/* in_flight (ActiveGuard's InFlight) */
#define IF_NONE 0
#define IF_ACQ  1
#define IF_REN  2
#define IF_REL  3
/* the replica's one call: none, at the service, answered, lost */
#define RQ_NONE  0
#define RQ_SENT  1
#define RQ_REPLY 2
#define RQ_LOST  3
/* results: granted / held / released; busy / lost / not held; failed */
#define R_OK   1
#define R_NO   2
#define R_FAIL 3
/* ReleaseFor */
#define FOR_HANDOVER 0
#define FOR_UNWANTED 1

/* ------------------------------------------------------------------ */
/* State.                                                              */

/* replica clocks */
byte e[NREP];                   /* wander: the clock reads true time + e[r] */
hidden byte adv;                /* scratch: how far a clock moved in one tick */

/* ActiveGuard, one per replica; a token is an id 1..GMAX (0: none) */
bit  promoted[NREP];
byte tok[NREP];                 /* token held */
byte ltok[NREP];                /* the token of the lease acted on, while promoted
                                   (equal to tok then, unless RELEASE_BEFORE_DEMOTE) */
byte act_left[NREP];            /* renew deadline - now, while promoted (0: passed) */
byte inf[NREP];
byte sent_ago[NREP];            /* now - sent_at of the acquire or renew in flight, at most RD */
byte optok[NREP];               /* token of the renew or release in flight */
bit  relfor[NREP];
bit  rwi[NREP];                 /* release_when_idle */
byte next_in[NREP];             /* next_attempt - now (0: due) */
byte ndemote;

/* the call in flight and its reply */
byte rq[NREP];
bit  fresh[NREP];               /* sent during this tick */
byte rv[NREP];
byte rgrant[NREP];              /* the token a grant carries */

/* pauses, and a side effect decided before one */
bit  paused[NREP];
byte npause;
bit  pend[NREP];
bit  pok[NREP];                 /* it was decided before the renew deadline */

/* the lock service */
bit  primary;
byte down_left;
byte nfaults;
byte hold_tok;                  /* the key's token (0: absent or expired) */
byte hold_left;                 /* its expiry - the serving node's clock */
#ifdef KEYLOSS
byte grant_tok;                 /* the grant record's token (0: absent or expired) */
byte grant_left;                /* its expiry - the serving node's clock */
byte nloss;
#endif
#ifdef LOSSY
byte r_tok;                     /* what the replica node has received */
short r_left;                   /* its expiry - the serving node's clock (may be < 0) */
#endif

/* never set: their names label the assertions in pan's output */
hidden byte P1_one_acting_replica_and_the_service_holds_its_lease;
hidden byte P2b_effect_decided_before_the_senders_renew_deadline;

/* true time, for the event log of a replayed counterexample (spin -t)
   only: hidden, so not part of a state */
hidden short tnow;

/* scratch, written before it is read within one step */
hidden byte t_res, t_tok, t_tok2, t_for, t_ago, t_left, t_id, t_sw, t_nid;
hidden byte idmap[GMAX + 1];

#define UP (down_left == 0)


/* ------------------------------------------------------------------ */
/* Symmetry. Replicas differ only in their index, and every process of
   theirs is at the head of its loop between steps, so permuting the
   replicas' data gives an equivalent state; token ids only need to be
   equal or not. After every step, the replicas are sorted and the ids
   renumbered in order of first appearance: fewer states, same verdicts
   (spin -DNO_SYMMETRY to check; replays of counterexamples use it, so
   that replica numbers stay put). */

#ifndef NO_SYMMETRY
/* what the order of replicas is decided by: everything but the ids
   themselves, with how they relate to the key's holder */
#define MIX(acc, base, v) ((acc) * (base) + (v))
#define SKEY1(i) MIX(MIX(MIX(MIX(MIX(MIX(MIX(MIX(promoted[i], \
                   2, tok[i] != 0), \
                   2, tok[i] != 0 && tok[i] == hold_tok), \
                   8, act_left[i]), \
                   4, inf[i]), \
                   8, sent_ago[i]), \
                   2, optok[i] != 0), \
                   2, optok[i] != 0 && optok[i] == tok[i]), \
                   2, optok[i] != 0 && optok[i] == hold_tok)
#define SKEY2(i) MIX(MIX(MIX(MIX(MIX(MIX(MIX(MIX(MIX(MIX(MIX(MIX(MIX(relfor[i], \
                   2, rwi[i]), \
                   8, next_in[i]), \
                   4, rq[i]), \
                   2, fresh[i]), \
                   4, rv[i]), \
                   2, rgrant[i] != 0), \
                   2, rgrant[i] != 0 && rgrant[i] == hold_tok), \
                   2, paused[i]), \
                   2, pend[i]), \
                   2, pok[i]), \
                   4, e[i]), \
                   2, ltok[i] != 0 && ltok[i] == tok[i]), \
                   2, ltok[i] != 0 && ltok[i] == hold_tok)
#define SLESS(i, j) (SKEY1(j) < SKEY1(i) || (SKEY1(j) == SKEY1(i) && SKEY2(j) < SKEY2(i)))

#define swap_field(a, i, j) t_sw = a[i]; a[i] = a[j]; a[j] = t_sw

/* model machinery, no Rust counterpart: puts replicas i and j in order */
inline order(i, j) {
  if
  :: SLESS(i, j) ->
     swap_field(e, i, j); swap_field(promoted, i, j); swap_field(tok, i, j);
     swap_field(act_left, i, j); swap_field(inf, i, j); swap_field(sent_ago, i, j);
     swap_field(optok, i, j); swap_field(relfor, i, j); swap_field(rwi, i, j);
     swap_field(next_in, i, j); swap_field(rq, i, j); swap_field(fresh, i, j);
     swap_field(rv, i, j); swap_field(rgrant, i, j); swap_field(paused, i, j);
     swap_field(pend, i, j); swap_field(pok, i, j); swap_field(ltok, i, j)
  :: else -> skip
  fi
}

/* model machinery: numbers token ids in order of first appearance */
inline see(v) {
  if
  :: v != 0 && idmap[v] == 0 -> t_nid++; idmap[v] = t_nid
  :: else -> skip
  fi
}

/* model machinery: applies that numbering */
inline renumber(v) {
  if
  :: v != 0 -> v = idmap[v]
  :: else -> skip
  fi
}

/* model machinery, no Rust counterpart: the symmetry reduction above */
inline canon() {
  order(0, 1);
#if NREP > 2
  order(1, 2);
  order(0, 1);
#endif
  t_sw = 0;
  do
  :: t_sw <= GMAX -> idmap[t_sw] = 0; t_sw++
  :: else -> break
  od;
  t_nid = 0;
  see(hold_tok);
#ifdef LOSSY
  see(r_tok);
#endif
#ifdef KEYLOSS
  see(grant_tok);
#endif
  see(tok[0]); see(optok[0]); see(rgrant[0]); see(ltok[0]);
  see(tok[1]); see(optok[1]); see(rgrant[1]); see(ltok[1]);
#if NREP > 2
  see(tok[2]); see(optok[2]); see(rgrant[2]); see(ltok[2]);
#endif
  renumber(hold_tok);
#ifdef LOSSY
  renumber(r_tok);
#endif
#ifdef KEYLOSS
  renumber(grant_tok);
#endif
  renumber(tok[0]); renumber(optok[0]); renumber(rgrant[0]); renumber(ltok[0]);
  renumber(tok[1]); renumber(optok[1]); renumber(rgrant[1]); renumber(ltok[1]);
#if NREP > 2
  renumber(tok[2]); renumber(optok[2]); renumber(rgrant[2]); renumber(ltok[2]);
#endif
  skip
}
#else
inline canon() { skip }
#endif

/* ------------------------------------------------------------------ */
/* The replica: ActiveGuard.                                           */

/* models ActiveGuard::demote_with (core/src/guard/active.rs) */
inline demote_with(r) {
  if
  :: promoted[r] -> promoted[r] = 0; act_left[r] = 0; ltok[r] = 0
  :: else -> skip
  fi
}

/* models ActiveGuard::start_release (core/src/guard/active.rs) */
inline start_release(r, token, purpose) {
  inf[r] = IF_REL; optok[r] = token; relfor[r] = purpose;
  rq[r] = RQ_SENT; fresh[r] = 1
}

/* models ActiveGuard::release_unwanted (core/src/guard/active.rs) */
inline release_unwanted(r, token) {
  if
  :: inf[r] == IF_NONE -> start_release(r, token, FOR_UNWANTED)
  :: else -> skip                 /* left to expire: one operation at a time */
  fi
}

/* models ActiveGuard::flush_pending_release (core/src/guard/active.rs) */
inline flush_pending_release(r) {
  if
  :: rwi[r] && inf[r] == IF_NONE ->
     rwi[r] = 0;
     if
     :: tok[r] != 0 -> t_tok2 = tok[r]; tok[r] = 0; start_release(r, t_tok2, FOR_HANDOVER)
     :: else -> skip
     fi
  :: else -> skip
  fi
}

/* models ActiveGuard::after_result (core/src/guard/active.rs); stop is not
   modelled, so finish_stop_if_idle has nothing to do */
inline after_result(r) {
  flush_pending_release(r)
}

/* models ActiveGuard::handle_timeout (core/src/guard/active.rs) */
inline handle_timeout(r) {
  if
  :: ENFORCE && promoted[r] && act_left[r] == 0 ->
     /* the renew deadline: stop acting, drop the token (not released) */
     printf("t=%d r%d demotes: renew deadline\n", tnow, r);
     tok[r] = 0; rwi[r] = 0;
     demote_with(r);
     next_in[r] = INTERVAL
  :: else -> skip
  fi;
  if
  :: inf[r] == IF_NONE && next_in[r] == 0 ->
     sent_ago[r] = 0; rq[r] = RQ_SENT; fresh[r] = 1;
     if
     :: tok[r] != 0 -> inf[r] = IF_REN; optok[r] = tok[r];   /* Action::Renew */
        printf("t=%d r%d sends renew of token %d\n", tnow, r, tok[r])
     :: else -> inf[r] = IF_ACQ;                             /* Action::Acquire */
        printf("t=%d r%d sends acquire\n", tnow, r)
     fi
  :: else -> skip
  fi
}

/* poll_timeout has been reached (the runtime calls handle_timeout then) */
#define TIMEOUT_DUE(r) ((inf[r] == IF_NONE && next_in[r] == 0) || \
                        (ENFORCE && promoted[r] && act_left[r] == 0))

/* sent_at + interval - now, or 0 if that has passed */
#define NEXT_FROM_SENT(ago) (INTERVAL > (ago) -> INTERVAL - (ago) : 0)

/* models ActiveGuard::handle_acquired (core/src/guard/active.rs) */
inline handle_acquired(r, res) {
  t_ago = sent_ago[r]; t_left = RD - sent_ago[r];    /* deadline - now */
  inf[r] = IF_NONE; sent_ago[r] = 0;
  if
  :: res == R_OK && !IN_TIME(t_left) ->
     /* granted so late that the lease may be gone: never act on it */
     printf("t=%d r%d: grant of token %d came too late, releases it\n", tnow, r, rgrant[r]);
     demote_with(r);
     next_in[r] = INTERVAL;
     start_release(r, rgrant[r], FOR_UNWANTED)
  :: res == R_OK && IN_TIME(t_left) ->
     tok[r] = rgrant[r]; ltok[r] = rgrant[r];
     act_left[r] = t_left;
     next_in[r] = NEXT_FROM_SENT(t_ago);
     promoted[r] = 1;                                /* Action::Promote */
     printf("t=%d r%d promoted with token %d, may act for %d more ticks of its clock\n",
            tnow, r, tok[r], act_left[r])
  :: res != R_OK ->                                  /* held elsewhere, or failed */
     next_in[r] = INTERVAL
  fi;
  rgrant[r] = 0;
  after_result(r)
}

/* models ActiveGuard::handle_renewed (core/src/guard/active.rs) */
inline handle_renewed(r, res) {
  t_ago = sent_ago[r]; t_left = RD - sent_ago[r];
  t_tok = optok[r];
  inf[r] = IF_NONE; sent_ago[r] = 0; optok[r] = 0;
  if
  :: res == R_OK && tok[r] == t_tok && promoted[r] && IN_TIME(t_left) ->
     act_left[r] = t_left;
     printf("t=%d r%d renewed token %d, may act for %d more ticks of its clock\n",
            tnow, r, t_tok, act_left[r]);
     next_in[r] = NEXT_FROM_SENT(t_ago)
  :: res == R_OK && !(tok[r] == t_tok && promoted[r] && IN_TIME(t_left)) ->
     /* renewed for a leadership that is over: stop acting, give it back */
     printf("t=%d r%d: renewal of token %d is too late, releases it\n", tnow, r, t_tok);
     demote_with(r);
     tok[r] = 0; rwi[r] = 0;
     next_in[r] = INTERVAL;
     release_unwanted(r, t_tok)
  :: res != R_OK ->                                  /* lost, or failed */
     if
     :: tok[r] == t_tok ->
        printf("t=%d r%d demotes: renewal of token %d lost or failed\n", tnow, r, t_tok);
        tok[r] = 0; rwi[r] = 0; demote_with(r)
     :: else -> skip
     fi;
     next_in[r] = INTERVAL
  fi;
  after_result(r)
}

/* models ActiveGuard::handle_released (core/src/guard/active.rs) */
inline handle_released(r, res) {
  t_for = relfor[r];
  inf[r] = IF_NONE; relfor[r] = 0; optok[r] = 0;
  if
  :: t_for == FOR_HANDOVER ->
#ifdef RELEASE_BEFORE_DEMOTE
     demote_with(r);
#endif
     next_in[r] = INTERVAL
  :: else -> skip                                    /* Unwanted */
  fi;
  after_result(r)
}

/* models ActiveGuard::handle (core/src/guard/active.rs); R_FAIL is also
   what a runtime reports for a call it gave up on */
inline handle(r, res) {
  t_res = res; rq[r] = RQ_NONE; rv[r] = 0;
  if
  :: inf[r] == IF_ACQ -> handle_acquired(r, t_res)
  :: inf[r] == IF_REN -> handle_renewed(r, t_res)
  :: inf[r] == IF_REL -> handle_released(r, t_res)
  :: else -> assert(0)
  fi
}

/* models ActiveGuard::demote, i.e. step_down(Requested)
   (core/src/guard/active.rs): demote first, then release */
inline step_down(r) {
  if
  :: promoted[r] ->
     printf("t=%d r%d steps down\n", tnow, r);
#ifndef RELEASE_BEFORE_DEMOTE
     demote_with(r);
#endif
     if
     :: tok[r] != 0 -> rwi[r] = 1; flush_pending_release(r)
     :: else -> skip
     fi
  :: else -> skip
  fi
}

/* models a stop-the-world pause (Fault::Pause, sim/src/config.rs); if the
   replica leads, SharedLease::check (core/src/guard/lease.rs) may have just
   passed for a handler call whose side effect reaches the resource after
   the pause (an effect sent at once needs no state: the check is its
   guard) */
inline pause(r) {
  npause++; paused[r] = 1;
  if
  :: promoted[r] && CHECK_OK(r) -> pend[r] = 1; pok[r] = (act_left[r] > 0);
     printf("t=%d r%d decides a side effect, then pauses\n", tnow, r)
  :: true -> printf("t=%d r%d pauses\n", tnow, r)
  fi
}

/* the pause ends (Fault::Pause, sim/src/config.rs); the side effect decided
   before it reaches the resource (Resource::write, sim/src/resource.rs:
   its fences are fence.pml's business) */
inline resume(r) {
  paused[r] = 0;
  printf("t=%d r%d resumes\n", tnow, r);
  if
  :: pend[r] ->
     printf("t=%d r%d's side effect reaches the resource\n", tnow, r);
     assert(pok[r] || P2b_effect_decided_before_the_senders_renew_deadline);
     pend[r] = 0; pok[r] = 0
  :: else -> skip
  fi
}

/* One replica: its runtime driving ActiveGuard (the loop of
   ActiveRunner::run, adapters/std/src/run/active.rs) and its consumer. */
proctype Replica(byte r) {
end:
  do
  :: d_step { !paused[r] && TIMEOUT_DUE(r) -> handle_timeout(r); canon() }
  :: d_step { !paused[r] && rq[r] == RQ_REPLY -> handle(r, rv[r]); canon() }
  :: d_step { !paused[r] && rq[r] == RQ_LOST -> handle(r, R_FAIL); canon() }   /* timed out */
  :: d_step { !paused[r] && promoted[r] && ndemote < NDEMOTE -> ndemote++; step_down(r); canon() }
  :: atomic { !paused[r] && npause < NPAUSE -> pause(r); canon() }
  :: d_step { paused[r] -> resume(r); canon() }
  od
}

/* ------------------------------------------------------------------ */
/* The lock service.                                                   */

/* a token id no state refers to (ids are reused: only equality matters) */
#define REFERS(v, r) (tok[r] == (v) || ltok[r] == (v) || optok[r] == (v) || rgrant[r] == (v))
#ifdef LOSSY
#define REF_SERVICE(v) (hold_tok == (v) || r_tok == (v))
#elif defined(KEYLOSS)
#define REF_SERVICE(v) (hold_tok == (v) || grant_tok == (v))
#else
#define REF_SERVICE(v) (hold_tok == (v))
#endif
#if NREP == 2
#define REFERENCED(v) (REF_SERVICE(v) || REFERS(v, 0) || REFERS(v, 1))
#else
#define REFERENCED(v) (REF_SERVICE(v) || REFERS(v, 0) || REFERS(v, 1) || REFERS(v, 2))
#endif

/* models SimLocker::new_token (sim/src/locker.rs): a token no state holds */
inline new_token() {
  t_id = 1;
  do
  :: t_id <= GMAX && REFERENCED(t_id) -> t_id++
  :: else -> break
  od;
  assert(t_id <= GMAX)
}

/* models the ACQUIRE_SCRIPT Lua script (core/src/lock/redis.rs), as
   Store::apply runs LockOp::Acquire (sim/src/server.rs); fences: fence.pml */
inline acquire_script(r) {
  if
  :: hold_tok != 0 -> rv[r] = R_NO                   /* SET NX failed: 0 */
#if defined(KEYLOSS) && !defined(NO_GRANT_RECORD)
  :: hold_tok == 0 && grant_tok != 0 -> rv[r] = R_NO /* the record lives: -PTTL */
#endif
  :: else ->
     new_token();
     hold_tok = t_id; hold_left = TTL;
#ifdef KEYLOSS
     grant_tok = t_id; grant_left = TTL;
#endif
     printf("t=%d node %d grants token %d to r%d for %d ticks\n", tnow, primary, t_id, r, TTL);
     rv[r] = R_OK; rgrant[r] = t_id
  fi
}

/* models the RENEW_SCRIPT Lua script (core/src/lock/redis.rs), LockOp::Renew
   in Store::apply (sim/src/server.rs) */
inline renew_script(r) {
  if
  :: hold_tok != 0 && hold_tok == optok[r] -> hold_left = TTL; rv[r] = R_OK;
#ifdef KEYLOSS
     grant_tok = optok[r]; grant_left = TTL;
#endif
     printf("t=%d node %d renews token %d for %d ticks\n", tnow, primary, optok[r], TTL)
  :: else -> rv[r] = R_NO
  fi
}

/* models the RELEASE_SCRIPT Lua script (core/src/lock/redis.rs),
   LockOp::Release in Store::apply (sim/src/server.rs) */
inline release_script(r) {
#ifdef KEYLOSS
  /* the holder's record goes, whether its key is there or not */
  if
  :: grant_tok != 0 && grant_tok == optok[r] -> grant_tok = 0; grant_left = 0
  :: else -> skip
  fi;
#endif
  if
  :: hold_tok != 0 && hold_tok == optok[r] -> hold_tok = 0; hold_left = 0; rv[r] = R_OK;
     printf("t=%d node %d releases token %d\n", tnow, primary, optok[r])
  :: else -> rv[r] = R_NO
  fi
}

/* models LockService::handle (sim/src/server.rs) for one request, over a
   link that may lose messages (WorldConfig::loss, sim/src/config.rs):
   served and answered, served with its reply lost, or lost (also while
   the service is down, when handle answers None) */
inline deliver(r) {
  fresh[r] = 0;
  if
  :: UP ->
     if
     :: inf[r] == IF_ACQ -> acquire_script(r)
     :: inf[r] == IF_REN -> renew_script(r)
     :: inf[r] == IF_REL -> release_script(r)
     :: else -> assert(0)
     fi;
     if
     :: rq[r] = RQ_REPLY
     :: rq[r] = RQ_LOST; rv[r] = 0; rgrant[r] = 0;
        printf("t=%d the reply to r%d is lost\n", tnow, r)
     fi
  :: true -> rq[r] = RQ_LOST; printf("t=%d r%d's request is lost\n", tnow, r)
  fi
}

#ifdef LOSSY
#define REPLICA_BEHIND (r_tok != hold_tok || r_left != hold_left)
/* models LockService::replicate (sim/src/server.rs): the replica receives
   every write so far (any prefix of the writes is reached by taking this
   step just after it) */
inline replicate() {
  r_tok = hold_tok; r_left = hold_left
}
#else
#define REPLICA_BEHIND 0
inline replicate() { skip }
#endif

/* models LockService::handle answering None while down (sim/src/server.rs):
   every call at the service is lost */
inline drop_calls() {
  if :: rq[0] == RQ_SENT -> rq[0] = RQ_LOST; fresh[0] = 0 :: else -> skip fi;
  if :: rq[1] == RQ_SENT -> rq[1] = RQ_LOST; fresh[1] = 0 :: else -> skip fi;
#if NREP > 2
  if :: rq[2] == RQ_SENT -> rq[2] = RQ_LOST; fresh[2] = 0 :: else -> skip fi;
#endif
  skip
}

/* models LockService::fail_over (sim/src/server.rs): the replica takes
   over with what it has received, its clock reading expiries; the old
   primary rejoins as its replica, resynchronised */
inline fail_over() {
  nfaults++;
#ifdef LOSSY
  hold_tok = r_tok;
  t_res = 0;
  if
  :: primary == 0 && r_left - NSKEW > 0 -> hold_left = r_left - NSKEW; t_res = 1
  :: primary == 1 && r_left + NSKEW > 0 -> hold_left = r_left + NSKEW; t_res = 1
  :: else -> skip
  fi;
#else
  t_res = 0;
  if
  :: primary == 0 && hold_left - NSKEW > 0 -> hold_left = hold_left - NSKEW; t_res = 1
  :: primary == 1 && hold_left + NSKEW > 0 -> hold_left = hold_left + NSKEW; t_res = 1
  :: else -> skip
  fi;
#endif
  if
  :: t_res == 0 || hold_tok == 0 -> hold_tok = 0; hold_left = 0
  :: else -> skip
  fi;
#ifdef KEYLOSS
  /* the record, written with the key, read on the new primary's clock */
  if
  :: grant_tok != 0 && primary == 0 && grant_left - NSKEW > 0 -> grant_left = grant_left - NSKEW
  :: grant_tok != 0 && primary == 1 && grant_left + NSKEW > 0 -> grant_left = grant_left + NSKEW
  :: else -> grant_tok = 0; grant_left = 0
  fi;
#endif
  primary = 1 - primary;
  printf("t=%d failover to node %d: token %d, %d ticks left on its clock\n",
         tnow, primary, hold_tok, hold_left);
  down_left = DOWN;
  replicate();
  drop_calls()
}

#ifdef LOSSY
/* models LockService::restart (sim/src/server.rs): no persistence; the
   replica resynchronises from the empty primary */
inline restart() {
  nfaults++;
  printf("t=%d node %d restarts empty\n", tnow, primary);
  hold_tok = 0; hold_left = 0;
  replicate();
  down_left = DOWN;
  drop_calls()
}
#endif

/* The lock service (LockService in sim/src/server.rs). */
proctype LockService() {
end:
  do
  :: atomic { rq[0] == RQ_SENT -> deliver(0); canon() }
  :: atomic { rq[1] == RQ_SENT -> deliver(1); canon() }
#if NREP > 2
  :: atomic { rq[2] == RQ_SENT -> deliver(2); canon() }
#endif
#ifdef LOSSY
  :: d_step { REPLICA_BEHIND -> replicate(); canon() }
  :: d_step { nfaults < NFAULTS -> restart(); canon() }
#endif
  /* without LOSSY the replica has every write when it takes over */
  :: d_step { nfaults < NFAULTS -> fail_over(); canon() }
#ifdef KEYLOSS
  /* the key alone is lost: deleted by hand, or evicted */
  :: d_step { nloss < NLOSS && UP && hold_tok != 0 ->
       nloss++;
       printf("t=%d token %d's key is lost; its grant record stays\n", tnow, hold_tok);
       hold_tok = 0; hold_left = 0; canon() }
#endif
  od
}

/* ------------------------------------------------------------------ */
/* Time.                                                               */

/* what a running process does before time moves on: a due timer, a
   reply, a request the service has had for a tick */
#define URGENT(r) ((!paused[r] && (TIMEOUT_DUE(r) || rq[r] == RQ_REPLY)) || \
                   (rq[r] == RQ_SENT && !fresh[r]))
#if NREP == 2
#define ANY_URGENT (URGENT(0) || URGENT(1))
#else
#define ANY_URGENT (URGENT(0) || URGENT(1) || URGENT(2))
#endif

/* models a replica's monotonic clock (Clock::monotonic, sim/src/clock.rs)
   over one tick: it moves by adv = 0, 1 or 2, within CLOCKD of true time;
   what the replica keeps relative to it moves along */
inline clock_tick(r) {
  if
  :: e[r] > 0 -> e[r]--; adv = 0
  :: true -> adv = 1
  :: e[r] < CLOCKD -> e[r]++; adv = 2
  fi;
  fresh[r] = 0;
  next_in[r] = (next_in[r] > adv -> next_in[r] - adv : 0);
  act_left[r] = (act_left[r] > adv -> act_left[r] - adv : 0);
  if
  :: inf[r] == IF_ACQ || inf[r] == IF_REN ->
     sent_ago[r] = (sent_ago[r] + adv < RD -> sent_ago[r] + adv : RD)
  :: else -> skip
  fi
}

/* models the service's clocks over one tick: keys expire (Store::live and
   Store::sweep, sim/src/server.rs), the downtime runs out (down_until) */
inline service_tick() {
  if
  :: hold_left > 1 -> hold_left--
  :: hold_left == 1 -> printf("t=%d token %d expires on node %d\n", tnow, hold_tok, primary);
     hold_tok = 0; hold_left = 0
  :: else -> skip
  fi;
#ifdef KEYLOSS
  if
  :: grant_left > 1 -> grant_left--
  :: grant_left == 1 -> grant_tok = 0; grant_left = 0
  :: else -> skip
  fi;
#endif
#ifdef LOSSY
  /* on the replica's data: dead on either node once below -|NSKEW| */
  if
  :: r_tok != 0 && r_left - 1 > -ASKEW -> r_left--
  :: r_tok != 0 && r_left - 1 <= -ASKEW -> r_tok = 0; r_left = 0
  :: else -> skip
  fi;
#endif
  down_left = (down_left > 0 -> down_left - 1 : 0)
}

/* True time: one tick, once nothing urgent is left (the simulator's event
   loop, World::run in sim/src/world.rs, advancing virtual time). */
proctype Time() {
end:
  do
  :: atomic {
       !ANY_URGENT ->
       tnow++;
       clock_tick(0);
       clock_tick(1);
#if NREP > 2
       clock_tick(2);
#endif
       service_tick();
       canon();
#if NREP > 2
       printf("t=%d clock wander %d %d %d\n", tnow, e[0], e[1], e[2])
#else
       printf("t=%d clock wander %d %d\n", tnow, e[0], e[1])
#endif
     }
  od
}

/* ------------------------------------------------------------------ */
/* Property 1: a replica may act (promoted, and its lease valid on its own
   clock, so a SharedLease check would pass) only while the lock service's
   view holds its lease; hence at most one replica acts at a time.
   Checked in every state: the monitor moves only where it fails. */

#define ACTS(r)  (promoted[r] && CHECK_OK(r))
#ifdef KEYLOSS
/* the key, or the grant record a lost key left */
#define HOLDS(r) ((hold_tok != 0 && hold_tok == ltok[r]) || (grant_tok != 0 && grant_tok == ltok[r]))
#else
#define HOLDS(r) (hold_tok != 0 && hold_tok == ltok[r])
#endif
#define P1_R(r)  (!ACTS(r) || HOLDS(r))
#if NREP == 2
#define P1_INV (P1_R(0) && P1_R(1))
#else
#define P1_INV (P1_R(0) && P1_R(1) && P1_R(2))
#endif

/* models no Rust function: the invariant the simulator measures as two
   acting leaders (World::acting_leaders, sim/src/world.rs), made exact */
#ifndef NO_P1
active proctype MonitorP1() {
end:
  atomic { !P1_INV -> assert(P1_INV || P1_one_acting_replica_and_the_service_holds_its_lease) }
}
#endif

init {
  /* ActiveConfig::validate: drift < ttl, interval < ttl - drift */
  assert(DRIFT < TTL && INTERVAL >= 1 && INTERVAL < RD);
  assert(NREP == 2 || NREP == 3);
  atomic {
    run Time();
    run LockService();
    run Replica(0);
    run Replica(1);
#if NREP > 2
    run Replica(2);
#endif
  }
}
