/*
 * slots.pml -- scheduled slots: every replica's SlotTimer (core/src/slot.rs,
 * Every) plans slots from its own wall clock, and claims each with a
 * OnceGuard (core/src/guard/once.rs): one try_lock of the slot's key with
 * the retention as TTL, never unlocked; the winner runs the job. Checks
 * property 4 of README.md.
 *
 * Time is discrete: ticks of true time up to TMAX; slots are the
 * multiples of P (the period). Replica r's wall clock reads true time +
 * off[r], with off[r] in 0..SKEW (drawn at the start; with STEPS it may
 * step to any value in that range at every tick, backwards too, as a
 * disciplined clock's corrections do). The lock service keeps a claimed
 * key for R ticks on its own clock.
 *
 * A timer fires once its wall clock reaches the planned slot (up to EARLY
 * ticks before it: a timer that fires early still runs the planned slot)
 * and at most LATE ticks of wall time after it (a runtime busy with the
 * previous run, or paused); the service answers a claim within LAT ticks,
 * or the claim fails (fail-closed: the slot is skipped). Each replica
 * claims one slot at a time, as Scheduler's run_job does.
 *
 * No slot runs twice while SKEW + EARLY + min(LATE, P - 1) + LAT < R: the
 * claims of one slot span at most that much true time, and the first
 * claim's key lives R ticks (see README.md).
 *
 * Switches (spin -D...):
 *   STEPS      wall clocks step within 0..SKEW at every tick
 *   LOSE_KEYS  negative: the lock service may restart without persistence once
 */

#ifndef NREP
#define NREP 3            /* replicas: 2 or 3 */
#endif
#ifndef P
#define P 3               /* Every's period */
#endif
#ifndef R
#define R 2               /* the slot key's retention: OnceGuard::with_ttl */
#endif
#ifndef SKEW
#define SKEW 1            /* wall clocks are within 0..SKEW of true time */
#endif
#ifndef EARLY
#define EARLY 0
#endif
#ifndef LATE
#define LATE 0
#endif
#ifndef LAT
#define LAT 0
#endif
#ifndef TMAX
#define TMAX 8
#endif

#define NSLOT ((TMAX + SKEW + LATE) / P + 2)
#define WALL(r) (now + off[r])

byte now;
byte off[NREP];

/* SlotTimer: the next planned slot, as an index (slot k is wall time k * P) */
byte nk[NREP];

/* the claim in flight: none, at the service, answered */
#define CL_NONE  0
#define CL_SENT  1
#define CL_REPLY 2
byte cst[NREP];
byte cslot[NREP];
byte cage[NREP];          /* ticks since it was sent */
bit  cwon[NREP];

/* the lock service: each slot key's expiry on its clock (0: absent) */
byte kexp[NSLOT];
bit  restarted;

/* history: runs of each slot */
byte runs[NSLOT];

hidden byte P4_each_slot_runs_at_most_once;
hidden byte t_k, t_lo;

/* models SlotTimer::new (core/src/slot.rs) with Every::next_after: the first
   planned instant after now */
inline timer_new(r) {
  nk[r] = WALL(r) / P + 1
}

/* models SlotTimer::fire (core/src/slot.rs) with Every::slot_of,
   Every::latest_between and Every::next_after, then OnceGuard::allow
   (core/src/guard/once.rs) sending its one try_lock */
inline fire(r) {
  if
  :: WALL(r) < nk[r] * P -> t_k = nk[r]            /* early: the planned slot */
  :: else -> t_k = WALL(r) / P                     /* late: the newest slot <= now */
  fi;
  nk[r] = t_k + 1;
  assert(t_k < NSLOT);
  cst[r] = CL_SENT; cslot[r] = t_k; cage[r] = 0;
  printf("t=%d replica %d (wall %d) fires slot %d\n", now, r, WALL(r), t_k * P)
}

/* models the ACQUIRE_SCRIPT Lua script (core/src/lock/redis.rs) on the
   slot's key: SET NX PX retention */
inline claim(r) {
  if
  :: kexp[cslot[r]] != 0 -> cwon[r] = 0
  :: else -> kexp[cslot[r]] = now + R; cwon[r] = 1
  fi;
  cst[r] = CL_REPLY;
  printf("t=%d the service answers replica %d's claim of slot %d: %d (1: won)\n",
         now, r, cslot[r] * P, cwon[r])
}

/* models OnceGuard::allow's outcome (core/src/guard/once.rs) as run_job
   (adapters/std/src/run/scheduler.rs) uses it: Won runs the job */
inline outcome(r) {
  if
  :: cwon[r] ->
     runs[cslot[r]]++;
     printf("t=%d replica %d runs slot %d\n", now, r, cslot[r] * P);
     assert(runs[cslot[r]] <= 1 || P4_each_slot_runs_at_most_once)
  :: else -> skip                                  /* AlreadyClaimed */
  fi;
  cst[r] = CL_NONE; cslot[r] = 0; cwon[r] = 0; cage[r] = 0
}

/* model machinery, no Rust counterpart. A slot below every timer's next
   one and every claim in flight is never claimed again (a timer only
   moves forward: fire returns at least the planned slot), so its key and
   its count of runs no longer matter: forget them, so that states do not
   carry the past. */
#define LOW(r) (cst[r] != CL_NONE && cslot[r] < nk[r] -> cslot[r] : nk[r])
inline forget_past() {
  t_lo = LOW(0);
  if :: LOW(1) < t_lo -> t_lo = LOW(1) :: else -> skip fi;
#if NREP > 2
  if :: LOW(2) < t_lo -> t_lo = LOW(2) :: else -> skip fi;
#endif
  t_k = 0;
  do
  :: t_k < t_lo && t_k < NSLOT -> kexp[t_k] = 0; runs[t_k] = 0; t_k++
  :: else -> break
  od;
  skip
}

#define DUE(r)     (cst[r] == CL_NONE && WALL(r) + EARLY >= nk[r] * P)
#define OVERDUE(r) (cst[r] == CL_NONE && WALL(r) >= nk[r] * P + LATE)

/* One replica's scheduler loop (run_job, adapters/std/src/run/scheduler.rs). */
proctype Replica(byte r) {
end:
  do
  :: d_step { DUE(r) -> fire(r); forget_past() }
  :: d_step { cst[r] == CL_REPLY -> outcome(r); forget_past() }
  :: d_step { cst[r] != CL_NONE -> cst[r] = CL_NONE; cslot[r] = 0; cwon[r] = 0; cage[r] = 0; forget_past() }
                                                   /* error or lost reply: skipped */
  od
}

/* The lock service answers claims (LockService::handle, sim/src/server.rs). */
proctype LockService() {
end:
  do
  :: d_step { cst[0] == CL_SENT -> claim(0) }
  :: d_step { cst[1] == CL_SENT -> claim(1) }
#if NREP > 2
  :: d_step { cst[2] == CL_SENT -> claim(2) }
#endif
#ifdef LOSE_KEYS
  /* models LockService::restart (sim/src/server.rs): every key is lost */
  :: d_step { !restarted ->
       restarted = 1;
       t_k = 0;
       do
       :: t_k < NSLOT -> kexp[t_k] = 0; t_k++
       :: else -> break
       od;
       printf("t=%d the service restarts empty\n", now) }
#endif
  od
}

#define URGENT(r) (OVERDUE(r) || cst[r] == CL_REPLY || (cst[r] == CL_SENT && cage[r] >= LAT))
#if NREP == 2
#define ANY_URGENT (URGENT(0) || URGENT(1))
#else
#define ANY_URGENT (URGENT(0) || URGENT(1) || URGENT(2))
#endif

/* models a replica's wall clock over one tick (Clock::wall_and_offset,
   sim/src/clock.rs): with STEPS, a correction may set its offset anywhere
   in 0..SKEW */
inline step_clock(r) {
#ifdef STEPS
  if
  :: off[r] = 0
  :: SKEW >= 1 -> off[r] = 1
  :: SKEW >= 2 -> off[r] = 2
  :: SKEW >= 3 -> off[r] = 3
  fi;
#endif
  if
  :: cst[r] == CL_SENT -> cage[r]++
  :: else -> skip
  fi
}

/* models the expiry of slot keys on the service's clock (Store::live and
   Store::sweep, sim/src/server.rs) */
inline expire_keys() {
  t_k = 0;
  do
  :: t_k < NSLOT ->
     if
     :: kexp[t_k] != 0 && kexp[t_k] <= now -> kexp[t_k] = 0
     :: else -> skip
     fi;
     t_k++
  :: else -> break
  od
}

/* True time: one tick, once nothing urgent is left (World::run,
   sim/src/world.rs). */
proctype Time() {
end:
  do
  :: atomic {
       now < TMAX && !ANY_URGENT ->
       now++;
       step_clock(0);
       step_clock(1);
#if NREP > 2
       step_clock(2);
#endif
       expire_keys();
       forget_past()
     }
  od
}

/* models a replica's clock offset, drawn once (Clock::new, sim/src/clock.rs) */
inline draw_offset(r) {
  if
  :: off[r] = 0
  :: SKEW >= 1 -> off[r] = 1
  :: SKEW >= 2 -> off[r] = 2
  :: SKEW >= 3 -> off[r] = 3
  fi
}

init {
  assert(SKEW <= 3 && NREP >= 2 && NREP <= 3 && P >= 1);
  atomic {
    draw_offset(0); timer_new(0);
    draw_offset(1); timer_new(1);
#if NREP > 2
    draw_offset(2); timer_new(2);
#endif
    run Time();
    run LockService();
    run Replica(0);
    run Replica(1);
#if NREP > 2
    run Replica(2);
#endif
  }
}
