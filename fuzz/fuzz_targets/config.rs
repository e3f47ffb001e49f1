//! The configuration parser: any text gives a validated configuration or
//! an error naming what is wrong, never a panic; an error's message always
//! says it is one, and environment lookups never escape into the result.
#![no_main]

use guard_gateway::config::{Config, ConfigError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        match Config::from_toml_with_env(text, |name| Some(format!("<{name}>"))) {
            Ok(config) => {
                // Validation holds in what comes out.
                assert!(config.guards.active.config().validate().is_ok());
                for policy in config.ratelimit.iter().flat_map(|r| &r.policies) {
                    assert!(!policy.key_prefix.contains(['{', '}']));
                }
            }
            Err(ConfigError::Invalid { key, .. }) => assert!(!key.is_empty()),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
});
