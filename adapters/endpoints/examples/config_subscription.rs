//! Configuration changes of the Nacos kind: every replica must see every
//! change, so the subscription is a broadcast and deliberately not
//! deduplicated (no guard, no queue group). Three replicas of this
//! process subscribe to `config.>` on a NATS server; the example
//! publishes three changes and prints what each replica applied.
//!
//! ```sh
//! cargo run -p guard-endpoints --features nats --example config_subscription -- nats://127.0.0.1:4222
//! ```

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use guard_core::retry::Classifier;
use guard_endpoints::nats::{Delivery, NatsOptions, NatsSubscriber};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "nats://127.0.0.1:4222".to_owned());
    let applied: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
    let mut replicas = Vec::new();
    for replica in 0..3 {
        let options = NatsOptions::new(&url)?.with_name(&format!("replica-{replica}"));
        let subscriber = NatsSubscriber::new(options, "config.>", Delivery::Broadcast)?;
        let (handle, control) = guard_smol::control();
        let applied = applied.clone();
        let thread = thread::spawn(move || {
            smol::block_on(
                subscriber.run(control, Classifier::retry_all(), move |change| {
                    let text = String::from_utf8_lossy(&change.payload).into_owned();
                    applied
                        .lock()
                        .unwrap()
                        .push((replica, format!("{} = {text}", change.subject)));
                    std::future::ready(Ok::<(), String>(()))
                }),
            )
        });
        replicas.push((handle, thread));
    }
    // The replicas subscribe, then the configuration service publishes.
    thread::sleep(Duration::from_millis(500));
    futures_lite::future::block_on(async_compat::Compat::new(async {
        let client = async_nats::connect(url.as_str()).await?;
        for (key, value) in [
            ("limits.uplink", "20/s"),
            ("feature.beta", "on"),
            ("limits.uplink", "50/s"),
        ] {
            client
                .publish(format!("config.{key}"), value.into())
                .await?;
        }
        client.flush().await?;
        Ok::<(), Box<dyn std::error::Error>>(())
    }))?;
    thread::sleep(Duration::from_millis(500));
    for (handle, thread) in replicas {
        handle.stop();
        thread.join().map_err(|_| "a replica panicked")?;
    }
    let applied = applied.lock().unwrap();
    for replica in 0..3 {
        let seen: Vec<&str> = applied
            .iter()
            .filter(|(r, _)| *r == replica)
            .map(|(_, change)| change.as_str())
            .collect();
        println!("replica {replica} applied {seen:?}");
    }
    if applied.len() != 9 {
        return Err(format!(
            "expected 9 applications (3 changes × 3 replicas), got {}",
            applied.len()
        )
        .into());
    }
    Ok(())
}
