//! An axum server rate-limited by guard-tower: each client IP gets bursts
//! of 5 requests, then 1 a second; beyond, `429` with `Retry-After` and
//! the `RateLimit` fields.
//!
//! ```sh
//! cargo run -p guard-tower --example axum_server -- --port 3000
//! for i in $(seq 7); do curl -si http://127.0.0.1:3000/hello/you | head -n 1; done
//! ```

mod app;

use std::net::{Ipv4Addr, SocketAddr};

const USAGE: &str = "usage: axum_server [--port PORT]   (default 3000, on 127.0.0.1; 0 picks one)";

/// The port from `--port PORT` or `--port=PORT`.
fn port(mut args: impl Iterator<Item = String>) -> Result<u16, String> {
    let mut port = 3000;
    while let Some(arg) = args.next() {
        let value = match arg.as_str() {
            "--port" => args.next(),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => match other.strip_prefix("--port=") {
                Some(value) => Some(value.to_owned()),
                None => return Err(format!("unknown argument {other:?}\n{USAGE}")),
            },
        };
        let value = value.ok_or_else(|| format!("--port needs a value\n{USAGE}"))?;
        port = value
            .parse()
            .map_err(|_| format!("--port: {value:?} is not a port (0 to 65535)\n{USAGE}"))?;
    }
    Ok(port)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port = match port(std::env::args().skip(1)) {
        Ok(port) => port,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let router = app::router(app::limiter())?;
    let listener = match tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("cannot listen on 127.0.0.1:{port}: {e}");
            std::process::exit(1);
        }
    };
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!(
        "each client IP: bursts of {}, then {} a second, {} clients at most; try\n  \
         for i in $(seq 7); do curl -si http://{addr}/hello/you | head -n 1; done",
        app::BURST,
        app::PER_SECOND,
        app::CLIENTS,
    );
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
