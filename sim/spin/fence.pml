/*
 * fence.pml -- fences: derived as core/src/lock/redis.rs derives them, by
 * a Redis lock service that loses writes (sim/src/server.rs), and checked
 * by a resource that refuses fences lower than the highest it accepted
 * (sim/src/resource.rs). Checks properties 2 and 3 of README.md; leases
 * are in lease.pml.
 *
 * Time is discrete; SCALE is how many units of the server's TIME
 * (microseconds in Redis) one tick holds. The service has two nodes, node
 * 1's clock NSKEW ticks ahead of node 0's (behind if negative), both at the
 * rate of true time. The primary replicates asynchronously: a failover
 * promotes the replica with whatever it had received (possibly not the
 * last grants, nor the fence counter they advanced), and a restart without
 * persistence empties both. Either leaves the service down for DOWN ticks.
 *
 * Clients are leaders as a fence must survive them: a client that was
 * granted a fence may send side effects with it at any later time (a
 * leader paused for any length of time, or one whose grant was lost in a
 * failover and who never learned). Whether the lease key is taken decides
 * only when the next grant can happen, and fences must hold for grants at
 * any times; so the key may fall free at any moment (expiry on either
 * node's clock, a release, a failover that lost it), and a grant happens
 * whenever a client asks while it is free, at most GPT grants per tick.
 * Renewals do not touch fences and are not modelled.
 *
 * Only the order of fences matters (the resource compares them, the
 * script takes a max), so fences are kept relative to node 0's clock
 * (SCALE * its reading), which every tick lowers by SCALE; values below
 * every fence a clock could still produce are renumbered in order. Grant
 * numbers (the true order of grants) are renumbered in order too, and a
 * client's grant whose fence is below the highest accepted (refused from
 * then on) is forgotten. So states do not depend on the hour and the
 * search covers runs of any length; faults are counted (NFAULTS).
 *
 * The clock bound (from the module notes of core/src/lock/redis.rs): after
 * the counter is lost, the granting node's clock must read more than at
 * any earlier grant; here: |NSKEW| < DOWN (a promoted node lags its old
 * primary by less than the failover takes) and GPT <= SCALE (at most one
 * grant per unit of TIME).
 *
 * Switches (spin -D...):
 *   PLAIN_COUNTER  negative: fence = counter + 1 (the counter is lost with the data)
 *   NO_FENCING     negative: the resource accepts every side effect
 */

#ifndef NREP
#define NREP 2            /* clients (leaders): 2 or 3 */
#endif
#ifndef SCALE
#define SCALE 2           /* server TIME units per tick */
#endif
#ifndef GPT
#define GPT 2             /* grants per tick at most */
#endif
#ifndef NSKEW
#define NSKEW -1          /* node 1's clock minus node 0's */
#endif
#ifndef DOWN
#define DOWN 2            /* a failover or restart leaves the service down this long */
#endif
#ifndef NFAULTS
#define NFAULTS 2         /* failovers plus restarts per run */
#endif

/* SCALE * the serving node's clock, relative to SCALE * node 0's */
#define CLOCK_FENCE (SCALE * primary * (NSKEW))
/* no clock, now or later, gives a fence below this */
#if NSKEW < 0
#define FLOOR (SCALE * (NSKEW))
#else
#define FLOOR 0
#endif
#define UP (down_left == 0)

/* the lock service */
bit  primary;
byte down_left;
byte nfaults;
bit  held;                /* the lease key is taken (on the primary) */
bit  ctr_set;             /* the domain's fence counter exists (on the primary) */
short ctr;
bit  r_held;              /* what the replica has received */
bit  r_ctr_set;
short r_ctr;
byte gtick;               /* grants during this tick */

/* clients: the grant each may still act on */
byte cgrant[NREP];        /* its rank in grant order (0: none) */
short cfence[NREP];       /* its fence (relative; 0 if none) */

/* history, for the checks */
byte ngrants;             /* the newest grant's rank */
bit  mi_set;
short max_issued;         /* the largest fence issued so far */
byte res_grant;           /* the resource: grant of the newest accepted effect (0: none yet) */
short res_fence;          /* and the highest fence it accepted */

/* never set: their names label the assertions in pan's output */
hidden byte P2a_accepted_fences_never_decrease;
hidden byte P2c_no_effect_of_an_older_grant_after_a_newer_one;
hidden byte P3_fence_greater_than_every_fence_issued_before;

/* scratch */
hidden short t_f;
hidden byte t_i, t_j, t_k, t_n;
hidden short vals[7];
hidden short nv[7];
hidden byte pres[7];

/* ------------------------------------------------------------------ */

/* models the ACQUIRE_SCRIPT Lua script (core/src/lock/redis.rs) as
   Store::apply runs LockOp::Acquire (sim/src/server.rs): SET NX, then the
   fence max(counter + 1, TIME), stored as the counter */
inline acquire_script(c) {
  held = 1;
#ifdef PLAIN_COUNTER
  /* fences are absolute here: counter + 1, from 0 when it is missing */
  t_f = (ctr_set -> ctr + 1 : 1);
#else
  if
  :: ctr_set && ctr + 1 > CLOCK_FENCE -> t_f = ctr + 1
  :: else -> t_f = CLOCK_FENCE        /* a missing counter reads 0: TIME wins */
  fi;
#endif
  ctr_set = 1; ctr = t_f;
  assert(!mi_set || t_f > max_issued || P3_fence_greater_than_every_fence_issued_before);
  mi_set = 1; max_issued = t_f;
  ngrants++; gtick++;
  cgrant[c] = ngrants; cfence[c] = t_f;
  printf("node %d grants client %d fence %d (grant %d)\n", primary, c, t_f, ngrants)
}

/* models Resource::write (sim/src/resource.rs) with fencing on */
inline resource_write(c) {
  if
#ifdef NO_FENCING
  :: true ->
#else
  :: res_grant == 0 || cfence[c] >= res_fence ->
#endif
     assert(res_grant == 0 || cfence[c] >= res_fence || P2a_accepted_fences_never_decrease);
     assert(cgrant[c] >= res_grant || P2c_no_effect_of_an_older_grant_after_a_newer_one);
     printf("the resource accepts fence %d from client %d (grant %d)\n", cfence[c], c, cgrant[c]);
     res_fence = cfence[c]; res_grant = cgrant[c]
#ifndef NO_FENCING
  :: else -> skip                                 /* RejectedStale */
#endif
  fi
}

/* ------------------------------------------------------------------ */
/* Renumbering (no behaviour: the same comparisons come out the same).  */

/* model machinery, no Rust counterpart: grant ranks kept in order, made
   dense */
inline renumber_grants() {
  t_i = 1; t_n = 0;
  do
  :: t_i <= ngrants ->
     if
     :: cgrant[0] == t_i || cgrant[1] == t_i ||
#if NREP > 2
        cgrant[2] == t_i ||
#endif
        res_grant == t_i ->
        t_n++;
        if :: cgrant[0] == t_i -> cgrant[0] = t_n :: else -> skip fi;
        if :: cgrant[1] == t_i -> cgrant[1] = t_n :: else -> skip fi;
#if NREP > 2
        if :: cgrant[2] == t_i -> cgrant[2] = t_n :: else -> skip fi;
#endif
        if :: res_grant == t_i -> res_grant = t_n :: else -> skip fi
     :: else -> skip
     fi;
     t_i++
  :: else -> break
  od;
  ngrants = t_n
}

/* model machinery, no Rust counterpart: fences below FLOOR kept in order
   (equal ones equal), packed just below it; each becomes FLOOR - the number
   of distinct values in [itself, FLOOR). Sound because no fence a clock
   can still give is below FLOOR, and a counter below FLOOR + 1 loses to
   the clock in max(counter + 1, TIME) */
inline renumber_fences() {
  vals[0] = ctr;        pres[0] = ctr_set;
  vals[1] = r_ctr;      pres[1] = r_ctr_set;
  vals[2] = max_issued; pres[2] = mi_set;
  vals[3] = res_fence;  pres[3] = (res_grant != 0);
  vals[4] = cfence[0];  pres[4] = (cgrant[0] != 0);
  vals[5] = cfence[1];  pres[5] = (cgrant[1] != 0);
#if NREP > 2
  vals[6] = cfence[2];  pres[6] = (cgrant[2] != 0);
#else
  vals[6] = 0;          pres[6] = 0;
#endif
  t_i = 0;
  do
  :: t_i < 7 ->
     nv[t_i] = vals[t_i];
     if
     :: pres[t_i] && vals[t_i] < FLOOR ->
        t_n = 0; t_j = 0;
        do
        :: t_j < 7 ->
           if
           :: pres[t_j] && vals[t_j] >= vals[t_i] && vals[t_j] < FLOOR ->
              /* count each value at its first occurrence only */
              t_k = 0;
              do
              :: t_k < t_j && !(pres[t_k] && vals[t_k] == vals[t_j]) -> t_k++
              :: else -> break
              od;
              if :: t_k == t_j -> t_n++ :: else -> skip fi
           :: else -> skip
           fi;
           t_j++
        :: else -> break
        od;
        nv[t_i] = FLOOR - t_n
     :: else -> skip
     fi;
     t_i++
  :: else -> break
  od;
  ctr = nv[0]; r_ctr = nv[1]; max_issued = nv[2]; res_fence = nv[3];
  cfence[0] = nv[4]; cfence[1] = nv[5];
#if NREP > 2
  cfence[2] = nv[6];
#endif
  skip
}

/* model machinery: a grant whose fence is below the highest accepted is
   refused from now on (Resource::write, sim/src/resource.rs): forget it */
inline forget_refused() {
  if :: cgrant[0] != 0 && res_grant != 0 && cfence[0] < res_fence -> cgrant[0] = 0; cfence[0] = 0 :: else -> skip fi;
  if :: cgrant[1] != 0 && res_grant != 0 && cfence[1] < res_fence -> cgrant[1] = 0; cfence[1] = 0 :: else -> skip fi;
#if NREP > 2
  if :: cgrant[2] != 0 && res_grant != 0 && cfence[2] < res_fence -> cgrant[2] = 0; cfence[2] = 0 :: else -> skip fi;
#endif
  skip
}

/* model machinery: the three reductions above, after every step */
inline tidy() {
#ifndef NO_FENCING
  forget_refused();
#endif
  renumber_grants();
#ifndef PLAIN_COUNTER
  renumber_fences();
#endif
  skip
}

/* models the nodes' clocks over one tick (Clock::micros_of_local,
   sim/src/clock.rs, read by TIME): every fence is SCALE lower relative to
   them (a plain counter's fences do not depend on clocks: they stay) */
inline shift_fences() {
#ifndef PLAIN_COUNTER
  ctr = (ctr_set -> ctr - SCALE : 0);
  r_ctr = (r_ctr_set -> r_ctr - SCALE : 0);
  max_issued = (mi_set -> max_issued - SCALE : 0);
  res_fence = (res_grant != 0 -> res_fence - SCALE : 0);
  cfence[0] = (cgrant[0] != 0 -> cfence[0] - SCALE : 0);
  cfence[1] = (cgrant[1] != 0 -> cfence[1] - SCALE : 0);
#if NREP > 2
  cfence[2] = (cgrant[2] != 0 -> cfence[2] - SCALE : 0);
#endif
#endif
  skip
}

/* ------------------------------------------------------------------ */

/* A leader: acquires (ActiveGuard's Action::Acquire, the runtime's
   try_lock) and acts on its last grant at any time after it (a handler
   call after SharedLease::check, core/src/guard/lease.rs, however long ago
   that check passed). */
proctype Client(byte c) {
end:
  do
  :: d_step { UP && !held && gtick < GPT -> acquire_script(c); tidy() }
  :: d_step { cgrant[c] != 0 -> resource_write(c); tidy() }
  od
}

/* models LockService::replicate (sim/src/server.rs) */
inline replicate() {
  r_held = held; r_ctr_set = ctr_set; r_ctr = ctr
}

/* models LockService::fail_over (sim/src/server.rs): the replica takes
   over with what it has received; the old primary rejoins resynchronised */
inline fail_over() {
  nfaults++;
  held = r_held; ctr_set = r_ctr_set; ctr = r_ctr;
  primary = 1 - primary;
  down_left = DOWN;
  printf("failover to node %d, fence counter %d (set %d)\n", primary, ctr, ctr_set)
}

/* models LockService::restart (sim/src/server.rs): no persistence */
inline restart() {
  nfaults++;
  held = 0; ctr_set = 0; ctr = 0;
  replicate();
  down_left = DOWN;
  printf("node %d restarts empty\n", primary)
}

/* The lock service (LockService in sim/src/server.rs); the key falls free
   at any moment (see the header): an expiry (Store::live), a release
   (the RELEASE_SCRIPT Lua script, core/src/lock/redis.rs), or nothing
   left on a promoted replica. */
proctype LockService() {
end:
  do
  :: d_step { held -> held = 0 }
  :: d_step { r_held != held || r_ctr_set != ctr_set || r_ctr != ctr -> replicate() }
  :: d_step { nfaults < NFAULTS -> fail_over(); tidy() }
  :: d_step { nfaults < NFAULTS -> restart(); tidy() }
  od
}

/* True time: one tick (the simulator's event loop, World::run in
   sim/src/world.rs, advancing virtual time). */
proctype Time() {
end:
  do
  :: d_step {
       true ->
       gtick = 0;
       down_left = (down_left > 0 -> down_left - 1 : 0);
       shift_fences();
       printf("tick\n");
       tidy()
     }
  od
}

init {
  assert(NREP >= 2 && NREP <= 3 && SCALE >= 1 && GPT >= 1);
  atomic {
    run Time();
    run LockService();
    run Client(0);
    run Client(1);
#if NREP > 2
    run Client(2);
#endif
  }
}
