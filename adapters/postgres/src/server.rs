//! How a server is named in errors and logs: never with its password.

use tokio_postgres::Config;
use tokio_postgres::config::Host;

/// `url` with its password hidden (`user:***@`, `password=***`), for
/// errors and logs.
pub fn redacted(url: &str) -> String {
    let mut out = url.to_owned();
    if let Some(scheme) = out.find("://") {
        let start = scheme + 3;
        // The user information ends at the last '@' (a password that
        // breaks the URL with a raw '/' or '?' is still hidden whole).
        if let Some(at) = out[start..].rfind('@') {
            let at = start + at;
            if let Some(colon) = out[start..at].find(':') {
                out.replace_range(start + colon + 1..at, "***");
            }
        }
    }
    // `password=x`, also with blanks around the `=` (the key=value form
    // allows them).
    let mut from = 0;
    while let Some(i) = out[from..].find("password") {
        let after_key = from + i + "password".len();
        let rest = &out[after_key..];
        let Some(eq) = rest.trim_start().strip_prefix('=') else {
            from = after_key;
            continue;
        };
        let value = out.len() - eq.trim_start().len();
        let rest = &out[value..];
        let end = if let Some(quoted) = rest.strip_prefix('\'') {
            quoted.find('\'').map_or(out.len(), |j| value + j + 2)
        } else {
            rest.find([' ', '&']).map_or(out.len(), |j| value + j)
        };
        out.replace_range(value..end, "***");
        from = value + 3;
    }
    out
}

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
    fn passwords_are_hidden() {
        assert_eq!(
            redacted("postgres://app:secret@db:5432/app"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(
            redacted("postgres://app@db/app?password=secret&sslmode=disable"),
            "postgres://app@db/app?password=***&sslmode=disable"
        );
        assert_eq!(
            redacted("host=db password='a b' user=app"),
            "host=db password=*** user=app"
        );
        assert_eq!(redacted("host=db password=x"), "host=db password=***");
        assert_eq!(
            redacted("host=db password = s3cret dbname=app"),
            "host=db password = *** dbname=app"
        );
        assert_eq!(
            redacted("postgres://app:pa/ss?x@db/app"),
            "postgres://app:***@db/app",
            "a password that breaks the URL is hidden whole"
        );
        assert_eq!(redacted("postgres://db/app"), "postgres://db/app");
    }

    #[test]
    fn the_server_is_named_without_the_password() {
        let config: Config = "postgres://app:secret@db:6543/orders".parse().expect("url");
        assert_eq!(server_name(&config), "db:6543/orders");
    }
}
