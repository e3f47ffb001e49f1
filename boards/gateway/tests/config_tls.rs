//! The configuration's TLS keys (`tls_ca`, `tls_cert`, `tls_key`, MQTT's
//! `tls`) and `rediss://` URLs: parsed into checked settings with the
//! `tls` feature, each bad value refused naming its key, its value and
//! what is allowed; without the feature, every TLS setting refused as
//! such.

use guard_gateway::config::Config;
use guard_testkit::TestCerts;

/// A schedule, so that a section under test is not refused as a file
/// that does nothing.
const JOB: &str = "[[schedules]]\nrouter = \"r0\"\nevery_ms = 1000\n";

fn error(text: &str) -> String {
    Config::from_toml(&format!("{JOB}{text}"))
        .unwrap_err()
        .to_string()
}

fn locker(url: &str, extra: &str) -> String {
    format!("[locker]\nkind = \"redis\"\nurl = \"{url}\"\n{extra}")
}

fn path(p: std::path::PathBuf) -> String {
    p.display().to_string()
}

#[cfg(feature = "tls")]
mod with_tls {
    use std::path::Path;

    use guard_gateway::config::{Config, Source};
    use guard_redis::Topology;

    use super::*;

    fn config(text: &str) -> Config {
        Config::from_toml(&format!("{JOB}{text}")).unwrap()
    }

    #[test]
    fn a_rediss_locker_reads_its_files_and_its_endpoints_share_them() {
        let certs = TestCerts::generate().unwrap();
        let (ca, cert, key) = (
            path(certs.ca_path()),
            path(certs.client_cert_path()),
            path(certs.client_key_path()),
        );
        let c = config(&format!(
            "{}\n[[endpoints]]\nname = \"alerts\"\nkind = \"redis-pubsub\"\npatterns = [\"a.*\"]\n",
            locker(
                "rediss://127.0.0.1:6380/",
                &format!("tls_ca = \"{ca}\"\ntls_cert = \"{cert}\"\ntls_key = \"{key}\"\n"),
            )
        ));
        let redis = c.redis_locker().unwrap();
        let tls = redis.tls.as_ref().expect("TLS for a rediss:// URL");
        assert_eq!(tls.ca_path(), Some(Path::new(&ca)));
        assert_eq!(tls.cert_path(), Some(Path::new(&cert)));
        assert_eq!(tls.key_path(), Some(Path::new(&key)));
        assert!(tls.redis().has_root_ca() && tls.redis().has_client_identity());
        assert!(tls.mqtt().has_root_ca() && tls.mqtt().has_client_identity());
        let shown = format!("{tls:?}");
        assert!(!shown.contains("PRIVATE KEY"), "{shown}");
        let Source::RedisPubsub(pubsub) = &c.endpoints[0].source else {
            panic!("{:?}", c.endpoints[0].source);
        };
        assert_eq!(pubsub.url, "rediss://127.0.0.1:6380/");
        assert_eq!(pubsub.tls.as_ref(), Some(tls), "the locker's TLS settings");
    }

    #[test]
    fn rediss_urls_alone_use_the_system_roots_and_a_plain_url_no_tls() {
        let c = config(
            "[locker]\nkind = \"redis\"\nmode = \"cluster\"\nurls = [\"rediss://127.0.0.1:7000/\", \"rediss://127.0.0.1:7001/\"]\n",
        );
        let redis = c.redis_locker().unwrap();
        assert!(matches!(redis.topology, Topology::Cluster { .. }));
        let tls = redis.tls.as_ref().expect("TLS");
        assert_eq!(tls.ca_path(), None);
        assert!(!tls.redis().has_root_ca());
        let c = config(&locker("redis://127.0.0.1:6379/", ""));
        assert_eq!(c.redis_locker().unwrap().tls, None);
    }

    #[test]
    fn redis_endpoints_with_urls_of_their_own_take_their_own_files() {
        let certs = TestCerts::generate().unwrap();
        let ca = path(certs.ca_path());
        let c = config(&format!(
            r#"
[locker]
kind = "local"

[[endpoints]]
name = "orders"
kind = "redis-stream"
url = "rediss://127.0.0.1:6380/"
tls_ca = "{ca}"
stream = "orders"
group = "billing"

[[endpoints]]
name = "alerts"
kind = "redis-pubsub"
url = "rediss://127.0.0.1:6380/"
patterns = ["a.*"]
"#
        ));
        let Source::RedisStream(stream) = &c.endpoints[0].source else {
            panic!("{:?}", c.endpoints[0].source);
        };
        assert_eq!(
            stream.tls.as_ref().and_then(|t| t.ca_path()),
            Some(Path::new(&ca))
        );
        let Source::RedisPubsub(pubsub) = &c.endpoints[1].source else {
            panic!("{:?}", c.endpoints[1].source);
        };
        let tls = pubsub.tls.as_ref().expect("TLS for rediss://");
        assert_eq!(tls.ca_path(), None, "the system's roots");
    }

    #[test]
    fn mqtt_tls_is_on_with_tls_or_a_file_and_defaults_to_port_8883() {
        let certs = TestCerts::generate().unwrap();
        let ca = path(certs.ca_path());
        let mqtt = |keys: &str| {
            format!(
                "[[endpoints]]\nname = \"t\"\nkind = \"mqtt\"\nhost = \"broker\"\nfilter = \"s/#\"\n{keys}"
            )
        };
        let source = |c: &Config| match &c.endpoints[0].source {
            Source::Mqtt(m) => m.clone(),
            other => panic!("{other:?}"),
        };
        let on = source(&config(&mqtt("tls = true\n")));
        assert_eq!(on.port, 8883);
        assert!(on.tls.as_ref().is_some_and(|t| t.ca_path().is_none()));
        let with_ca = source(&config(&mqtt(&format!("tls_ca = \"{ca}\"\nport = 9883\n"))));
        assert_eq!(with_ca.port, 9883);
        assert_eq!(
            with_ca.tls.as_ref().and_then(|t| t.ca_path()),
            Some(Path::new(&ca))
        );
        assert!(with_ca.tls.unwrap().mqtt().has_root_ca());
        let plain = source(&config(&mqtt("")));
        assert_eq!((plain.port, plain.tls), (1883, None));
        let off = source(&config(&mqtt("tls = false\n")));
        assert_eq!((off.port, off.tls), (1883, None));

        let err = error(&mqtt(&format!("tls = false\ntls_ca = \"{ca}\"\n")));
        assert!(
            err.contains("`endpoints[0].tls_ca`") && err.contains("no TLS files with tls = false"),
            "{err}"
        );
        let err = error(&mqtt("tls_ca = \"/nonexistent/ca.pem\"\n"));
        assert!(
            err.contains(
                "`endpoints[0].tls_ca` = \"/nonexistent/ca.pem\": expected a readable file of PEM CA certificates"
            ),
            "{err}"
        );
    }

    #[test]
    fn bad_tls_values_are_refused_naming_the_key_the_value_and_what_is_allowed() {
        let certs = TestCerts::generate().unwrap();
        let other = TestCerts::generate().unwrap();
        let garbage = certs.dir().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        let garbage = path(garbage);
        let (ca, cert, key) = (
            path(certs.ca_path()),
            path(certs.client_cert_path()),
            path(certs.client_key_path()),
        );
        let rediss = |extra: &str| error(&locker("rediss://127.0.0.1:6380/", extra));

        // A missing file.
        let err = rediss("tls_ca = \"/nonexistent/ca.pem\"\n");
        assert!(
            err.contains(
                "invalid configuration: `locker.tls_ca` = \"/nonexistent/ca.pem\": expected a readable file of PEM CA certificates ("
            ),
            "{err}"
        );
        // A file that holds no certificate.
        let err = rediss(&format!("tls_ca = \"{garbage}\"\n"));
        assert!(
            err.contains(&format!(
                "`locker.tls_ca` = \"{garbage}\": expected PEM CA certificates: no certificate in it"
            )),
            "{err}"
        );
        // A client certificate without its key, and a key alone.
        let err = rediss(&format!("tls_cert = \"{cert}\"\n"));
        assert!(
            err.contains("`locker.tls_key` = missing: expected the PEM private key of `tls_cert`"),
            "{err}"
        );
        let err = rediss(&format!("tls_key = \"{key}\"\n"));
        assert!(err.contains("`locker.tls_cert` = missing"), "{err}");
        // A key file that holds no key, and another certificate's key.
        let err = rediss(&format!("tls_cert = \"{cert}\"\ntls_key = \"{ca}\"\n"));
        assert!(
            err.contains(&format!(
                "`locker.tls_key` = \"{ca}\": expected the PEM private key"
            )),
            "{err}"
        );
        let other_key = path(other.client_key_path());
        let err = rediss(&format!(
            "tls_cert = \"{cert}\"\ntls_key = \"{other_key}\"\n"
        ));
        assert!(
            err.contains(&format!("`locker.tls_key` = \"{other_key}\""))
                && err.contains("not a usable key for the client certificate"),
            "{err}"
        );
        let err = rediss(&format!("tls_cert = \"{garbage}\"\ntls_key = \"{key}\"\n"));
        assert!(
            err.contains(&format!(
                "`locker.tls_cert` = \"{garbage}\": expected a PEM client certificate"
            )),
            "{err}"
        );
        // TLS files with a plain URL.
        let err = error(&locker(
            "redis://127.0.0.1:6379/",
            &format!("tls_ca = \"{ca}\"\n"),
        ));
        assert!(
            err.contains(&format!(
                "`locker.tls_ca` = \"{ca}\": expected no TLS files with a redis:// URL (use rediss:// for TLS)"
            )),
            "{err}"
        );
        // A deployment mixing TLS and plain URLs.
        let err = error(
            "[locker]\nkind = \"redis\"\nmode = \"sentinel\"\nservice = \"m\"\nurls = [\"rediss://127.0.0.1:1/\", \"redis://127.0.0.1:2/\"]\n",
        );
        assert!(
            err.contains(
                "`locker.urls[1]` = \"redis://127.0.0.1:2/\": expected rediss:// like `locker.urls[0]`"
            ),
            "{err}"
        );
        // TLS keys for a locker that is not Redis, and for an endpoint that
        // shares the locker's connection.
        let err = error(&format!("[locker]\nkind = \"local\"\ntls_ca = \"{ca}\"\n"));
        assert!(
            err.contains("`locker.tls_ca` = set: expected no such key unless kind = \"redis\""),
            "{err}"
        );
        let err = error(&format!(
            "{}\n[[endpoints]]\nname = \"o\"\nkind = \"redis-stream\"\nstream = \"s\"\ngroup = \"g\"\ntls_ca = \"{ca}\"\n",
            locker("rediss://127.0.0.1:6380/", "")
        ));
        assert!(
            err.contains("`endpoints[0].tls_ca`")
                && err.contains("no TLS keys without `url`: the locker's connection"),
            "{err}"
        );
        // A path from the environment, unset.
        let err = rediss("tls_ca = \"${GUARD_TEST_UNSET_CA}\"\n");
        assert!(
            err.contains("`locker.tls_ca`") && err.contains("GUARD_TEST_UNSET_CA"),
            "{err}"
        );
    }
}

#[cfg(not(feature = "tls"))]
mod without_tls {
    use super::*;

    #[test]
    fn every_tls_setting_is_refused_as_unsupported() {
        let certs = TestCerts::generate().unwrap();
        let ca = path(certs.ca_path());
        let err = error(&locker("rediss://127.0.0.1:6380/", ""));
        assert!(
            err.contains("`locker.url` = \"rediss://127.0.0.1:6380/\"")
                && err.contains("no TLS support"),
            "{err}"
        );
        let err = error(&locker(
            "redis://127.0.0.1:6379/",
            &format!("tls_ca = \"{ca}\"\n"),
        ));
        assert!(
            err.contains(&format!("`locker.tls_ca` = \"{ca}\""))
                && err.contains("this build has no TLS support"),
            "{err}"
        );
        let err = error(
            "[[endpoints]]\nname = \"t\"\nkind = \"mqtt\"\nhost = \"broker\"\nfilter = \"s/#\"\ntls = true\n",
        );
        assert!(
            err.contains("`endpoints[0].tls` = true") && err.contains("no TLS support"),
            "{err}"
        );
    }
}
