//! A tokio and axum service on guard and Redis, run as two (or more)
//! instances against one Redis:
//!
//! - `GET /hello`: limited per client IP on Redis (bursts of 5, then 1 a
//!   second, shared by every instance), with the `RateLimit-Policy` and
//!   `RateLimit` fields; a refusal is `429` with `Retry-After`;
//! - a leader-only job: one instance at a time holds the lease and writes
//!   a heartbeat every 200 ms through a fenced write (a Redis script
//!   that refuses a fence lower than the highest it has seen), so a
//!   leader that lost its lease cannot overwrite its successor;
//!   `GET /leader` says who leads here;
//! - `POST /webhooks/{id}`: each delivery done at most once and retried
//!   until done (`Claims` on the `RedisLocker`): `202` the first time,
//!   `200` with the stored answer for a redelivery, `409` with
//!   `Retry-After` while another instance works on it, `500` when the
//!   work failed (a body of `fail`; the next delivery runs it again),
//!   `503` when Redis cannot say (never a silent duplicate).
//!
//! ```sh
//! cargo run -p guard-example-service -- --redis redis://127.0.0.1:6379/ --listen 127.0.0.1:3001 --replica a
//! cargo run -p guard-example-service -- --redis redis://127.0.0.1:6379/ --listen 127.0.0.1:3002 --replica b
//! ```
//!
//! Each event is one line on standard output.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Parser;
use guard_server::guard_redis::redis::Script;
use guard_server::prelude::*;

/// Where to listen and which Redis to share.
#[derive(Parser, Debug)]
struct Args {
    /// The Redis every instance shares.
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    redis: String,
    /// The address to serve HTTP on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// This instance's name, in its answers and its writes.
    #[arg(long, default_value = "a")]
    replica: String,
    /// The leader's lease in milliseconds (renewed every third of it).
    #[arg(long, default_value_t = 15_000)]
    lease_ms: u64,
    /// A namespace for every key this service writes.
    #[arg(long, default_value = "example")]
    prefix: String,
}

/// A write that keeps the highest fence it was given and refuses lower
/// ones: the resource's half of fencing. KEYS: the heartbeat hash; ARGV:
/// fence, replica. Returns 1 if written.
const FENCED_WRITE: &str = r"
local highest = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < highest then
  redis.call('HINCRBY', KEYS[1], 'refused', 1)
  return 0
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'by', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'writes', 1)
return 1
";

/// What every handler shares.
struct App {
    redis: RedisConnection,
    store: RedisLocker,
    replica: String,
    prefix: String,
    lease: guard_server::guard_std::run::LeaseCheck<Tokio>,
}

impl App {
    fn key(&self, name: &str) -> String {
        format!("{}:{name}", self.prefix)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let timeout = Duration::from_millis(500);
    let redis = RedisConnection::connect(
        Topology::Standalone {
            url: args.redis.clone(),
        },
        timeout,
    )
    .await?;
    let locker_prefix = format!("{}:", args.prefix);
    let config = GuardConfig::new()
        .with_locker(SharedLocker::new(
            RedisLocker::new(redis.clone()).with_prefix(&locker_prefix)?,
        ))
        .with_prefix(format!("{}:guard:", args.prefix))?;
    let lease = Ttl::from_millis(args.lease_ms)?;
    let runner = ActiveRunner::new(&config, &config.scope("heartbeat")?)?
        .with_settings(ActiveConfig::new().with_ttl(lease))?;
    let app = Arc::new(App {
        store: RedisLocker::new(redis.clone()).with_prefix(&locker_prefix)?,
        redis: redis.clone(),
        replica: args.replica.clone(),
        prefix: args.prefix.clone(),
        lease: runner.lease_check(),
    });

    // Per client IP, shared by every instance through Redis.
    let bucket = TokenBucket::new(5, Rate::per_second(1))?;
    let limiter = RedisTokenBucket::new(redis.clone(), bucket)?.with_prefix(&app.key("rl"))?;
    let limited = Router::new()
        .route("/hello", get(hello))
        .layer(RateLimitLayer::builder(Arc::new(limiter)).build()?);
    let router = Router::new()
        .merge(limited)
        .route("/leader", get(leader))
        .route("/webhooks/{id}", post(webhook))
        .with_state(Arc::clone(&app));

    let (handle, ctl) = control();
    let job = tokio::spawn(heartbeat(runner, ctl, Arc::clone(&app)));
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!(
        "listening on {} replica={}",
        listener.local_addr()?,
        args.replica
    );
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    // Demote first, then release: a standby takes over at once.
    handle.stop();
    job.await?;
    println!("stopped replica={}", args.replica);
    Ok(())
}

/// One instance at a time writes the heartbeat, under its fence, while
/// its lease holds.
async fn heartbeat(runner: ActiveRunner, ctl: guard_server::guard_tokio::Control, app: Arc<App>) {
    let write = Script::new(FENCED_WRITE);
    let replica = app.replica.clone();
    runner
        .run(
            ctl,
            |fence| {
                let app = Arc::clone(&app);
                let write = write.clone();
                async move {
                    println!("promoted replica={} fence={fence}", app.replica);
                    let beat = async {
                        // Checked before each write, whose fence goes with it.
                        while let Some(fence) = app.lease.fence() {
                            let mut call = write.prepare_invoke();
                            call.key(app.key("heartbeat")).arg(fence).arg(&app.replica);
                            match app.redis.invoke::<i64>(&call).await {
                                Ok(1) => {}
                                Ok(_) => println!("refused replica={} fence={fence}", app.replica),
                                Err(e) => println!("write failed replica={}: {e}", app.replica),
                            }
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    };
                    tokio::select! {
                        () = beat => {}
                        () = app.lease.lost() => {}
                    }
                    Ok::<(), std::convert::Infallible>(())
                }
            },
            |reason| {
                let replica = replica.clone();
                async move { println!("demoted replica={replica} reason={reason:?}") }
            },
        )
        .await;
}

async fn hello(State(app): State<Arc<App>>) -> String {
    format!("hello from {}\n", app.replica)
}

async fn leader(State(app): State<Arc<App>>) -> String {
    match app.lease.fence() {
        Some(fence) => format!("{} leads fence={fence}\n", app.replica),
        None => format!("{} stands by\n", app.replica),
    }
}

/// One webhook delivery: done at most once, retried until done.
async fn webhook(State(app): State<Arc<App>>, Path(id): Path<String>, body: String) -> Response {
    let claims = match Scope::new("webhooks") {
        Ok(scope) => Claims::new(&app.store, scope),
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let mut stored = [0u8; 256];
    let outcome = claims.begin(&id, &mut stored).await;
    let answer = match outcome {
        Ok(ClaimOutcome::Run(claim)) => {
            let done = format!("accepted {id} by {} fence={}\n", app.replica, claim.fence());
            let worked = if body.trim() == "fail" {
                Err("the handler failed".to_owned())
            } else {
                record(&app, &id, claim.fence()).await
            };
            match worked {
                Ok(()) => match claims.complete(&claim, done.as_bytes()).await {
                    Ok(_) => (StatusCode::ACCEPTED, done).into_response(),
                    Err(e) => unavailable(e.to_string()),
                },
                Err(why) => {
                    // Given back: the sender's next delivery runs it again.
                    let _ = claims.fail(&claim).await;
                    (StatusCode::INTERNAL_SERVER_ERROR, format!("{why}\n")).into_response()
                }
            }
        }
        Ok(ClaimOutcome::Running { retry_after }) => {
            let secs = retry_after.as_secs().max(1) + u64::from(retry_after.subsec_nanos() > 0);
            let mut response = (StatusCode::CONFLICT, "in progress\n").into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            response
        }
        Ok(ClaimOutcome::Done { result }) => {
            (StatusCode::OK, String::from_utf8_lossy(result).into_owned()).into_response()
        }
        Err(e) => unavailable(e.to_string()),
    };
    println!(
        "webhook id={id} replica={} status={}",
        app.replica,
        answer.status().as_u16()
    );
    answer
}

/// The webhook's work: one entry on a list, with the attempt's fence.
async fn record(app: &App, id: &str, fence: u64) -> Result<(), String> {
    let mut push = guard_server::guard_redis::redis::cmd("RPUSH");
    push.arg(app.key("processed"))
        .arg(format!("{id} {fence} {}", app.replica));
    app.redis
        .query::<i64>(&push)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Redis could not say: have the delivery sent again.
fn unavailable(why: String) -> Response {
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}
