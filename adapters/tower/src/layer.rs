//! The layer, its builder, its service and the service's future.

use std::fmt;
use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use guard_core::limit::wait::WaitError;
use guard_std::ratelimit::{
    EachResult, InvalidKey, LimitError, LimitFuture, LimitResult, RateLimiter, Report, check_key,
};
use guard_std::run::Runtime;
use guard_std::{BackendError, Throttle};
use http::header::{CONTENT_TYPE, HeaderValue};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::allow::AllowList;
use crate::body::ResponseBody;
use crate::error::ConfigError;
use crate::extract::{ClientIp, Key, KeyExtractor};
use crate::headers::{
    Fields, PolicyField, ceil_secs, policy_value, ratelimit_value, sf_string, write_retry_after,
};
use crate::wait::{Place, Wait, Waited};

/// The policy name in the `RateLimit` fields unless one is given.
pub const DEFAULT_POLICY_NAME: &str = "default";

/// How long a fail-closed layer asks clients to wait when the limiter's
/// backend fails, unless told otherwise.
pub const DEFAULT_BACKEND_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What the layer does with a request its [`KeyExtractor`] finds no key in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer `400 Bad Request`, naming what is missing (the default).
    ///
    /// A request without a key is either a client that left out what the
    /// API asks for (a header) or a server set up without what the key
    /// needs (client IPs without connect info). Refusing says so at the
    /// first request; a shared key would quietly put every such request
    /// in one quota, and letting them through would leave them unlimited.
    #[default]
    Refuse,
    /// Limit every request without a key under this one key, together.
    Shared(String),
}

/// What the layer does when the limiter's backend fails
/// ([`LimitError::Backend`], for example Redis unreachable). Either way
/// the failure is logged as a warning, at most one line per
/// [`guard_std::THROTTLE_INTERVAL`] with the count of the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnBackendError {
    /// Refuse the request: `503 Service Unavailable` with `Retry-After`
    /// of `retry_after` rounded up to whole seconds (the default, with
    /// [`DEFAULT_BACKEND_RETRY_AFTER`]). A limiter that cannot decide
    /// protects nothing if it admits, so by default it does not.
    FailClosed {
        /// How long clients are asked to wait; at least a nanosecond.
        retry_after: Duration,
    },
    /// Pass the request to the inner service unlimited, without rate-limit
    /// fields: availability over protection, for limits that are a
    /// courtesy rather than a defence.
    FailOpen,
}

impl Default for OnBackendError {
    fn default() -> Self {
        OnBackendError::FailClosed {
            retry_after: DEFAULT_BACKEND_RETRY_AFTER,
        }
    }
}

/// The cost of a request, from its head.
type CostFn = dyn Fn(&Parts) -> u32 + Send + Sync;

/// What every service of one layer shares.
struct Config {
    limiter: Arc<dyn RateLimiter>,
    key: Box<dyn KeyExtractor>,
    cost: Option<Box<CostFn>>,
    /// The policy name and its `RateLimit-Policy` value.
    policy: PolicyField,
    /// For a limiter of several bandwidths: each one's name (an
    /// sf-string), one field entry each.
    bandwidths: Option<Vec<String>>,
    missing_key: MissingKey,
    on_backend_error: OnBackendError,
    legacy_headers: bool,
    backend_log: Throttle,
    /// Set by [`RateLimitLayerBuilder::wait_up_to`].
    wait: Option<Wait>,
    /// Set by [`RateLimitLayerBuilder::allow`].
    allow: AllowList,
    /// Requests let through by `allow`.
    allowed: AtomicU64,
    /// Set by [`RateLimitLayerBuilder::dry_run`].
    dry_run: bool,
    /// Requests a dry run let through that enforcing would have refused.
    would_refuse: AtomicU64,
    dry_run_log: Throttle,
}

/// Builds a [`RateLimitLayer`]; every option has a default, and
/// [`build`](Self::build) checks them all.
///
/// | option | default |
/// | --- | --- |
/// | [`key`](Self::key) | [`ClientIp::peer`] |
/// | [`cost`](Self::cost) | 1 per request |
/// | [`policy_name`](Self::policy_name) | [`DEFAULT_POLICY_NAME`] |
/// | [`bandwidth_names`](Self::bandwidth_names) | `<policy name>-0`, `-1`, … for a limiter of several bandwidths |
/// | [`on_missing_key`](Self::on_missing_key) | [`MissingKey::Refuse`] (`400`) |
/// | [`on_backend_error`](Self::on_backend_error) | [`OnBackendError::FailClosed`] (`503`, `Retry-After: 1`) |
/// | [`legacy_headers`](Self::legacy_headers) | off |
/// | [`wait_up_to`](Self::wait_up_to) | no waiting: a refusal is a `429` at once |
/// | [`allow`](Self::allow) | nothing bypasses the limiter |
/// | [`dry_run`](Self::dry_run) | off: refusals are enforced |
#[must_use = "a builder does nothing until built"]
pub struct RateLimitLayerBuilder {
    limiter: Arc<dyn RateLimiter>,
    key: Box<dyn KeyExtractor>,
    cost: Option<Box<CostFn>>,
    policy_name: String,
    bandwidth_names: Option<Vec<String>>,
    missing_key: MissingKey,
    on_backend_error: OnBackendError,
    legacy_headers: bool,
    wait: Option<Wait>,
    allow: AllowList,
    dry_run: bool,
}

impl fmt::Debug for RateLimitLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("quota", &self.limiter.quota())
            .field("key", &self.key.describe())
            .field("cost", &self.cost.as_ref().map(|_| "fn"))
            .field("policy_name", &self.policy_name)
            .field("bandwidth_names", &self.bandwidth_names)
            .field("missing_key", &self.missing_key)
            .field("on_backend_error", &self.on_backend_error)
            .field("legacy_headers", &self.legacy_headers)
            .field("wait_up_to", &self.wait.as_ref().map(|w| w.max))
            .field("allow", &self.allow)
            .field("dry_run", &self.dry_run)
            .finish()
    }
}

impl RateLimitLayerBuilder {
    /// What requests are limited by; [`ClientIp::peer`] by default.
    pub fn key(mut self, extractor: impl KeyExtractor) -> Self {
        self.key = Box::new(extractor);
        self
    }

    /// The units a request costs, from its head; 1 by default. A cost of
    /// zero is admitted without counting (and still reports the quota). A
    /// cost above the whole quota can never be admitted: it is answered
    /// `413 Content Too Large`, not `429`, so that clients do not retry it.
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.cost = Some(Box::new(cost));
        self
    }

    /// The policy's name in `RateLimit-Policy` and `RateLimit`;
    /// [`DEFAULT_POLICY_NAME`] by default. It must be printable ASCII and
    /// not empty (checked by [`build`](Self::build)).
    pub fn policy_name(mut self, name: impl Into<String>) -> Self {
        self.policy_name = name.into();
        self
    }

    /// For a limiter of several bandwidths (guard-std's
    /// `RateLimiter::bandwidths`: `MemoryLimiter` of a `Bandwidths`,
    /// `RedisBandwidths`): the name of each, in order, in its own entry of
    /// `RateLimit-Policy` and `RateLimit` (`"<name>";q=..;w=..` and
    /// `"<name>";r=..;t=..`, one per bandwidth); `<policy name>-0`, `-1`,
    /// … by default. One name per bandwidth, each printable ASCII (checked
    /// by [`build`](Self::build)).
    pub fn bandwidth_names<I, N>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = N>,
        N: Into<String>,
    {
        self.bandwidth_names = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// What to do with a request that has no key; [`MissingKey::Refuse`]
    /// by default.
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.missing_key = missing_key;
        self
    }

    /// What to do when the limiter's backend fails;
    /// [`OnBackendError::FailClosed`] with [`DEFAULT_BACKEND_RETRY_AFTER`]
    /// by default.
    pub fn on_backend_error(mut self, on_backend_error: OnBackendError) -> Self {
        self.on_backend_error = on_backend_error;
        self
    }

    /// Also write `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (seconds from now, as `t`), which many clients
    /// still read; off by default.
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.legacy_headers = on;
        self
    }

    /// Hold a request the limiter refuses until it is admitted, at most
    /// `max` from its arrival on `runtime`'s clock, instead of answering
    /// `429` at once; off by default. `runtime` gives the clock and timers
    /// the wait runs on: `guard_tokio::Tokio` under tokio (virtual under
    /// `tokio::time::pause`), `guard_smol::AsyncIo` under async-io.
    ///
    /// - Admitted within `max`: the request goes to the inner service
    ///   with the fields of the decision that admitted it.
    /// - Not admissible within `max`: `429` with that refusal's
    ///   `Retry-After` and fields, as without waiting. A request whose own
    ///   refusal already asks for more than `max` is answered at once; one
    ///   in line behind others is answered at its turn when the limiter
    ///   then asks for more than is left, and at its deadline at the
    ///   latest.
    /// - More than [`LINE_CAPACITY`](guard_std::run::LINE_CAPACITY)
    ///   requests already waiting on its key: `429` saying so, with the
    ///   `Retry-After` of the last refusal the request got, or 1 s.
    /// - A cost above the quota stays `413`, a backend failure follows
    ///   [`on_backend_error`](Self::on_backend_error).
    ///
    /// **Order.** While none of this layer's requests on a key waits, a
    /// request is decided at once, exactly as without waiting (no line, no
    /// allocation, no timer): the common case costs nothing more. A refused
    /// one joins the key's line; from then until the line is empty, every
    /// request on the key joins the line too, behind it. Waiters are
    /// admitted in arrival order, and a request arriving while others wait
    /// does not take a unit freed for them: with the fast path alone, a
    /// steady stream of arrivals would take every freed unit before the
    /// waiter's timer fired, and waiters would starve until their
    /// deadline. Requests not counted by this layer (another layer on the
    /// same limiter, another process on a shared Redis key) are not in the
    /// line and may pass.
    ///
    /// A waiting request holds what the inner service's readiness
    /// reserved, and its connection, until it is admitted or answered. If
    /// its response future is dropped (the client went away), it leaves
    /// the line and the next waiter's turn comes at once.
    pub fn wait_up_to<R: Runtime>(mut self, max: Duration, runtime: R) -> Self {
        self.wait = Some(Wait::new(Arc::clone(&self.limiter), max, runtime));
        self
    }

    /// Lets the requests `allow` names through without deciding: nothing
    /// is counted against them and no rate-limit fields are written. They
    /// are counted in [`RateLimitLayer::allowed`].
    pub fn allow(mut self, allow: AllowList) -> Self {
        self.allow = allow;
        self
    }

    /// Decide, count and write the rate-limit fields as usual, but never
    /// refuse (Envoy's `filter_enabled` without `filter_enforced`): to
    /// see what a limit would do to real traffic before it is enforced.
    /// A request enforcing would refuse goes to the inner service with the
    /// fields of its refusal (`RateLimit` with `r=0`, no `Retry-After`),
    /// is counted in [`RateLimitLayer::dry_run_refusals`] and logged at
    /// `info`, at most one line per [`guard_std::THROTTLE_INTERVAL`]. That
    /// holds for each of the layer's refusals: `429`, `413` (a cost above
    /// the quota), `503` (a failed backend, fail-closed) and `400` (no
    /// key, [`MissingKey::Refuse`]). Refused by
    /// [`build`](Self::build) together with
    /// [`wait_up_to`](Self::wait_up_to). Off by default.
    pub fn dry_run(mut self, on: bool) -> Self {
        self.dry_run = on;
        self
    }

    /// The layer, or the first parameter it cannot work with.
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        if self.dry_run && self.wait.is_some() {
            return Err(ConfigError::DryRunWithWait);
        }
        let policy = sf_string(&self.policy_name)?;
        if let OnBackendError::FailClosed { retry_after } = self.on_backend_error
            && retry_after.is_zero()
        {
            return Err(ConfigError::BackendRetryAfter { value: retry_after });
        }
        if let Some(wait) = &self.wait
            && wait.max.is_zero()
        {
            return Err(ConfigError::WaitUpTo { value: wait.max });
        }
        let bandwidths = match (self.limiter.bandwidths(), self.bandwidth_names) {
            (None, None) => None,
            (None, Some(names)) => {
                return Err(ConfigError::BandwidthNames {
                    given: names.len(),
                    bandwidths: 1,
                });
            }
            (Some(_), _) if self.wait.is_some() => return Err(ConfigError::WaitWithBandwidths),
            (Some(quotas), names) => {
                let names = names.unwrap_or_else(|| {
                    (0..quotas.len())
                        .map(|i| format!("{}-{i}", self.policy_name))
                        .collect()
                });
                if names.len() != quotas.len() {
                    return Err(ConfigError::BandwidthNames {
                        given: names.len(),
                        bandwidths: quotas.len(),
                    });
                }
                Some(
                    names
                        .iter()
                        .map(|name| sf_string(name))
                        .collect::<Result<Vec<_>, _>>()?,
                )
            }
        };
        Ok(RateLimitLayer {
            config: Arc::new(Config {
                policy: PolicyField::new(policy, self.limiter.quota()),
                bandwidths,
                limiter: self.limiter,
                key: self.key,
                cost: self.cost,
                missing_key: self.missing_key,
                on_backend_error: self.on_backend_error,
                legacy_headers: self.legacy_headers,
                backend_log: Throttle::new(),
                wait: self.wait,
                allow: self.allow,
                allowed: AtomicU64::new(0),
                dry_run: self.dry_run,
                would_refuse: AtomicU64::new(0),
                dry_run_log: Throttle::new(),
            }),
        })
    }
}

/// A tower [`Layer`] that rate-limits HTTP requests with a guard
/// [`RateLimiter`]; see the [crate documentation](crate).
#[derive(Clone)]
pub struct RateLimitLayer {
    config: Arc<Config>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("quota", &self.limiter.quota())
            .field("key", &self.key.describe())
            .field("policy", &self.policy.name())
            .field("missing_key", &self.missing_key)
            .field("on_backend_error", &self.on_backend_error)
            .field("legacy_headers", &self.legacy_headers)
            .field("wait_up_to", &self.wait.as_ref().map(|w| w.max))
            .field("allow", &self.allow)
            .field("dry_run", &self.dry_run)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// The layer over `limiter` with every option at its default: keyed
    /// by [`ClientIp::peer`], fail-closed, policy [`DEFAULT_POLICY_NAME`].
    pub fn new(limiter: Arc<dyn RateLimiter>) -> Self {
        Self::builder(limiter)
            .build()
            .unwrap_or_else(|_| unreachable!("the defaults are valid parameters"))
    }

    /// A builder over `limiter` (any guard [`RateLimiter`]: in memory,
    /// Redis), with every option at its default.
    pub fn builder(limiter: Arc<dyn RateLimiter>) -> RateLimitLayerBuilder {
        RateLimitLayerBuilder {
            limiter,
            key: Box::new(ClientIp::peer()),
            cost: None,
            policy_name: DEFAULT_POLICY_NAME.to_owned(),
            bandwidth_names: None,
            missing_key: MissingKey::default(),
            on_backend_error: OnBackendError::default(),
            legacy_headers: false,
            wait: None,
            allow: AllowList::new(),
            dry_run: false,
        }
    }

    /// The limiter the layer decides with.
    pub fn limiter(&self) -> &Arc<dyn RateLimiter> {
        &self.config.limiter
    }

    /// Requests let through by the allowlist
    /// ([`RateLimitLayerBuilder::allow`]) since the layer was built.
    pub fn allowed(&self) -> u64 {
        self.config.allowed.load(Ordering::Relaxed)
    }

    /// Requests a dry run ([`RateLimitLayerBuilder::dry_run`]) let
    /// through that enforcing would have refused, since the layer was
    /// built.
    pub fn dry_run_refusals(&self) -> u64 {
        self.config.would_refuse.load(Ordering::Relaxed)
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> RateLimitService<S> {
        RateLimitService {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service of a [`RateLimitLayer`]: decides each request before the
/// inner service sees it.
///
/// Readiness is the inner service's: [`poll_ready`](Service::poll_ready)
/// delegates to it. A refused request never reaches the inner service, so
/// the readiness it reserved stays for the next call. With a limiter that
/// decides at once (in memory) the request goes straight to the ready
/// inner service; with one that waits for a backend (Redis), or for a
/// request that waits in line
/// ([`wait_up_to`](RateLimitLayerBuilder::wait_up_to)), the ready inner
/// service goes into the response future and a clone stays here,
/// which the caller polls ready before the next call (tower's usual
/// pattern, hence `S: Clone`).
#[derive(Clone)]
pub struct RateLimitService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S: fmt::Debug> fmt::Debug for RateLimitService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("layer", &self.config)
            .finish()
    }
}

impl<S> RateLimitService<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, the layer dropped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// What the layer does with a request once decided.
enum Verdict {
    /// Pass it on; write these fields on the response (none when a
    /// failed backend was ignored).
    Admit(Option<Fields>),
    /// Answer it without the inner service.
    Answer(Response<Bytes>),
}

/// The layer's own answer: `status` with a short text.
fn answer(status: StatusCode, text: String) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A request that waits in its key's line, at the place it took on its
/// arrival (in `call`, before its response future is returned).
struct Queued {
    place: Place,
    deadline: Instant,
    /// The refusal that sent it to the line, if it was decided first.
    refusal: Option<Report>,
}

/// Why a request in line was answered without a decision of its own.
#[derive(Clone, Copy)]
enum Crowded {
    /// [`LINE_CAPACITY`](guard_std::run::LINE_CAPACITY) requests were
    /// already waiting on its key.
    LineFull,
    /// Its deadline passed before its turn.
    TimedOut,
}

impl Config {
    /// The decision, when the limiter gives it without waiting.
    fn decide_now(&self, key: &str, cost: u32) -> Option<LimitResult> {
        // Several bandwidths report each one in a future of its own.
        if self.bandwidths.is_some() {
            return None;
        }
        match self.limiter.check_n(key, cost) {
            LimitFuture::Ready(Some(result)) => Some(result),
            // A remote limiter: this future is dropped unpolled and the
            // decision is asked for again by the response future, which
            // can own the key. guard's limiters, like any future written
            // with `async`, do their work when polled, so the dropped one
            // did nothing.
            _ => None,
        }
    }

    /// The `RateLimit-Policy` value for the limiter's quota now: one
    /// entry per bandwidth for a limiter of several.
    fn policy_value(&self) -> HeaderValue {
        match (&self.bandwidths, self.limiter.bandwidths()) {
            (Some(names), Some(quotas)) => list_value(
                names
                    .iter()
                    .zip(&quotas)
                    .map(|(name, quota)| policy_value(name, quota)),
            ),
            _ => self.policy.value(&self.limiter.quota()),
        }
    }

    /// The fields of a decision, `t` seconds being the effective window;
    /// with every bandwidth's report, an entry for each.
    fn fields(&self, report: &Report, t: u64, each: Option<&Each>) -> Fields {
        let ratelimit = match (&self.bandwidths, each) {
            (Some(names), Some(each)) => {
                list_value(names.iter().zip(&each.reports).map(|(name, r)| {
                    // A bandwidth that refused is back for this request
                    // when the refusal says; the others reset by their own
                    // clock.
                    let t = if r.is_denied() && r.remaining < each.cost {
                        t
                    } else {
                        ceil_secs(r.reset_after)
                    };
                    ratelimit_value(name, r.remaining, t)
                }))
            }
            _ => ratelimit_value(self.policy.name(), report.remaining, t),
        };
        Fields {
            policy: self.policy_value(),
            state: Some((ratelimit, report.remaining, t)),
            legacy_limit: self.legacy_headers.then_some(report.limit),
        }
    }

    fn verdict(&self, result: LimitResult) -> Verdict {
        self.verdict_of(result, None)
    }

    /// The verdict on every bandwidth's reports: the request is decided by
    /// the tightest ([`Report::tightest`]), the fields written for each.
    fn verdict_each(&self, result: EachResult, cost: u32) -> Verdict {
        match result {
            Ok(reports) => match Report::tightest(&reports) {
                Some(tightest) => self.verdict_of(Ok(tightest), Some(&Each { reports, cost })),
                None => self.verdict(Err(LimitError::Backend(BackendError::new(NoBandwidth)))),
            },
            Err(e) => self.verdict(Err(e)),
        }
    }

    fn verdict_of(&self, result: LimitResult, each: Option<&Each>) -> Verdict {
        match result {
            Ok(report) => match report.retry_after() {
                // `t` is the time until the key is back to a full quota.
                None => Verdict::Admit(Some(self.fields(
                    &report,
                    ceil_secs(report.reset_after),
                    each,
                ))),
                Some(wait) => {
                    // Never 0 for a refusal. `t` is the same point in time:
                    // the draft asks that Retry-After not be earlier than
                    // the end of the effective window.
                    let secs = ceil_secs(wait).max(1);
                    if self.dry_run {
                        self.would_refuse(StatusCode::TOO_MANY_REQUESTS);
                        return Verdict::Admit(Some(self.fields(&report, secs, each)));
                    }
                    let mut refusal = answer(
                        StatusCode::TOO_MANY_REQUESTS,
                        format!(
                            "429 Too Many Requests: the rate limit of policy {} is reached; \
                             retry after {secs} s\n",
                            self.policy.name()
                        ),
                    );
                    self.fields(&report, secs, each)
                        .write(refusal.headers_mut());
                    write_retry_after(refusal.headers_mut(), secs);
                    Verdict::Answer(refusal)
                }
            },
            Err(LimitError::Cost(e)) => {
                let fields = Fields {
                    policy: self.policy_value(),
                    state: None,
                    legacy_limit: self.legacy_headers.then_some(e.limit),
                };
                if self.dry_run {
                    self.would_refuse(StatusCode::PAYLOAD_TOO_LARGE);
                    return Verdict::Admit(Some(fields));
                }
                let mut refusal = answer(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "413 Content Too Large: this request costs {} units, more than the whole \
                         quota of {} of policy {}: it can never be admitted\n",
                        e.cost,
                        e.limit,
                        self.policy.name()
                    ),
                );
                fields.write(refusal.headers_mut());
                Verdict::Answer(refusal)
            }
            Err(LimitError::InvalidKey(e)) => {
                if self.dry_run {
                    self.would_refuse(StatusCode::BAD_REQUEST);
                    return Verdict::Admit(None);
                }
                Verdict::Answer(self.invalid_key(&e))
            }
            Err(LimitError::Backend(e)) => match self.on_backend_error {
                OnBackendError::FailClosed { .. } if self.dry_run => {
                    if let Some(held) = self.backend_log.admit() {
                        tracing::warn!(
                            "rate limit: the limiter's backend failed, request admitted (dry \
                             run; enforced, fail-closed would refuse it): {e} ({held} more \
                             since the last line)"
                        );
                    }
                    self.would_refuse(StatusCode::SERVICE_UNAVAILABLE);
                    Verdict::Admit(None)
                }
                OnBackendError::FailClosed { retry_after } => {
                    if let Some(held) = self.backend_log.admit() {
                        tracing::warn!(
                            "rate limit: the limiter's backend failed, request refused with 503 \
                             (fail-closed): {e} ({held} more since the last line)"
                        );
                    }
                    let secs = ceil_secs(retry_after).max(1);
                    let mut refusal = answer(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "503 Service Unavailable: the rate limiter cannot decide now; retry \
                             after {secs} s\n"
                        ),
                    );
                    write_retry_after(refusal.headers_mut(), secs);
                    Verdict::Answer(refusal)
                }
                OnBackendError::FailOpen => {
                    if let Some(held) = self.backend_log.admit() {
                        tracing::warn!(
                            "rate limit: the limiter's backend failed, request admitted \
                             unlimited (fail-open): {e} ({held} more since the last line)"
                        );
                    }
                    Verdict::Admit(None)
                }
            },
        }
    }

    /// Counts and logs a refusal that a dry run does not make.
    fn would_refuse(&self, status: StatusCode) {
        self.would_refuse.fetch_add(1, Ordering::Relaxed);
        if let Some(held) = self.dry_run_log.admit() {
            tracing::info!(
                "rate limit (dry run) of policy {}: a request was let through that enforcing \
                 would answer {status} ({held} more since the last line)",
                self.policy.name()
            );
        }
    }

    /// The answer to a request without a key, under [`MissingKey::Refuse`].
    fn no_key(&self) -> Response<Bytes> {
        answer(
            StatusCode::BAD_REQUEST,
            format!(
                "400 Bad Request: the rate limit needs {}, which this request does not have\n",
                self.key.describe()
            ),
        )
    }

    /// The answer to a request whose key no limiter takes: the rule, never
    /// the key (a client's text, possibly kilobytes of it).
    fn invalid_key(&self, e: &InvalidKey) -> Response<Bytes> {
        answer(
            StatusCode::BAD_REQUEST,
            format!(
                "400 Bad Request: the rate limit is keyed by {}, and this request's cannot be a \
                 key: {e}\n",
                self.key.describe()
            ),
        )
    }

    /// The refusal with which a request decided `result` waits in line:
    /// `result` is a refusal that asks for no more than is left until
    /// `deadline` (on `wait`'s clock). `None`: answer `result` as it is.
    fn refusal_to_wait(wait: &Wait, result: &LimitResult, deadline: Instant) -> Option<Report> {
        let Ok(report) = result else { return None };
        let retry = report.retry_after()?;
        // Waiting longer than is left could only end in this refusal:
        // answer it now, without a line or a timer.
        if retry > deadline.saturating_duration_since(wait.now()) {
            return None;
        }
        Some(*report)
    }

    /// A `429` for a request in line that got no refusal of its own: the
    /// `Retry-After` of the refusal that sent it to the line, or 1 s.
    fn crowded(&self, why: Crowded, refusal: Option<Report>) -> Response<Bytes> {
        let secs = refusal
            .and_then(|r| r.retry_after())
            .map_or(1, |wait| ceil_secs(wait).max(1));
        let policy = self.policy.name();
        let text = match why {
            Crowded::LineFull => format!(
                "429 Too Many Requests: the rate limit of policy {policy} is reached and too many \
                 requests are already waiting; retry after {secs} s\n"
            ),
            Crowded::TimedOut => format!(
                "429 Too Many Requests: the rate limit of policy {policy} is reached and this \
                 request was not admitted within its wait; retry after {secs} s\n"
            ),
        };
        let mut refusal_answer = answer(StatusCode::TOO_MANY_REQUESTS, text);
        match refusal {
            Some(report) => self.fields(&report, secs, None),
            None => Fields {
                policy: self.policy_value(),
                state: None,
                legacy_limit: self.legacy_headers.then(|| self.limiter.quota().limit()),
            },
        }
        .write(refusal_answer.headers_mut());
        write_retry_after(refusal_answer.headers_mut(), secs);
        refusal_answer
    }

    /// Waits in line as `queued`, then decides.
    async fn wait_in_line(&self, wait: &Wait, cost: u32, queued: Queued) -> Verdict {
        let Queued {
            place,
            deadline,
            refusal,
        } = queued;
        let waited = wait.wait(&place, cost, deadline).await;
        // Out of the line: the next arrival's turn, and later arrivals on
        // the key may pass again once nobody waits.
        drop(place);
        match waited {
            Waited::Admitted(report) => self.verdict(Ok(report)),
            Waited::Ended(WaitError::Deadline(report)) => self.verdict(Ok(report)),
            Waited::Ended(WaitError::Limiter(e)) => self.verdict(Err(e)),
            Waited::Ended(WaitError::LineFull(_)) => {
                Verdict::Answer(self.crowded(Crowded::LineFull, refusal))
            }
            // A way of ending that guard-core adds later is a refusal, as
            // a wait that ran out is: never a pass.
            Waited::TimedOut | Waited::Ended(_) => {
                Verdict::Answer(self.crowded(Crowded::TimedOut, refusal))
            }
        }
    }

    /// The decision of a request that could not be decided in `call`:
    /// asked of a limiter that waits for its backend, or waited for in
    /// line.
    async fn decide_later(&self, cost: u32, later: Later) -> Verdict {
        let queued = match later {
            Later::Wait(queued) => queued,
            Later::Ask { key, held } if self.bandwidths.is_some() => {
                // No line with several bandwidths (refused at build).
                drop(held);
                let result = self.limiter.check_each(&key, cost).await;
                return self.verdict_each(result, cost);
            }
            Later::Ask { key, held } => {
                let result = self.limiter.check_n(&key, cost).await;
                let (Some(wait), Some((place, deadline))) = (&self.wait, held) else {
                    return self.verdict(result);
                };
                // Admitted, or refused for longer than it may wait: out of
                // the line (the place dropped) and answered.
                let Some(refusal) = Self::refusal_to_wait(wait, &result, deadline) else {
                    return self.verdict(result);
                };
                // At the place taken on arrival: behind the earlier
                // arrivals and ahead of the later ones, whatever order the
                // limiter decided them in.
                if place.wait().is_err() {
                    return Verdict::Answer(self.crowded(Crowded::LineFull, Some(refusal)));
                }
                Queued {
                    place,
                    deadline,
                    refusal: Some(refusal),
                }
            }
        };
        match &self.wait {
            Some(wait) => self.wait_in_line(wait, cost, queued).await,
            None => unreachable!("only a layer that waits queues requests"),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Every bandwidth's report of one decision, and the cost decided.
struct Each {
    reports: Vec<Report>,
    cost: u32,
}

/// A limiter that says it has bandwidths and reports none.
#[derive(Debug)]
struct NoBandwidth;

impl fmt::Display for NoBandwidth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the limiter reported no bandwidth for a decision")
    }
}

impl std::error::Error for NoBandwidth {}

/// Field values as one list value: `a, b, c` (structured-field lists).
fn list_value(items: impl Iterator<Item = HeaderValue>) -> HeaderValue {
    let mut text = Vec::new();
    for (i, item) in items.enumerate() {
        if i > 0 {
            text.extend_from_slice(b", ");
        }
        text.extend_from_slice(item.as_bytes());
    }
    // Joined valid values: always valid; the fallback is never taken.
    HeaderValue::try_from(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// A decision made in the response future, with what followed it.
enum Remote<O> {
    /// Admitted: the inner service's output and the fields to write.
    Called(O, Option<Fields>),
    /// Answered by the layer.
    Answered(Response<Bytes>),
}

/// What `call` found out about a request before returning its future.
enum Next {
    /// Decided.
    Now(LimitResult),
    /// Answered by the layer without a decision: its line is full.
    Answered(Response<Bytes>),
    /// To be decided in the response future.
    Later(Later),
}

/// What the response future decides, from what `call` left it.
enum Later {
    /// Ask the limiter, which waits for its backend, on this key (owned).
    /// With a layer that waits, the request holds its place in its key's
    /// line from its arrival, and waits there until the deadline if
    /// refused.
    Ask {
        key: String,
        held: Option<(Place, Instant)>,
    },
    /// Wait in line.
    Wait(Queued),
}

impl<S> RateLimitService<S> {
    /// Passes the request to the inner service, these fields to be
    /// written on its response.
    fn admit<ReqBody, ResBody>(
        &mut self,
        parts: Parts,
        body: ReqBody,
        fields: Option<Fields>,
    ) -> ResponseFuture<S::Future>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    {
        ResponseFuture {
            state: State::Admitted {
                future: self.inner.call(Request::from_parts(parts, body)),
                fields,
            },
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let config = &*self.config;
        let (parts, body) = request.into_parts();
        let extracted = config.key.extract(&parts);
        if !config.allow.is_empty() && config.allow.admits(&parts, extracted.as_ref()) {
            drop(extracted);
            config.allowed.fetch_add(1, Ordering::Relaxed);
            return self.admit(parts, body, None);
        }
        let cost = config.cost.as_ref().map_or(1, |cost| cost(&parts));
        let key = match extracted {
            Some(key) => key,
            None => match &config.missing_key {
                MissingKey::Refuse if config.dry_run => {
                    config.would_refuse(StatusCode::BAD_REQUEST);
                    return self.admit(parts, body, None);
                }
                MissingKey::Refuse => return ResponseFuture::answered(config.no_key()),
                MissingKey::Shared(key) => Key::from(key.as_str()),
            },
        };
        let key = key.as_str();
        // A key no limiter takes is the client's input: 400, before it can
        // take a place in a line or a table, and never the fail-open path.
        if let Err(e) = check_key(key) {
            if config.dry_run {
                config.would_refuse(StatusCode::BAD_REQUEST);
                return self.admit(parts, body, None);
            }
            return ResponseFuture::answered(config.invalid_key(&e));
        }
        // A request that may wait takes its place in its key's line here,
        // on arrival: the line is then in the order of the calls, whatever
        // order their response futures are first polled in.
        let next = match &config.wait {
            // Others wait on this key: behind them.
            Some(wait) if !wait.nobody_waits(key) => {
                let deadline = wait.deadline(wait.now());
                match wait.enter(key) {
                    Ok(place) => Next::Later(Later::Wait(Queued {
                        place,
                        deadline,
                        refusal: None,
                    })),
                    Err(_) => Next::Answered(config.crowded(Crowded::LineFull, None)),
                }
            }
            _ => match config.decide_now(key, cost) {
                // Refused within what the wait allows: into the line.
                Some(result) => match &config.wait {
                    Some(wait) if matches!(&result, Ok(r) if r.is_denied()) => {
                        let deadline = wait.deadline(wait.now());
                        match Config::refusal_to_wait(wait, &result, deadline) {
                            Some(refusal) => match wait.enter(key) {
                                Ok(place) => Next::Later(Later::Wait(Queued {
                                    place,
                                    deadline,
                                    refusal: Some(refusal),
                                })),
                                Err(_) => {
                                    Next::Answered(config.crowded(Crowded::LineFull, Some(refusal)))
                                }
                            },
                            None => Next::Now(result),
                        }
                    }
                    _ => Next::Now(result),
                },
                None => Next::Later(Later::Ask {
                    key: key.to_owned(),
                    held: config
                        .wait
                        .as_ref()
                        .map(|w| (w.hold(key), w.deadline(w.now()))),
                }),
            },
        };
        match next {
            Next::Now(result) => match config.verdict(result) {
                Verdict::Admit(fields) => self.admit(parts, body, fields),
                Verdict::Answer(refusal) => ResponseFuture::answered(refusal),
            },
            Next::Answered(refusal) => ResponseFuture::answered(refusal),
            Next::Later(later) => {
                let clone = self.inner.clone();
                let mut inner = mem::replace(&mut self.inner, clone);
                let config = Arc::clone(&self.config);
                ResponseFuture {
                    state: State::Deciding {
                        future: Box::pin(async move {
                            match config.decide_later(cost, later).await {
                                Verdict::Admit(fields) => Remote::Called(
                                    inner.call(Request::from_parts(parts, body)).await,
                                    fields,
                                ),
                                Verdict::Answer(refusal) => Remote::Answered(refusal),
                            }
                        }),
                    },
                }
            }
        }
    }
}

pin_project! {
    /// The future of a [`RateLimitService`] call: the inner service's
    /// response with the rate-limit fields added, or the layer's own
    /// answer.
    pub struct ResponseFuture<F>
    where
        F: Future,
    {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F>
    where
        F: Future,
    {
        Admitted { #[pin] future: F, fields: Option<Fields> },
        Answered { refusal: Option<Response<Bytes>> },
        Deciding { future: BoxFuture<Remote<F::Output>> },
    }
}

impl<F: Future> ResponseFuture<F> {
    fn answered(refusal: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Answered {
                refusal: Some(refusal),
            },
        }
    }
}

/// The inner response with the fields written.
fn finish<B>(mut response: Response<B>, fields: Option<Fields>) -> Response<ResponseBody<B>> {
    if let Some(fields) = fields {
        fields.write(response.headers_mut());
    }
    response.map(ResponseBody::inner)
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Admitted { future, fields } => {
                let result = ready!(future.poll(cx));
                Poll::Ready(result.map(|response| finish(response, fields.take())))
            }
            StateProj::Answered { refusal } => match refusal.take() {
                Some(refusal) => Poll::Ready(Ok(refusal.map(ResponseBody::text))),
                // Polled again after completion.
                None => Poll::Pending,
            },
            StateProj::Deciding { future } => match ready!(future.as_mut().poll(cx)) {
                Remote::Called(result, fields) => {
                    Poll::Ready(result.map(|response| finish(response, fields)))
                }
                Remote::Answered(refusal) => Poll::Ready(Ok(refusal.map(ResponseBody::text))),
            },
        }
    }
}
