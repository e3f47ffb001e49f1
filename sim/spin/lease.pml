/*
 * lease.pml -- guard's lease-and-fencing protocol, for Spin.
 *
 * Replicas run ActiveGuard (core/src/guard/active.rs) against a Redis lock
 * service of two nodes (a primary and an asynchronously replicated
 * replica, sim/src/server.rs) whose scripts are those of
 * core/src/lock/redis.rs; a leader's consumer checks its SharedLease
 * (core/src/guard/lease.rs) before every handler call and hands the fence
 * to a resource that refuses fences lower than the highest it accepted
 * (sim/src/resource.rs). README.md in this folder says what is modelled,
 * what is abstracted, and which assertion backs which property.
 *
 * Time is discrete: one tick of true time is the unit of every duration
 * below. Every replica's monotonic clock reads now + e[r] (+ LBASE), where
 * the wander e[r] stays within 0..CLOCKD and moves by at most one per
 * tick: any interval a replica measures is off by at most CLOCKD. Node 1
 * of the lock service reads NSKEW ticks ahead of node 0 (behind if
 * negative); both run at the rate of true time.
 *
 * Switches (spin -D...):
 *   CHECK_P1           monitor property 1 (one acting replica, held by the service)
 *   LOSSY              a failover may lose unreplicated writes, and the primary
 *                      may restart without persistence; otherwise a failover
 *                      happens only once the replica has every write, and there
 *                      is no restart (the assumption property 1 needs)
 *   NO_RENEW_DEADLINE  negative: the leader acts until a renewal says otherwise
 *   PLAIN_COUNTER      negative: fence = counter + 1 (lost with the counter)
 */

/* ------------------------------------------------------------------ */
/* Bounds and timing (ticks). Defaults are the quick configuration.    */

#ifndef NREP
#define NREP 2            /* replicas (2 or 3) */
#endif
#ifndef TTL
#define TTL 5             /* ActiveConfig::ttl */
#endif
#ifndef DRIFT
#define DRIFT 2           /* ActiveConfig::drift, the margin in the renew deadline */
#endif
#ifndef INTERVAL
#define INTERVAL 1        /* ActiveConfig::interval (ttl / 3, rounded down) */
#endif
#ifndef TMAX
#define TMAX 8            /* last tick of true time */
#endif
#ifndef CLOCKD
#define CLOCKD 1          /* wander of each replica's monotonic clock */
#endif
#ifndef NSKEW
#define NSKEW 1           /* node 1's wall clock minus node 0's */
#endif
#ifndef DOWN
#define DOWN 2            /* a failover or restart leaves the service down this long */
#endif
#ifndef SCALE
#define SCALE 4           /* server TIME units (us) per tick: at least the grants one tick can see */
#endif
#ifndef NFAULTS
#define NFAULTS 1         /* failovers plus restarts in one run */
#endif
#ifndef NDEMOTE
#define NDEMOTE 1         /* consumer-requested step-downs (ActiveGuard::demote) in one run */
#endif

#define LBASE TTL         /* replica clocks start at LBASE, so 0 reads as "long past" */
#define NBASE 4           /* node clocks start at NBASE (keeps them >= 0 for |NSKEW| <= 4) */

#define LOCAL(r)  (now + e[r] + LBASE)
#define NODE_CLOCK(n) (now + NBASE + (n) * NSKEW)
#define SRV_NOW   NODE_CLOCK(primary)
#define UP        (now >= down_until)
#define RENEW_DEADLINE (TTL - DRIFT)   /* ActiveConfig::renew_deadline */

#ifdef NO_RENEW_DEADLINE
#define IN_TIME(r, dl) 1
#define SHARED_OK(r)   1
#define ENFORCE        0
#else
#define IN_TIME(r, dl) (LOCAL(r) < (dl))
#define SHARED_OK(r)   (LOCAL(r) < act_until[r])  /* Lease::valid_at */
#define ENFORCE        1
#endif

#ifdef LOSSY
#define LOSSY_ON 1
#else
#define LOSSY_ON 0
#endif

/* in_flight (ActiveGuard's InFlight) */
#define IF_NONE 0
#define IF_ACQ  1
#define IF_REN  2
#define IF_REL  3
/* the one request of a replica: none, at the service, answered */
#define RQ_NONE  0
#define RQ_SENT  1
#define RQ_REPLY 2
/* results: Granted / Renewed::Held / released; Held / Lost / not held; Failed */
#define R_OK   1
#define R_NO   2
#define R_FAIL 3
/* ReleaseFor */
#define FOR_HANDOVER 0
#define FOR_UNWANTED 1

/* ------------------------------------------------------------------ */
/* State.                                                              */

byte now;                       /* true time */
byte e[NREP];                   /* clock wander of each replica */

/* ActiveGuard, one per replica (tokens are grant numbers; 0: none) */
bit  promoted[NREP];
byte tok[NREP];
byte act_until[NREP];           /* renew deadline while promoted; 0 once passed */
short lfence[NREP];             /* leader_fence */
byte lgrant[NREP];              /* the grant the leadership runs on (for the checks) */
byte inf[NREP];
byte sent_at[NREP];             /* 0 once the deadline it gives has passed */
byte optok[NREP];               /* token of the renew or release in flight */
bit  relfor[NREP];
bit  rwi[NREP];                 /* release_when_idle */
byte next_at[NREP];             /* next_attempt; 0 once due */
byte ndemote;

/* the request and its reply */
byte rq[NREP];
byte rv[NREP];
byte rgrant[NREP];
short rfence[NREP];

/* a side effect decided by the handler, on its way to the resource */
bit  pend[NREP];
short pfence[NREP];
byte pgrant[NREP];
#ifdef NO_RENEW_DEADLINE
bit  pok[NREP];                 /* issued before the sender's renew deadline */
#define POK(r) pok[r]
#else
#define POK(r) 1                /* the SharedLease check guarantees it */
#endif

/* lock service: the primary's data and what its replica has received */
byte primary;
byte down_until;
byte nfaults;
byte hold_tok;                  /* the active key's token (0: absent or expired) */
short hold_exp;                 /* its expiry, absolute, on the clock of the node that wrote it */
short ctr;                      /* the domain's fence counter */
byte r_tok;
short r_exp;
short r_ctr;

/* history, for the checks */
byte ngrants;                   /* grants so far: each grant's token */
short max_issued;               /* the largest fence issued so far */
short res_fence;                /* the resource: highest fence accepted */
byte res_grant;                 /* the grant of the newest accepted effect */

/* never-set flags whose names label the assertions in pan's output */
hidden byte P1_one_acting_replica_and_the_service_holds_its_lease;
hidden byte P2b_effect_issued_before_the_senders_renew_deadline;
hidden byte P2c_no_effect_of_an_older_grant_after_a_newer_one;
hidden byte P3_fence_greater_than_every_fence_issued_before;

/* scratch, always written before it is read within one step */
hidden byte t_res, t_tok, t_tok2, t_for;
hidden short t_dl, t_sent, t_f, t_clk;

/* ------------------------------------------------------------------ */
/* The replica: ActiveGuard.                                           */

/* models ActiveGuard's next_attempt updates: a time already reached is
   stored as 0 ("due"), which behaves the same and keeps states few */
inline set_next(r, v) {
  next_at[r] = v;
  if
  :: next_at[r] <= LOCAL(r) -> next_at[r] = 0
  :: else -> skip
  fi
}

/* models ActiveGuard::demote_with (core/src/guard/active.rs) */
inline demote_with(r) {
  if
  :: promoted[r] ->
     promoted[r] = 0; act_until[r] = 0; lfence[r] = 0; lgrant[r] = 0
  :: else -> skip
  fi
}

/* models ActiveGuard::start_release (core/src/guard/active.rs) */
inline start_release(r, token, purpose) {
  inf[r] = IF_REL; optok[r] = token; relfor[r] = purpose; rq[r] = RQ_SENT
}

/* models ActiveGuard::release_unwanted (core/src/guard/active.rs) */
inline release_unwanted(r, token) {
  if
  :: inf[r] == IF_NONE -> start_release(r, token, FOR_UNWANTED)
  :: else -> skip   /* left to expire: one operation at a time */
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

/* models ActiveGuard::after_result (core/src/guard/active.rs); no stop is
   modelled, so finish_stop_if_idle has nothing to do */
inline after_result(r) {
  flush_pending_release(r)
}

/* models ActiveGuard::handle_timeout (core/src/guard/active.rs) */
inline handle_timeout(r) {
  if
  :: ENFORCE && promoted[r] && LOCAL(r) >= act_until[r] ->
     /* the renew deadline: stop acting, drop the token */
     tok[r] = 0; rwi[r] = 0;
     demote_with(r);
     set_next(r, LOCAL(r) + INTERVAL)
  :: else -> skip
  fi;
  if
  :: inf[r] == IF_NONE && LOCAL(r) >= next_at[r] ->
     sent_at[r] = LOCAL(r); rq[r] = RQ_SENT;
     if
     :: tok[r] != 0 -> inf[r] = IF_REN; optok[r] = tok[r]   /* Action::Renew */
     :: else -> inf[r] = IF_ACQ                             /* Action::Acquire */
     fi
  :: else -> skip
  fi
}

/* the runtime calls handle_timeout when poll_timeout is reached (or later:
   a paused process) */
#define TIMEOUT_DUE(r) ((inf[r] == IF_NONE && LOCAL(r) >= next_at[r]) || \
                        (ENFORCE && promoted[r] && LOCAL(r) >= act_until[r]))

/* models ActiveGuard::handle_acquired (core/src/guard/active.rs) */
inline handle_acquired(r, res) {
  t_sent = sent_at[r]; t_dl = sent_at[r] + RENEW_DEADLINE;
  inf[r] = IF_NONE; sent_at[r] = 0;
  if
  :: res == R_OK && !IN_TIME(r, t_dl) ->
     /* granted so late that the lease may be gone: never act on it */
     demote_with(r);
     set_next(r, LOCAL(r) + INTERVAL);
     start_release(r, rgrant[r], FOR_UNWANTED)
  :: res == R_OK && IN_TIME(r, t_dl) ->
     tok[r] = rgrant[r];
     act_until[r] = t_dl;
     if
     :: act_until[r] <= LOCAL(r) -> act_until[r] = 0   /* only without the deadline */
     :: else -> skip
     fi;
     lfence[r] = rfence[r]; lgrant[r] = rgrant[r];
     set_next(r, t_sent + INTERVAL);
     promoted[r] = 1                                    /* Action::Promote */
  :: res != R_OK ->                                     /* Held or Failed */
     set_next(r, LOCAL(r) + INTERVAL)
  fi;
  rgrant[r] = 0; rfence[r] = 0;
  after_result(r)
}

/* models ActiveGuard::handle_renewed (core/src/guard/active.rs) */
inline handle_renewed(r, res) {
  t_sent = sent_at[r]; t_dl = sent_at[r] + RENEW_DEADLINE;
  t_tok = optok[r];
  inf[r] = IF_NONE; sent_at[r] = 0; optok[r] = 0;
  if
  :: res == R_OK && tok[r] == t_tok && promoted[r] && IN_TIME(r, t_dl) ->
     act_until[r] = t_dl;
     if
     :: act_until[r] <= LOCAL(r) -> act_until[r] = 0   /* only without the deadline */
     :: else -> skip
     fi;
     set_next(r, t_sent + INTERVAL)
  :: res == R_OK && !(tok[r] == t_tok && promoted[r] && IN_TIME(r, t_dl)) ->
     /* renewed for a leadership that is over: stop acting, give it back */
     demote_with(r);
     tok[r] = 0; rwi[r] = 0;
     set_next(r, LOCAL(r) + INTERVAL);
     release_unwanted(r, t_tok)
  :: res != R_OK ->                                     /* Lost or Failed */
     if
     :: tok[r] == t_tok -> tok[r] = 0; rwi[r] = 0; demote_with(r)
     :: else -> skip
     fi;
     set_next(r, LOCAL(r) + INTERVAL)
  fi;
  after_result(r)
}

/* models ActiveGuard::handle_released (core/src/guard/active.rs) */
inline handle_released(r, res) {
  t_for = relfor[r];
  inf[r] = IF_NONE; relfor[r] = 0; optok[r] = 0;
  if
  :: t_for == FOR_HANDOVER -> set_next(r, LOCAL(r) + INTERVAL)
  :: else -> skip                                       /* Unwanted */
  fi;
  after_result(r)
}

/* models ActiveGuard::handle (core/src/guard/active.rs): the result of the
   operation in flight; R_FAIL is also what a runtime reports for a call it
   gave up on */
inline handle(r, res) {
  t_res = res; rq[r] = RQ_NONE; rv[r] = 0;
  if
  :: inf[r] == IF_ACQ -> handle_acquired(r, t_res)
  :: inf[r] == IF_REN -> handle_renewed(r, t_res)
  :: inf[r] == IF_REL -> handle_released(r, t_res)
  :: else -> assert(0)
  fi
}

/* models ActiveGuard::demote -> step_down(Requested) (core/src/guard/active.rs):
   demote first, then release */
inline step_down(r) {
  if
  :: promoted[r] ->
     demote_with(r);
     if
     :: tok[r] != 0 -> rwi[r] = 1; flush_pending_release(r)
     :: else -> skip
     fi
  :: else -> skip
  fi
}

/* models SharedLease::check (core/src/guard/lease.rs) passing, then the
   handler call: the side effect leaves with the lease's fence and may
   reach the resource later (a pause between the check and the write) */
inline handler_call(r) {
  pend[r] = 1; pfence[r] = lfence[r]; pgrant[r] = lgrant[r];
#ifdef NO_RENEW_DEADLINE
  pok[r] = (LOCAL(r) < act_until[r])
#endif
}

/* models Resource::write (sim/src/resource.rs) with fencing on: refuse a
   fence lower than the highest accepted */
inline resource_write(r) {
  if
  :: pfence[r] >= res_fence ->
     assert(POK(r) || P2b_effect_issued_before_the_senders_renew_deadline);
     assert(pgrant[r] >= res_grant || P2c_no_effect_of_an_older_grant_after_a_newer_one);
     res_fence = pfence[r]; res_grant = pgrant[r]
  :: else -> skip                                       /* RejectedStale */
  fi;
  pend[r] = 0; pfence[r] = 0; pgrant[r] = 0;
#ifdef NO_RENEW_DEADLINE
  pok[r] = 0
#endif
}

/* One replica: ActiveGuard driven by its runtime (the loop of
   ActiveRunner::run in adapters/std/src/run/active.rs), and its consumer.
   Every step may come late: a replica may be paused at any point. */
proctype Replica(byte r) {
end:
  do
  :: d_step { TIMEOUT_DUE(r) -> handle_timeout(r) }
  :: d_step { rq[r] == RQ_REPLY -> handle(r, rv[r]) }
  :: d_step { rq[r] != RQ_NONE -> handle(r, R_FAIL) }   /* error, lost reply, given up */
  :: d_step { promoted[r] && SHARED_OK(r) && !pend[r] -> handler_call(r) }
  :: d_step { pend[r] -> resource_write(r) }
  :: d_step { promoted[r] && ndemote < NDEMOTE -> ndemote++; step_down(r) }
  od
}

/* ------------------------------------------------------------------ */
/* The lock service.                                                   */

/* models the ACQUIRE_SCRIPT Lua script (core/src/lock/redis.rs) as
   Store::apply runs it for LockOp::Acquire (sim/src/server.rs) */
inline acquire_script(r) {
  if
  :: hold_tok != 0 -> rv[r] = R_NO                      /* SET NX failed: 0 */
  :: else ->
     ngrants++;
     hold_tok = ngrants; hold_exp = t_clk + TTL;
     t_f = ctr + 1;
#ifndef PLAIN_COUNTER
     if
     :: SCALE * t_clk > t_f -> t_f = SCALE * t_clk       /* max(counter + 1, TIME) */
     :: else -> skip
     fi;
#endif
     ctr = t_f;
     assert(t_f > max_issued || P3_fence_greater_than_every_fence_issued_before);
     max_issued = t_f;
     rv[r] = R_OK; rgrant[r] = ngrants; rfence[r] = t_f
  fi
}

/* models the RENEW_SCRIPT Lua script (core/src/lock/redis.rs), LockOp::Renew
   in Store::apply (sim/src/server.rs) */
inline renew_script(r) {
  if
  :: hold_tok != 0 && hold_tok == optok[r] -> hold_exp = t_clk + TTL; rv[r] = R_OK
  :: else -> rv[r] = R_NO
  fi
}

/* models the RELEASE_SCRIPT Lua script (core/src/lock/redis.rs), LockOp::Release
   in Store::apply (sim/src/server.rs) */
inline release_script(r) {
  if
  :: hold_tok != 0 && hold_tok == optok[r] -> hold_tok = 0; hold_exp = 0; rv[r] = R_OK
  :: else -> rv[r] = R_NO
  fi
}

/* models LockService::handle (sim/src/server.rs): one request on the
   primary's clock */
inline serve(r) {
  t_clk = SRV_NOW;
  if
  :: inf[r] == IF_ACQ -> acquire_script(r)
  :: inf[r] == IF_REN -> renew_script(r)
  :: inf[r] == IF_REL -> release_script(r)
  :: else -> assert(0)
  fi;
  rq[r] = RQ_REPLY
}

/* models Store::live / Store::sweep (sim/src/server.rs): the key is gone
   once the serving node's clock reaches its expiry */
inline expire() {
  if
  :: hold_tok != 0 && SRV_NOW >= hold_exp -> hold_tok = 0; hold_exp = 0
  :: else -> skip
  fi
}

#define REPLICA_BEHIND (r_tok != hold_tok || r_exp != hold_exp || r_ctr != ctr)

/* models LockService::replicate (sim/src/server.rs): the replica receives
   every write made so far (any prefix of the writes is reached by taking
   this step right after that prefix) */
inline replicate() {
  r_tok = hold_tok; r_exp = hold_exp; r_ctr = ctr
}

/* models LockService::fail_over (sim/src/server.rs): the replica takes
   over with what it received; the old primary rejoins resynchronised */
inline fail_over() {
  nfaults++;
  hold_tok = r_tok; hold_exp = r_exp; ctr = r_ctr;
  primary = 1 - primary;
  down_until = now + DOWN;
  expire();
  replicate()
}

/* models LockService::restart (sim/src/server.rs): no persistence, the
   replica resynchronises from the empty primary */
inline restart() {
  nfaults++;
  hold_tok = 0; hold_exp = 0; ctr = 0;
  replicate();
  down_until = now + DOWN
}

/* The lock service: answers requests while up, replicates, fails over,
   restarts (LockService in sim/src/server.rs). */
proctype LockService() {
end:
  do
  :: d_step { UP && rq[0] == RQ_SENT -> serve(0) }
#if NREP > 1
  :: d_step { UP && rq[1] == RQ_SENT -> serve(1) }
#endif
#if NREP > 2
  :: d_step { UP && rq[2] == RQ_SENT -> serve(2) }
#endif
  :: d_step { REPLICA_BEHIND -> replicate() }
  :: d_step { nfaults < NFAULTS && (LOSSY_ON || !REPLICA_BEHIND) -> fail_over() }
#ifdef LOSSY
  :: d_step { nfaults < NFAULTS -> restart() }
#endif
  od
}

/* ------------------------------------------------------------------ */
/* Time and clocks.                                                    */

/* models a replica's monotonic clock (Clock::monotonic in sim/src/clock.rs):
   over a tick it advances 0, 1 or 2, staying within CLOCKD of true time */
inline wander(r) {
  if
  :: e[r] > 0 -> e[r]--
  :: true -> skip
  :: e[r] < CLOCKD -> e[r]++
  fi
}

/* a reading already reached is stored as "past" (0): same behaviour,
   fewer states */
inline canon(r) {
  if
  :: next_at[r] != 0 && LOCAL(r) >= next_at[r] -> next_at[r] = 0
  :: else -> skip
  fi;
  if
  :: act_until[r] != 0 && LOCAL(r) >= act_until[r] -> act_until[r] = 0
  :: else -> skip
  fi;
  if
  :: sent_at[r] != 0 && LOCAL(r) >= sent_at[r] + RENEW_DEADLINE -> sent_at[r] = 0
  :: else -> skip
  fi
}

proctype Time() {
end:
  do
  :: atomic {
       now < TMAX ->
       now++;
       wander(0); canon(0);
#if NREP > 1
       wander(1); canon(1);
#endif
#if NREP > 2
       wander(2); canon(2);
#endif
       expire()
     }
  od
}

/* ------------------------------------------------------------------ */
/* Property 1: a replica acts (promoted, and its SharedLease check passes
   on its own clock) only while the lock service's view holds its lease;
   so at most one replica acts at a time. Checked in every state. */

#define ACTS(r)   (promoted[r] && SHARED_OK(r))
#define HOLDS(r)  (hold_tok != 0 && hold_tok == lgrant[r])
#define P1_R(r)   (!ACTS(r) || HOLDS(r))
#if NREP == 1
#define P1_INV P1_R(0)
#elif NREP == 2
#define P1_INV (P1_R(0) && P1_R(1))
#else
#define P1_INV (P1_R(0) && P1_R(1) && P1_R(2))
#endif

#ifdef CHECK_P1
active proctype MonitorP1() {
end:
  atomic { !P1_INV -> assert(P1_INV || P1_one_acting_replica_and_the_service_holds_its_lease) }
}
#endif

init {
  /* ActiveConfig::validate: drift < ttl and interval < ttl - drift */
  assert(DRIFT < TTL && INTERVAL < TTL - DRIFT && INTERVAL >= 1);
  assert(NBASE + NSKEW >= 0 && NREP >= 1 && NREP <= 3);
  atomic {
    run Time();
    run LockService();
    run Replica(0);
#if NREP > 1
    run Replica(1);
#endif
#if NREP > 2
    run Replica(2);
#endif
  }
}
