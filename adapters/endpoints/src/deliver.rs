//! One message's trip through its handler, shared by every endpoint of a
//! source that delivers once (a Redis consumer group, a NATS queue group,
//! a JetStream consumer, a RabbitMQ work queue, a claimed database row):
//! the handler is called, retried under the endpoint's [`RetryPolicy`]
//! while its [`Classifier`] allows, and the message is either handled or
//! given up with the last error and the number of calls. The endpoint
//! then acknowledges it, or dead-letters it and acknowledges, or leaves it
//! to the source's redelivery when the dead letter could not be written;
//! never drops it.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use guard_core::retry::{
    Classifier, GiveUpReason, Interrupted, Jitter, JitterNeedsRandom, RetryExecutor, RetryPolicy,
};
use guard_std::run::CallerRuntime;
use guard_std::run::Runtime as _;

use crate::observe;
use crate::parameter::{InvalidInput, Parameter};

/// `policy` if an endpoint can run it: endpoints draw no random bits, so
/// a policy with jitter is refused, with [`JitterNeedsRandom`] as its
/// cause (a retry delay is the same on every replica; the source's own
/// redelivery spreads replicas apart). Every source wraps the refusal in
/// its error's `InvalidInput`.
pub(crate) fn checked(policy: RetryPolicy) -> Result<RetryPolicy, InvalidInput> {
    match policy.jitter() {
        Jitter::None => Ok(policy),
        jitter => Err(InvalidInput {
            source: Some(Arc::new(JitterNeedsRandom)),
            ..InvalidInput::new(
                Parameter::RetryPolicy,
                format!("with {jitter:?} jitter"),
                "an endpoint draws no random bits, so its retry policy takes no jitter",
            )
        }),
    }
}

/// A message the handler did not take: its last error and the calls made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GaveUp {
    /// The last call's error, with why no further call was made.
    pub(crate) error: String,
    /// Calls made, the first included.
    pub(crate) attempts: u32,
    /// Whether the calls stopped because the caller's condition failed
    /// (a lease that ended), not because the handler gave up.
    pub(crate) interrupted: bool,
}

impl fmt::Display for GaveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.error)
    }
}

/// Calls `handler` with `message` (a clone per call) under `policy`
/// (checked by [`checked`]) until it succeeds, `classifier` refuses the
/// error, or the retries are spent; records the calls made under `label`
/// (`guard_retry_attempts{operation}`).
pub(crate) async fn handle<M, F, Fut, E>(
    policy: RetryPolicy,
    classifier: Classifier<E>,
    label: &str,
    message: &M,
    handler: F,
) -> Result<(), GaveUp>
where
    M: Clone,
    F: FnMut(M) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: fmt::Display,
{
    let handling = handle_while(policy, classifier, label, message, || true, handler);
    observe::handled(label, None, handling, observe::handled_or_gave_up).await
}

/// As [`handle`], calling again only while `may_call` holds, asked after
/// each wait, immediately before the call (an elected consumer's lease
/// check: every call, retries included, is made under a valid lease).
/// The caller checks before the first call.
pub(crate) async fn handle_while<M, F, Fut, E>(
    policy: RetryPolicy,
    classifier: Classifier<E>,
    label: &str,
    message: &M,
    mut may_call: impl FnMut() -> bool,
    mut handler: F,
) -> Result<(), GaveUp>
where
    M: Clone,
    F: FnMut(M) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: fmt::Display,
{
    let mut retry = match RetryExecutor::new(policy, classifier) {
        Ok(retry) => retry,
        // Endpoints check their policy when built; a policy that slipped
        // past is a refusal of the message, never a panic.
        Err(e) => {
            return Err(GaveUp {
                error: format!("retry policy refused: {e}"),
                attempts: 0,
                interrupted: false,
            });
        }
    };
    let mut calls = 0;
    let sleep = async |wait| {
        CallerRuntime.sleep(wait).await;
        if may_call() { Ok(()) } else { Err(Interrupted) }
    };
    let result = retry
        .run_interruptible(sleep, |attempt| {
            calls = attempt;
            handler(message.clone())
        })
        .await;
    guard_std::metrics::record_retry_attempts(label, calls);
    result.map_err(|failure| GaveUp {
        error: failure.to_string(),
        attempts: failure.attempts,
        interrupted: failure.reason == GiveUpReason::Interrupted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_failing_handler_is_called_as_often_as_the_policy_allows_then_given_up() {
        let policy = RetryPolicy::fixed_delay(2, Duration::from_millis(1));
        let mut calls = 0;
        let outcome = futures_lite::future::block_on(handle(
            policy,
            Classifier::retry_all(),
            "test",
            &"message",
            |m: &str| {
                calls += 1;
                async move { Err::<(), _>(format!("{m} failed")) }
            },
        ));
        let gave_up = outcome.unwrap_err();
        assert_eq!((calls, gave_up.attempts), (3, 3));
        assert!(gave_up.error.contains("message failed"), "{gave_up}");
    }

    /// Each message's handling is one span `handle`, its retries inside
    /// it, with its source and how it ended.
    #[test]
    fn a_handling_is_a_span_with_its_source_and_outcome() {
        let policy = RetryPolicy::fixed_delay(1, Duration::from_millis(1));
        let log = guard_testkit::SpanLog::new();
        tracing::subscriber::with_default(log.subscriber(), || {
            futures_lite::future::block_on(async {
                let ok = async |()| Ok::<(), &str>(());
                let down = async |()| Err::<(), &str>("down");
                let retry = Classifier::retry_all;
                assert!(handle(policy, retry(), "orders", &(), ok).await.is_ok());
                assert!(handle(policy, retry(), "orders", &(), down).await.is_err());
            });
        });
        let spans = log.closed("handle");
        let handled: Vec<_> = spans
            .iter()
            .map(|s| (s.field("source"), s.field("outcome"), s.field("fence")))
            .collect();
        assert_eq!(
            handled,
            [
                (Some("orders"), Some("handled"), None),
                (Some("orders"), Some("gave_up"), None)
            ]
        );
    }

    #[test]
    fn a_handler_that_succeeds_on_a_retry_is_handled() {
        let policy = RetryPolicy::fixed_delay(3, Duration::from_millis(1));
        let mut calls = 0;
        let outcome = futures_lite::future::block_on(handle(
            policy,
            Classifier::retry_all(),
            "test",
            &(),
            |()| {
                calls += 1;
                let fail = calls < 2;
                async move { if fail { Err("once") } else { Ok(()) } }
            },
        ));
        assert_eq!((outcome, calls), (Ok(()), 2));
    }

    #[test]
    fn an_error_the_classifier_refuses_is_not_retried() {
        let policy = RetryPolicy::fixed_delay(5, Duration::from_millis(1));
        let mut calls = 0;
        let outcome = futures_lite::future::block_on(handle(
            policy,
            Classifier::retry_all().never(|e: &&str| *e == "poison"),
            "test",
            &(),
            |()| {
                calls += 1;
                async { Err("poison") }
            },
        ));
        assert_eq!((outcome.unwrap_err().attempts, calls), (1, 1));
    }

    #[test]
    fn no_retry_is_made_once_the_condition_fails() {
        let policy = RetryPolicy::fixed_delay(5, Duration::from_millis(1));
        let (mut calls, mut checks) = (0, 0);
        let outcome = futures_lite::future::block_on(handle_while(
            policy,
            Classifier::retry_all(),
            "test",
            &(),
            || {
                checks += 1;
                checks < 2
            },
            |()| {
                calls += 1;
                async { Err("failed") }
            },
        ));
        let gave_up = outcome.unwrap_err();
        assert_eq!((calls, checks, gave_up.attempts), (2, 2, 2));
        assert!(gave_up.interrupted);
        assert!(gave_up.error.contains("retry interrupted"), "{gave_up}");
    }

    #[test]
    fn a_policy_with_jitter_is_refused_with_its_jitter() {
        let policy = RetryPolicy::new().with_jitter(Jitter::Full);
        let refused = checked(policy).unwrap_err();
        assert_eq!(refused.parameter, Parameter::RetryPolicy);
        assert_eq!(refused.value, "with Full jitter");
        assert!(checked(RetryPolicy::new()).is_ok());
    }
}
