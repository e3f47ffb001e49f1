//! The world: replicas, the lock service, the network and the protected
//! resource, advanced event by event in virtual time.

use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use guard_core::guard::{Action, ActiveGuard, ActiveTiming, Done, OnceGuard, OnceOutcome};
use guard_core::limit::{Limiter, SlidingWindow};
use guard_core::lock::Scope;
use guard_core::slot::{Every, SlotTimer};
use guard_core::time::Instant;

use crate::clock::{Clock, EPOCH_MS, Nanos};
use crate::config::{Fault, Target, WorldConfig};
use crate::handler::{Effect, Handler, HandlerFactory, LeaderWork, SlotWork};
use crate::locker::{
    Answer, SimLocker, TimedOut, lock_result, renew_result, ttl_nanos, unlock_result,
};
use crate::report::{Report, Timeline};
use crate::resource::Resource;
use crate::rng::{LogHash, Rng};
use crate::server::{LockOp, LockReply, LockService};

/// The lease key every replica's ActiveGuard competes for.
pub const ACTIVE_KEY: &str = "guard:active:{sim}";

/// The longest sliding window a replica's limiter keeps.
const WINDOW_CAP: usize = 64;

/// A slot claim in flight: guard-core's `OnceGuard::allow` awaiting the
/// simulated locker.
type Claim = Pin<Box<dyn Future<Output = (u64, OnceOutcome)>>>;

/// What an ActiveGuard request was for.
#[derive(Clone, Copy, Debug)]
enum LeaseCall {
    Acquire(u128),
    Renew,
    Release,
}

/// Something that happens at an instant of true time.
#[derive(Clone, Debug)]
enum Event {
    /// A replica's ActiveGuard timer (ignored unless `tag` is current).
    LeaseTimer { r: usize, epoch: u64, tag: u64 },
    /// A replica's slot timer.
    SlotFire { r: usize, epoch: u64 },
    /// A leader's periodic side effect.
    Work { r: usize, epoch: u64, tag: u64 },
    /// A limiter request at a replica.
    LimitRequest { r: usize, epoch: u64 },
    /// A request reaches the lock service.
    AtService {
        r: usize,
        epoch: u64,
        id: u64,
        op: LockOp,
    },
    /// A reply reaches a replica.
    AtReplica {
        r: usize,
        epoch: u64,
        id: u64,
        reply: LockReply,
    },
    /// A request's time-out at a replica.
    Timeout { r: usize, epoch: u64, id: u64 },
    /// A side effect reaches the resource, from a leader under lease grant
    /// number `grant`.
    AtResource { r: usize, fence: u64, grant: u64 },
    /// A user handler's side effect reaches the resource: a leader's
    /// (its fence and grant) or a slot's (`None`).
    UserEffect {
        leader: Option<(u64, u64)>,
        effect: Effect,
    },
    /// A fault starts.
    FaultStart(usize),
    /// A crashed replica restarts.
    Restart { r: usize },
}

impl Event {
    /// The replica whose own processing runs this event (and that a pause
    /// or crash therefore delays or drops).
    fn owner(&self) -> Option<(usize, u64)> {
        match *self {
            Event::LeaseTimer { r, epoch, .. }
            | Event::SlotFire { r, epoch }
            | Event::Work { r, epoch, .. }
            | Event::LimitRequest { r, epoch }
            | Event::AtReplica { r, epoch, .. }
            | Event::Timeout { r, epoch, .. } => Some((r, epoch)),
            _ => None,
        }
    }

    /// A number per kind, for the log hash.
    fn kind(&self) -> u64 {
        match self {
            Event::LeaseTimer { .. } => 1,
            Event::SlotFire { .. } => 2,
            Event::Work { .. } => 3,
            Event::LimitRequest { .. } => 4,
            Event::AtService { .. } => 5,
            Event::AtReplica { .. } => 6,
            Event::Timeout { .. } => 7,
            Event::AtResource { .. } => 8,
            Event::FaultStart(_) => 9,
            Event::Restart { .. } => 10,
            Event::UserEffect { .. } => 11,
        }
    }
}

/// An event waiting in the queue: the earliest `at` first, and among
/// equal times the first scheduled (`seq`), so a run is deterministic. The
/// event itself waits in the world's slab at `slot`, so the heap moves only
/// these three words.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Queued {
    at: Nanos,
    seq: u64,
    slot: usize,
}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Queued {
    /// Reversed: the heap pops the greatest, which must be the earliest.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// A replica's current term as leader.
#[derive(Clone, Copy, Debug)]
struct Term {
    /// The fence it acts under.
    fence: u64,
    /// Since when.
    since: Nanos,
    /// The number of the lease grant it leads under.
    grant: u64,
}

/// One replica's live state; a crash drops it and a restart builds anew.
struct Replica {
    clock: Clock,
    epoch: u64,
    up: bool,
    paused_until: Nanos,
    partitioned_until: Nanos,
    locker: Rc<SimLocker>,
    guard: Option<ActiveGuard>,
    lease_calls: HashMap<u64, LeaseCall>,
    timer_tag: u64,
    timer_at: Option<Nanos>,
    work_tag: u64,
    /// The number of the newest grant of the leader key it was answered.
    last_grant: u64,
    leading: Option<Term>,
    slots: Option<SlotTimer<Every>>,
    claims: HashMap<u64, Claim>,
    limiter: Option<Limiter<SlidingWindow<WINDOW_CAP>>>,
    admitted: VecDeque<Instant>,
}

/// The simulated world. Build it with [`World::new`], then [`World::run`].
pub struct World {
    config: WorldConfig,
    /// The leader lease's timing, validated once (from `config.active`).
    active: Option<ActiveTiming>,
    rng: Rng,
    now: Nanos,
    end: Nanos,
    queue: BinaryHeap<Queued>,
    /// The queued events, by slot; `free` lists the empty slots.
    events: Vec<Option<Event>>,
    free: Vec<usize>,
    next_seq: u64,
    replicas: Vec<Replica>,
    service: LockService,
    resource: Resource,
    hash: LogHash,
    timeline: Timeline,
    report: Report,
    /// When the last leader stopped leading through a crash, pending a
    /// takeover measurement.
    leader_lost_at: Option<Nanos>,
    /// How many replicas lead, and since when the count last changed.
    leading_now: usize,
    leading_changed_at: Nanos,
    crashed_at: HashMap<usize, Nanos>,
    /// The grant number of each token granted the leader key, in grant
    /// order.
    grants: HashMap<u128, u64>,
    /// The largest fence granted for the leader key so far.
    highest_leader_fence: Option<u64>,
    scope: Scope,
    /// Makes each replica's user handler (none: no user code).
    handler_factory: Option<HandlerFactory>,
    /// Each replica's handler, made again after a crash.
    handlers: Vec<Box<dyn Handler>>,
    /// The handlers' resource: a ledger of their own, so that user code
    /// changes no verdict on the built-in leader's writes.
    user_resource: Resource,
    /// The handlers' link latencies: a generator of their own, so that
    /// user code changes no random choice of the world's.
    user_rng: Rng,
}

/// Seeds the handlers' generator apart from the world's ("user").
const USER_RNG_SALT: u64 = 0x7573_6572;

fn nanos(d: core::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl World {
    /// A world at time zero, replicas started, faults scheduled; an error
    /// if the configuration cannot run (among others, lease timing that
    /// fails `ActiveConfig::validate`).
    pub fn new(config: WorldConfig) -> Result<Self, String> {
        if config.replicas == 0 {
            return Err("a world needs at least one replica".into());
        }
        if let Some(l) = config.limiter
            && (l.limit == 0 || l.limit as usize > WINDOW_CAP)
        {
            return Err(format!(
                "the limiter's limit must be 1 to {WINDOW_CAP}, not {}",
                l.limit
            ));
        }
        let mut rng = Rng::new(config.seed);
        let mut clock = |max_offset| {
            let offset = i64::try_from(nanos(max_offset)).unwrap_or(i64::MAX);
            let offset_ns = rng.signed(offset);
            let drift_ppm = rng.signed(config.max_drift_ppm);
            Clock::new(offset_ns, drift_ppm, config.clock_sync, &mut rng)
        };
        let clocks: Vec<Clock> = (0..config.replicas)
            .map(|_| clock(config.max_offset))
            .collect();
        let service_clocks = [
            clock(config.service_max_offset),
            clock(config.service_max_offset),
        ];
        let scope = Scope::new("sim")
            .and_then(|s| s.segment("job", "tick"))
            .map_err(|e| e.to_string())?;
        let active = config
            .active
            .map(|a| a.validate())
            .transpose()
            .map_err(|e| format!("bad lease config: {e}"))?;
        let mut world = World {
            end: nanos(config.duration),
            service: {
                let service = LockService::new(
                    nanos(config.replication_lag),
                    service_clocks,
                    config.fence_rule,
                );
                if config.linearizable {
                    service.linearizable()
                } else {
                    service
                }
            },
            resource: Resource::new(config.fencing),
            timeline: Timeline::new(config.replicas, clocks.clone()),
            report: Report::new(config.seed, config.replicas),
            rng,
            now: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            free: Vec::new(),
            next_seq: 0,
            replicas: Vec::new(),
            hash: LogHash::default(),
            leader_lost_at: None,
            leading_now: 0,
            leading_changed_at: 0,
            crashed_at: HashMap::new(),
            grants: HashMap::new(),
            highest_leader_fence: None,
            scope,
            handler_factory: None,
            handlers: Vec::new(),
            user_resource: Resource::new(config.fencing),
            user_rng: Rng::new(config.seed ^ USER_RNG_SALT),
            active,
            config,
        };
        for (r, clock) in clocks.into_iter().enumerate() {
            world.replicas.push(Replica::fresh(clock, 0, r));
            world.start_replica(r);
        }
        for (i, fault) in world.config.faults.clone().iter().enumerate() {
            world.schedule(nanos(fault.at()), Event::FaultStart(i));
        }
        Ok(world)
    }

    /// Runs your code on every replica: `factory` makes replica `r`'s
    /// handler, now and again after each crash (a restarted process keeps
    /// nothing in memory). Its side effects are checked at the resource
    /// and counted in the report (`user_*`); see [`crate::handler`].
    pub fn with_handler(
        mut self,
        factory: impl FnMut(usize) -> Box<dyn Handler> + 'static,
    ) -> Self {
        let mut factory: HandlerFactory = Box::new(factory);
        self.handlers = (0..self.replicas.len()).map(&mut factory).collect();
        self.handler_factory = Some(factory);
        self
    }

    /// Sends the effects of a handler call to the resource, each over the
    /// resource's link.
    fn deliver_user_effects(&mut self, leader: Option<(u64, u64)>, effects: Vec<Effect>) {
        let (lo, hi) = (nanos(self.config.latency.0), nanos(self.config.latency.1));
        for effect in effects {
            let delay = self.user_rng.between(lo, hi);
            self.schedule(self.now + delay, Event::UserEffect { leader, effect });
        }
    }

    fn schedule(&mut self, at: Nanos, event: Event) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let slot = match self.free.pop() {
            Some(slot) => {
                self.events[slot] = Some(event);
                slot
            }
            None => {
                self.events.push(Some(event));
                self.events.len() - 1
            }
        };
        self.queue.push(Queued {
            at: at.max(self.now),
            seq,
            slot,
        });
    }

    /// Runs to the end; `progress` is called with the fraction done, about
    /// every tenth of the run.
    pub fn run(mut self, mut progress: impl FnMut(f64)) -> (Report, Timeline) {
        let tenth = (self.end / 10).max(1);
        let mut next_progress = tenth;
        while let Some(queued) = self.queue.pop() {
            if queued.at > self.end {
                break;
            }
            self.now = queued.at;
            while self.now >= next_progress {
                progress(next_progress as f64 / self.end.max(1) as f64);
                next_progress += tenth;
            }
            if let Some(event) = self.events[queued.slot].take() {
                self.free.push(queued.slot);
                self.dispatch(queued, event);
            }
        }
        self.now = self.end;
        self.finish()
    }

    fn dispatch(&mut self, queued: Queued, event: Event) {
        if let Some((r, epoch)) = event.owner() {
            let replica = &self.replicas[r];
            if !replica.up || replica.epoch != epoch {
                return; // the incarnation it belonged to is gone
            }
            if replica.paused_until > self.now {
                // Paused: everything the replica would do waits, in order.
                let resume = replica.paused_until;
                let slot = self.free.pop().unwrap_or(queued.slot);
                self.events[slot] = Some(event);
                self.queue.push(Queued {
                    at: resume,
                    slot,
                    ..queued
                });
                return;
            }
        }
        self.report.events += 1;
        let (r, data) = match &event {
            Event::AtService { r, id, .. } | Event::Timeout { r, id, .. } => (*r, *id),
            Event::AtReplica { r, id, .. } => (*r, *id),
            Event::LeaseTimer { r, .. }
            | Event::SlotFire { r, .. }
            | Event::Work { r, .. }
            | Event::LimitRequest { r, .. }
            | Event::Restart { r } => (*r, 0),
            Event::AtResource { r, fence, .. } => (*r, *fence),
            Event::FaultStart(i) => (usize::MAX, *i as u64),
            Event::UserEffect { effect, .. } => (usize::MAX, effect.0),
        };
        self.hash.add(&[self.now, event.kind(), r as u64, data]);
        match event {
            Event::LeaseTimer { r, tag, .. } => {
                if self.replicas[r].timer_tag == tag {
                    self.replicas[r].timer_at = None;
                    let local = self.local(r);
                    if let Some(g) = self.replicas[r].guard.as_mut() {
                        g.handle_timeout(local);
                    }
                    self.drive_lease(r);
                }
            }
            Event::SlotFire { r, .. } => self.fire_slot(r),
            Event::Work { r, tag, .. } => self.work(r, tag),
            Event::LimitRequest { r, .. } => self.limit_request(r),
            Event::AtService { r, epoch, id, op } => self.at_service(r, epoch, id, &op),
            Event::AtReplica { r, id, reply, .. } => self.at_replica(r, id, Ok(reply)),
            Event::Timeout { r, id, .. } => self.at_replica(r, id, Err(TimedOut)),
            Event::AtResource { r, fence, grant } => {
                let verdict = self.resource.write(self.now, r, fence, grant);
                self.hash.add(&[verdict as u64]);
            }
            Event::UserEffect { leader, effect } => {
                let verdict = self.user_resource.user_effect(leader, effect.0);
                self.hash.add(&[effect.0, verdict as u64]);
            }
            Event::FaultStart(i) => self.start_fault(i),
            Event::Restart { r } => {
                let epoch = self.replicas[r].epoch + 1;
                let clock = self.replicas[r].clock;
                self.replicas[r] = Replica::fresh(clock, epoch, r);
                if let (Some(factory), Some(handler)) =
                    (self.handler_factory.as_mut(), self.handlers.get_mut(r))
                {
                    *handler = factory(r);
                }
                self.start_replica(r);
                let since = self.crashed_at.remove(&r).unwrap_or(self.now);
                self.timeline.fault(r, "crash", since, self.now);
            }
        }
    }

    fn local(&self, r: usize) -> Instant {
        self.replicas[r].clock.monotonic(self.now)
    }

    fn start_replica(&mut self, r: usize) {
        let local = self.local(r);
        let wall = self.replicas[r].clock.wall(self.now);
        let epoch = self.replicas[r].epoch;
        if let Some(timing) = self.active {
            // From validated timing: the error type is `Infallible`.
            let Ok(guard) = ActiveGuard::new(timing, true, local);
            self.replicas[r].guard = Some(guard);
            self.drive_lease(r);
        }
        if let Some(slots) = self.config.slots
            && let Ok(every) = Every::new(slots.period)
        {
            let timer = SlotTimer::new(every, wall);
            if let Some(next) = timer.next_fire() {
                let at = self.replicas[r].clock.true_time_of_wall(next, self.now);
                self.schedule(at, Event::SlotFire { r, epoch });
            }
            self.replicas[r].slots = Some(timer);
        }
        if let Some(limit) = self.config.limiter
            && let Ok(window) = SlidingWindow::<WINDOW_CAP>::new(limit.window, limit.limit)
        {
            self.replicas[r].limiter = Some(Limiter::new(window));
            let gap = self.rng.below(nanos(limit.max_gap));
            self.schedule(self.now + gap, Event::LimitRequest { r, epoch });
        }
    }

    /// Sends `op` from replica `r` to the lock service, with its time-out.
    fn send_to_service(&mut self, r: usize, id: u64, op: LockOp) {
        let epoch = self.replicas[r].epoch;
        let timeout = self.now + nanos(self.config.request_timeout);
        self.schedule(timeout, Event::Timeout { r, epoch, id });
        if self.replicas[r].partitioned_until > self.now {
            return;
        }
        for delay in self.deliveries() {
            let event = Event::AtService {
                r,
                epoch,
                id,
                op: op.clone(),
            };
            self.schedule(self.now + delay, event);
        }
    }

    /// The delays of one message's copies: none if lost, two if duplicated.
    fn deliveries(&mut self) -> Vec<u64> {
        if self.rng.chance(self.config.loss) {
            return Vec::new();
        }
        let copies = if self.rng.chance(self.config.duplication) {
            2
        } else {
            1
        };
        let (lo, hi) = (nanos(self.config.latency.0), nanos(self.config.latency.1));
        (0..copies).map(|_| self.rng.between(lo, hi)).collect()
    }

    fn at_service(&mut self, r: usize, epoch: u64, id: u64, op: &LockOp) {
        let held_before = self.service.holder(ACTIVE_KEY, self.now);
        let Some(reply) = self.service.handle(op, self.now) else {
            return; // failing over: the request is lost
        };
        if let (LockOp::Acquire { key, ttl_ns, .. }, LockReply::Granted(fence)) = (op, reply)
            && key == ACTIVE_KEY
        {
            // One live lease at any instant by the serving primary's view.
            if let Some(before) = held_before {
                self.report.violations.push(format!(
                    "lease granted to replica {r} at {} ms while fence {} was live",
                    self.now / 1_000_000,
                    before.fence
                ));
            }
            // Fences never go backwards: each grant's above every earlier
            // one's, across failovers and restarts.
            if self.highest_leader_fence.is_some_and(|h| fence <= h) {
                self.report.fence_regressions += 1;
            }
            self.highest_leader_fence = self.highest_leader_fence.max(Some(fence));
            if let LockOp::Acquire { token, .. } = op {
                let number = self.grants.len() as u64 + 1;
                self.grants.entry(*token).or_insert(number);
            }
            self.timeline.lease(self.now, self.now + ttl_ns, fence, r);
        }
        if self.replicas[r].partitioned_until > self.now {
            return;
        }
        for delay in self.deliveries() {
            let event = Event::AtReplica {
                r,
                epoch,
                id,
                reply,
            };
            self.schedule(self.now + delay, event);
        }
    }

    fn at_replica(&mut self, r: usize, id: u64, answer: Answer) {
        let local = self.local(r);
        if let Some(call) = self.replicas[r].lease_calls.remove(&id) {
            if let (LeaseCall::Acquire(token), Ok(LockReply::Granted(_))) = (call, answer) {
                // A promotion this answer brings leads under this grant.
                self.replicas[r].last_grant = self.grants.get(&token).copied().unwrap_or(0);
            }
            if let Some(guard) = self.replicas[r].guard.as_mut() {
                // What a `Locker` would have returned, mapped by guard-core.
                guard.handle(
                    local,
                    match call {
                        LeaseCall::Acquire(token) => Done::acquired(lock_result(token, answer)),
                        LeaseCall::Renew => Done::renewed(renew_result(answer)),
                        LeaseCall::Release => Done::released(unlock_result(answer)),
                    },
                );
            }
            self.drive_lease(r);
        } else if let Some(mut claim) = self.replicas[r].claims.remove(&id) {
            self.replicas[r].locker.answer(id, answer);
            let mut cx = Context::from_waker(Waker::noop());
            match claim.as_mut().poll(&mut cx) {
                Poll::Ready((slot, outcome)) => {
                    if outcome.is_allowed() {
                        self.resource.run_slot(slot);
                        let work = SlotWork {
                            replica: r,
                            slot_ms: slot,
                            fence: outcome.fence(),
                        };
                        if let Some(handler) = self.handlers.get_mut(r) {
                            let effects = handler.slot(&work);
                            self.deliver_user_effects(None, effects);
                        }
                    }
                    self.report.claims += 1;
                }
                Poll::Pending => {
                    self.replicas[r].claims.insert(id, claim);
                }
            }
        }
        // A duplicate or late answer to a finished call is ignored.
    }

    /// Carries out the ActiveGuard's actions and re-arms its timer.
    fn drive_lease(&mut self, r: usize) {
        while let Some(action) = self.replicas[r]
            .guard
            .as_mut()
            .and_then(|g| g.poll_action())
        {
            let ttl = self.active.map_or(0, |t| ttl_nanos(t.ttl()));
            let locker = self.replicas[r].locker.clone();
            match action {
                Action::Acquire => {
                    let token = locker.new_token();
                    let op = LockOp::Acquire {
                        key: ACTIVE_KEY.into(),
                        token,
                        ttl_ns: ttl,
                    };
                    self.lease_call(r, &locker, op, LeaseCall::Acquire(token));
                }
                Action::Renew(t) => {
                    let op = LockOp::Renew {
                        key: ACTIVE_KEY.into(),
                        token: u128::from_be_bytes(t.id().0),
                        ttl_ns: ttl,
                    };
                    self.lease_call(r, &locker, op, LeaseCall::Renew);
                }
                Action::Release(t) => {
                    let op = LockOp::Release {
                        key: ACTIVE_KEY.into(),
                        token: u128::from_be_bytes(t.id().0),
                    };
                    self.lease_call(r, &locker, op, LeaseCall::Release);
                }
                Action::Promote { fence } => self.promote(r, fence),
                Action::Demote(_) => self.demote(r),
            }
        }
        let deadline = self.replicas[r]
            .guard
            .as_ref()
            .and_then(|g| g.poll_timeout());
        if let Some(deadline) = deadline {
            let at = self.replicas[r]
                .clock
                .true_time_of_monotonic(deadline)
                .max(self.now + 1);
            if self.replicas[r].timer_at != Some(at) {
                self.replicas[r].timer_tag += 1;
                self.replicas[r].timer_at = Some(at);
                let (epoch, tag) = (self.replicas[r].epoch, self.replicas[r].timer_tag);
                self.schedule(at, Event::LeaseTimer { r, epoch, tag });
            }
        }
    }

    fn lease_call(&mut self, r: usize, locker: &SimLocker, op: LockOp, call: LeaseCall) {
        let id = locker.request_id();
        self.replicas[r].lease_calls.insert(id, call);
        self.send_to_service(r, id, op);
    }

    fn set_leading_count(&mut self, count: usize) {
        if self.leading_now >= 2 {
            self.report.dual_leader_ns += self.now - self.leading_changed_at;
        }
        self.leading_now = count;
        self.leading_changed_at = self.now;
        self.report.max_leaders = self.report.max_leaders.max(count);
    }

    fn acting_leaders(&self) -> usize {
        self.replicas
            .iter()
            .filter(|p| p.up && p.leading.is_some() && p.paused_until <= self.now)
            .count()
    }

    fn promote(&mut self, r: usize, fence: u64) {
        let grant = self.replicas[r].last_grant;
        self.replicas[r].leading = Some(Term {
            fence,
            since: self.now,
            grant,
        });
        self.replicas[r].work_tag += 1;
        self.report.promotions += 1;
        if let Some(lost) = self.leader_lost_at.take() {
            let took = self.now - lost;
            self.report.takeovers.push(took);
            if took > self.takeover_bound() {
                self.report.violations.push(format!(
                    "takeover took {} ms at {} ms, bound {} ms",
                    took / 1_000_000,
                    self.now / 1_000_000,
                    self.takeover_bound() / 1_000_000
                ));
            }
        }
        let count = self.acting_leaders();
        self.set_leading_count(count);
        let (epoch, tag) = (self.replicas[r].epoch, self.replicas[r].work_tag);
        self.schedule(self.now, Event::Work { r, epoch, tag });
    }

    fn demote(&mut self, r: usize) {
        if let Some(term) = self.replicas[r].leading.take() {
            self.timeline.led(r, term.since, self.now, term.fence);
        }
        self.replicas[r].work_tag += 1;
        let count = self.acting_leaders();
        self.set_leading_count(count);
    }

    /// The promise of a takeover after a leader crash: ttl (the lease's
    /// life after its last renewal, which may still be in flight: one
    /// latency) + interval (the standby's next attempt, stretched by the
    /// slowest clock) + a round trip for that attempt.
    pub fn takeover_bound(&self) -> u64 {
        let Some(active) = self.active else {
            return u64::MAX;
        };
        let interval = nanos(active.interval());
        // The slowest monotonic clock runs behind by its drift plus the
        // discipline's slew.
        let slew = self
            .config
            .clock_sync
            .map_or(0, |s| s.max_slew_ppm.unsigned_abs());
        let rate = self.config.max_drift_ppm.unsigned_abs() + slew;
        let stretch = interval * rate / 1_000_000 + 1;
        ttl_nanos(active.ttl()) + interval + stretch + 3 * nanos(self.config.latency.1)
    }

    fn work(&mut self, r: usize, tag: u64) {
        if self.replicas[r].work_tag != tag {
            return;
        }
        let Some(Term { fence, grant, .. }) = self.replicas[r].leading else {
            return;
        };
        for delay in self.deliveries_reliable() {
            self.schedule(self.now + delay, Event::AtResource { r, fence, grant });
        }
        if let Some(handler) = self.handlers.get_mut(r) {
            let work = LeaderWork {
                replica: r,
                fence,
                local: self.replicas[r].clock.monotonic(self.now),
                wall: self.replicas[r].clock.wall(self.now),
            };
            let effects = handler.lead(&work);
            self.deliver_user_effects(Some((fence, grant)), effects);
        }
        let epoch = self.replicas[r].epoch;
        let next = self.now + nanos(self.config.work_period);
        self.schedule(next, Event::Work { r, epoch, tag });
    }

    /// The protected resource is reached over a reliable link (a database
    /// connection): one copy, latency only.
    fn deliveries_reliable(&mut self) -> [u64; 1] {
        let (lo, hi) = (nanos(self.config.latency.0), nanos(self.config.latency.1));
        [self.rng.between(lo, hi)]
    }

    fn fire_slot(&mut self, r: usize) {
        let (wall, offset) = self.replicas[r].clock.wall_and_offset(self.now);
        let offset = offset.unsigned_abs();
        self.report.largest_clock_offset_ns = self.report.largest_clock_offset_ns.max(offset);
        let epoch = self.replicas[r].epoch;
        let Some(timer) = self.replicas[r].slots.as_mut() else {
            return;
        };
        let Some(slot) = timer.fire(wall) else {
            return;
        };
        let next = timer.next_fire();
        if let Some(next) = next {
            let at = self.replicas[r].clock.true_time_of_wall(next, self.now + 1);
            self.schedule(at, Event::SlotFire { r, epoch });
        }
        self.report.slot_fires += 1;
        let key_ttl = match self.config.slots {
            Some(s) => s.key_ttl,
            None => return,
        };
        let locker = self.replicas[r].locker.clone();
        let scope = self.scope.clone();
        let mut claim: Claim = Box::pin(async move {
            let guard = OnceGuard::new(Some(&*locker), scope).with_ttl(key_ttl);
            let key = slot.as_millis().to_string();
            let outcome = match guard.allow(&key).await {
                Ok(outcome) => outcome,
                Err(_) => OnceOutcome::SkippedOnError,
            };
            (slot.as_millis(), outcome)
        });
        let mut cx = Context::from_waker(Waker::noop());
        if claim.as_mut().poll(&mut cx).is_ready() {
            return; // no request was needed
        }
        // A claim sends exactly one request: the try_lock of its slot key.
        let sent = self.replicas[r].locker.outbox.borrow_mut().pop();
        if let Some((id, op)) = sent {
            self.send_to_service(r, id, op);
            self.replicas[r].claims.insert(id, claim);
        }
    }

    fn limit_request(&mut self, r: usize) {
        let Some(config) = self.config.limiter else {
            return;
        };
        let local = self.local(r);
        let epoch = self.replicas[r].epoch;
        let replica = &mut self.replicas[r];
        if let Some(limiter) = replica.limiter.as_mut()
            && limiter.check(local).is_allowed()
        {
            self.report.limiter_admitted += 1;
            replica.admitted.push_back(local);
            // The window's rule: an admission at `t` counts until `t + window`.
            let window = config.window;
            while replica
                .admitted
                .front()
                .is_some_and(|&t| local.saturating_duration_since(t) >= window)
            {
                replica.admitted.pop_front();
            }
            if replica.admitted.len() > config.limit as usize {
                self.report.violations.push(format!(
                    "replica {r}'s limiter admitted {} within one window at {} ms",
                    replica.admitted.len(),
                    self.now / 1_000_000
                ));
            }
        } else {
            self.report.limiter_denied += 1;
        }
        let gap = self.rng.below(nanos(config.max_gap)).max(1);
        self.schedule(self.now + gap, Event::LimitRequest { r, epoch });
    }

    fn resolve(&self, target: Target) -> Option<usize> {
        match target {
            Target::Replica(r) => (r < self.replicas.len()).then_some(r),
            Target::Leader => (0..self.replicas.len())
                .find(|&r| self.replicas[r].up && self.replicas[r].leading.is_some()),
        }
    }

    fn start_fault(&mut self, i: usize) {
        let Some(fault) = self.config.faults.get(i).copied() else {
            return;
        };
        match fault {
            Fault::Crash {
                target, down_for, ..
            } => {
                let Some(r) = self.resolve(target) else {
                    return;
                };
                if !self.replicas[r].up {
                    return;
                }
                if self.replicas[r].leading.is_some() && self.leader_lost_at.is_none() {
                    self.leader_lost_at = Some(self.now);
                }
                self.demote(r);
                self.replicas[r].up = false;
                self.replicas[r].guard = None;
                self.replicas[r].claims.clear();
                self.report.crashes += 1;
                self.crashed_at.insert(r, self.now);
                self.schedule(self.now + nanos(down_for), Event::Restart { r });
            }
            Fault::Pause { target, length, .. } => {
                let Some(r) = self.resolve(target) else {
                    return;
                };
                if !self.replicas[r].up || self.replicas[r].paused_until > self.now {
                    return;
                }
                let until = self.now + nanos(length);
                // A leader had just decided a side effect: it leaves when
                // the pause ends, with the fence it had then.
                if let Some(Term { fence, grant, .. }) = self.replicas[r].leading {
                    let delay = self.deliveries_reliable()[0];
                    self.schedule(until + delay, Event::AtResource { r, fence, grant });
                }
                self.replicas[r].paused_until = until;
                let count = self.acting_leaders();
                self.set_leading_count(count);
                self.report.pauses += 1;
                self.timeline.fault(r, "pause", self.now, until);
            }
            Fault::Partition { target, length, .. } => {
                let Some(r) = self.resolve(target) else {
                    return;
                };
                let until = self.now + nanos(length);
                self.replicas[r].partitioned_until = until;
                self.report.partitions += 1;
                self.timeline.fault(r, "partition", self.now, until);
            }
            Fault::Failover { downtime, .. } => {
                self.service.fail_over(self.now, nanos(downtime));
                self.report.failovers += 1;
                self.timeline.failover(self.now);
            }
            Fault::Restart { downtime, .. } => {
                self.service.restart(self.now, nanos(downtime));
                self.report.restarts += 1;
                let until = self.now + nanos(downtime);
                self.timeline.fault(usize::MAX, "restart", self.now, until);
            }
            Fault::LoseKey { .. } => {
                if self.service.lose_key(ACTIVE_KEY, self.now) {
                    self.report.keys_lost += 1;
                    self.timeline
                        .fault(usize::MAX, "key lost", self.now, self.now);
                }
            }
        }
    }

    fn finish(mut self) -> (Report, Timeline) {
        for (&r, &since) in &self.crashed_at {
            self.timeline.fault(r, "crash", since, self.end);
        }
        for r in 0..self.replicas.len() {
            if let Some(term) = self.replicas[r].leading {
                self.timeline.led(r, term.since, self.end, term.fence);
            }
        }
        self.set_leading_count(0);
        if let Some(slots) = self.config.slots {
            // Every slot whose planned instant (by true time) lies a period
            // and the largest clock offset inside the run should have run
            // once: nearer the edges, every replica's clock may place it
            // outside the run.
            let period = nanos(slots.period);
            let period_ms = period / 1_000_000;
            let bound = nanos(self.config.clock_bound());
            let margin_ms = period_ms + bound.div_ceil(1_000_000);
            let first = (EPOCH_MS + margin_ms).div_ceil(period_ms) * period_ms;
            let last = EPOCH_MS
                + self
                    .end
                    .saturating_sub(period + bound)
                    .saturating_sub(period)
                    / 1_000_000;
            let mut slot = first;
            while slot <= last && period_ms > 0 {
                self.report.slots_planned += 1;
                if !self.resource.slot_runs.contains_key(&slot) {
                    self.report.slots_missed += 1;
                }
                slot += period_ms;
            }
        }
        self.report.slot_runs = self
            .resource
            .slot_runs
            .values()
            .map(|&n| u64::from(n))
            .sum();
        self.report.duplicate_runs = self.resource.duplicate_runs();
        self.report.accepted = self.resource.accepted;
        self.report.accepted_stale = self.resource.accepted_stale;
        self.report.rejected_stale = self.resource.rejected_stale;
        self.report.fence_reused = self.resource.fence_reused;
        self.report.fence_out_of_order = self.resource.fence_out_of_order;
        let user = &self.user_resource;
        (self.report.user_effects, self.report.user_duplicates) = user.user_counts();
        self.report.user_duplicate_ids = user.user_duplicate_ids.clone();
        self.report.user_rejected_stale = user.user_rejected_stale;
        self.report.user_accepted_stale = user.user_accepted_stale;
        self.report.fencing = self.config.fencing;
        self.report.clock_bound_ns = nanos(self.config.clock_bound());
        self.report.lost_writes = self.service.lost_writes;
        self.report.log_hash = self.hash.value();
        self.report.takeover_bound_ns = self.takeover_bound();
        self.timeline.effects = std::mem::take(&mut self.resource.effects);
        self.timeline.end = self.end;
        (self.report, self.timeline)
    }
}

impl Replica {
    fn fresh(clock: Clock, epoch: u64, r: usize) -> Self {
        Replica {
            clock,
            epoch,
            up: true,
            paused_until: 0,
            partitioned_until: 0,
            locker: Rc::new(SimLocker::new(r, epoch)),
            guard: None,
            lease_calls: HashMap::new(),
            timer_tag: 0,
            timer_at: None,
            work_tag: 0,
            last_grant: 0,
            leading: None,
            slots: None,
            claims: HashMap::new(),
            limiter: None,
            admitted: VecDeque::new(),
        }
    }
}
