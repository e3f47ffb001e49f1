//! The configuration parser: any text gives a configuration or an error,
//! never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(config) = guard_endpoints::config::FileConfig::from_toml(text)
            && config.ratelimit.enabled
        {
            // Enabled policies were validated, so they must resolve.
            let _ = config
                .ratelimit
                .resolved()
                .expect("a validated configuration resolves");
        }
    }
});
