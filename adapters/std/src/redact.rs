//! How a server's address is shown in errors, logs and `Debug` output:
//! never with a secret. One function for every form guard's backends take.
//!
//! - URLs: the user information ends at the last `@` and is hidden
//!   (`scheme://user:***@host/…`; a lone user field may be the credential
//!   itself, a NATS token, so `scheme://***@host/…`); a password with a
//!   raw `/`, `?` or `@` is still hidden whole. A URL without a scheme
//!   (`user:password@host:port`, which NATS accepts) is read from its
//!   start.
//! - Query parameters and key/value connection strings (PostgreSQL's
//!   `host=db password='a b'`): the value of every key that names a secret
//!   ([`SECRET_KEYS`], case-insensitive, percent-encoding decoded, so
//!   `passwor%64=` is `password=`) is `***`, quoted or not, with
//!   backslash-escaped quotes inside.
//!
//! ```
//! use guard_std::redact::redacted;
//!
//! assert_eq!(redacted("redis://:s3cret@h:6379/0"), "redis://:***@h:6379/0");
//! assert_eq!(redacted("unix:///run/redis.sock?db=1&pass=s3cret"), "unix:///run/redis.sock?db=1&pass=***");
//! assert_eq!(redacted("host=db password='a\\'b' user=app"), "host=db password=*** user=app");
//! ```

/// Keys whose value is a secret, in query strings and key/value strings.
pub const SECRET_KEYS: &[&str] = &[
    "password",
    "pass",
    "passwd",
    "pwd",
    "secret",
    "token",
    "sslpassword",
];

/// `text` with every secret hidden; see the module documentation.
pub fn redacted(text: &str) -> String {
    if let Some(end) = scheme_end(text) {
        let (scheme, rest) = text.split_at(end);
        return format!("{scheme}{}", hidden_url(rest));
    }
    // Not a URL: `key=value` pairs apart by blanks; then, if it is one
    // word with an `@`, a URL without a scheme (`user:password@host`).
    let pairs = hidden_pairs(text);
    if pairs.contains('@') && !pairs.contains(char::is_whitespace) {
        hidden_url(&pairs)
    } else {
        pairs
    }
}

/// Where the `scheme://` that starts `text` ends, if it starts with one
/// (RFC 3986: a letter, then letters, digits, `+`, `-` or `.`).
fn scheme_end(text: &str) -> Option<usize> {
    let colon = text.find("://")?;
    let scheme = &text[..colon];
    let mut chars = scheme.chars();
    let starts = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    let rest = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (starts && rest).then_some(colon + 3)
}

/// A URL after its scheme: the user information (up to the last `@`)
/// hidden, then every secret parameter of what follows. The last `@` may
/// stand in the query (`?email=a@b`): the parameters after it are still
/// read, as every `?`, `&` or `#` starts one.
fn hidden_url(rest: &str) -> String {
    let (userinfo, tail) = match rest.rsplit_once('@') {
        Some((userinfo, tail)) => (Some(userinfo), tail),
        None => (None, rest),
    };
    let shown = match userinfo {
        Some(userinfo) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@"),
            None => "***@".to_owned(),
        },
        None => String::new(),
    };
    format!("{shown}{}", hidden_params(tail))
}

/// `text` with the value of every secret `key=value` hidden, a parameter
/// starting after each `?`, `&` or `#`.
fn hidden_params(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for piece in text.split_inclusive(['?', '&', '#']) {
        let (param, delimiter) = match piece.char_indices().last() {
            Some((at, '?' | '&' | '#')) => piece.split_at(at),
            _ => (piece, ""),
        };
        match param.split_once('=') {
            Some((key, _)) if is_secret(key) => {
                out.push_str(key);
                out.push_str("=***");
            }
            _ => out.push_str(param),
        }
        out.push_str(delimiter);
    }
    out
}

/// A key/value string with every secret's value hidden: `key=value`,
/// blanks allowed around `=`, a value bare up to the next blank or quoted
/// in `'…'` with `\'` and `\\` escaped inside.
fn hidden_pairs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let (before, after) = rest.split_at(eq);
        let key = before
            .trim_end()
            .rsplit(char::is_whitespace)
            .next()
            .unwrap_or_default();
        let blanks = after[1..].len() - after[1..].trim_start().len();
        let value_start = eq + 1 + blanks;
        let value = &rest[value_start..];
        out.push_str(&rest[..value_start]);
        let Some(value_len) = value_len(value) else {
            // A quote never closed: what follows may be anything, a
            // secret's key and value included.
            out.push_str("***");
            return out;
        };
        if is_secret(key) {
            out.push_str("***");
        } else {
            out.push_str(&value[..value_len]);
        }
        rest = &value[value_len..];
    }
    out.push_str(rest);
    out
}

/// The length of the value at the start of `text`: a quoted one to its
/// closing quote, a bare one to the next blank; `None` for a quote never
/// closed.
fn value_len(text: &str) -> Option<usize> {
    let Some(quoted) = text.strip_prefix('\'') else {
        return Some(text.find(char::is_whitespace).unwrap_or(text.len()));
    };
    let mut escaped = false;
    for (i, c) in quoted.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '\'' => return Some(i + 2),
            _ => {}
        }
    }
    None
}

/// Whether `key` (percent-encoding decoded, any case) names a secret.
fn is_secret(key: &str) -> bool {
    let decoded = percent_decoded(key.trim()).to_ascii_lowercase();
    SECRET_KEYS.contains(&decoded.as_str())
}

/// `text` with each `%XX` decoded (invalid sequences kept as they are,
/// bytes that are not UTF-8 replaced).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'%', Some(decoded)) => {
                out.push(decoded);
                i += 3;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::redacted;

    #[test]
    fn every_form_is_shown_without_its_secrets() {
        for (text, shown) in [
            // URLs' user information.
            ("amqp://broker/v", "amqp://broker/v"),
            ("amqp://u:secret@broker/v", "amqp://u:***@broker/v"),
            ("nats://token@nats:4222", "nats://***@nats:4222"),
            ("u:secret@nats:4222", "u:***@nats:4222"),
            (
                "mysql://root:se/cr@et@db:3306/app",
                "mysql://root:***@db:3306/app",
            ),
            ("redis://:secret@h:6379/", "redis://:***@h:6379/"),
            ("postgres://app:pa/ss?x@db/app", "postgres://app:***@db/app"),
            ("not a url", "not a url"),
            ("", ""),
            // Query parameters, any case, percent-encoded keys.
            (
                "postgres://app@db/app?password=secret&sslmode=disable",
                "postgres://***@db/app?password=***&sslmode=disable",
            ),
            (
                "unix:///run/redis.sock?pass=S",
                "unix:///run/redis.sock?pass=***",
            ),
            (
                "redis+unix:///run/r.sock?db=2&Password=S#x",
                "redis+unix:///run/r.sock?db=2&Password=***#x",
            ),
            (
                "postgres://db/app?passwor%64=S&user=u",
                "postgres://db/app?passwor%64=***&user=u",
            ),
            ("postgres://db/app?%70ass=S", "postgres://db/app?%70ass=***"),
            ("postgres://db/app", "postgres://db/app"),
            (
                "postgres://u:p@h/db?email=a@b&password=S",
                "postgres://u:***@b&password=***",
            ),
            // Key/value strings: quoted, escaped, blanks around `=`.
            (
                "host=db password='a b' user=app",
                "host=db password=*** user=app",
            ),
            ("host=db password=x", "host=db password=***"),
            (
                "host=db password = s3cret dbname=app",
                "host=db password = *** dbname=app",
            ),
            (
                "host=db password='a\\'b' user=app",
                "host=db password=*** user=app",
            ),
            (
                "host=db password='a\\\\' user=app",
                "host=db password=*** user=app",
            ),
            ("host=db PASSWORD='open", "host=db PASSWORD=***"),
            ("password=p@ss host=db", "password=*** host=db"),
            ("password=p@ss", "password=***"),
            // `://` inside a key/value string is not a scheme.
            (
                "host=db application_name=http://x password=S3cret",
                "host=db application_name=http://x password=***",
            ),
            (
                "password=S3cret options=a://b",
                "password=*** options=a://b",
            ),
            // A URL without a scheme, with a query.
            ("u:secret@nats:4222?x=1", "u:***@nats:4222?x=1"),
            // A quote never closed hides all that follows.
            (
                "host=db options='-c x password=S3cret",
                "host=db options=***",
            ),
        ] {
            let got = redacted(text);
            assert_eq!(got, shown, "{text}");
            for secret in [
                "secret", "s3cret", "S3cret", "se/cr@et", "pa/ss", "a b", "a\\'b", "p@ss", "open",
            ] {
                if text.contains(secret) && !shown.contains(secret) {
                    assert!(!got.contains(secret), "{secret} in {got}");
                }
            }
        }
    }
}
