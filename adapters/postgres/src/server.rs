//! How a server is named in errors and logs: never with its password.

use tokio_postgres::Config;
use tokio_postgres::config::Host;

/// A server's address with its secrets hidden (`user:***@`,
/// `password=***`, quoted or percent-encoded), for errors and logs:
/// guard-std's one redaction for every URL form and key/value string.
pub use guard_std::redact::redacted;

/// `host:port/database` of `config`, for errors and logs.
pub fn server_name(config: &Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = config
                .get_ports()
                .get(i)
                .or(config.get_ports().first())
                .copied()
                .unwrap_or(5432);
            match host {
                Host::Tcp(name) => format!("{name}:{port}"),
                Host::Unix(path) => format!("{}:{port}", path.display()),
            }
        })
        .collect();
    format!(
        "{}/{}",
        hosts.join(","),
        config.get_dbname().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_is_named_without_the_password() {
        let config: Config = "postgres://app:secret@db:6543/orders".parse().expect("url");
        assert_eq!(server_name(&config), "db:6543/orders");
    }
}
