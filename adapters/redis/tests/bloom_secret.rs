//! The Redis Bloom filter hashes under a secret: ids crafted with a public
//! hash to cover the bits of an id never sent do not make it read as a
//! duplicate; replicas share the secret, also across a clear or the
//! secret's eviction; a filter never falls back to a public hash.

use std::time::Duration;

use guard_core::dedup::BloomParams;
use guard_redis::{RedisBloomDeduplicator, RedisConnection, Topology};
use guard_testkit::RedisServer;

fn connect(server: &RedisServer) -> RedisConnection {
    smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        Duration::from_secs(2),
    ))
    .expect("connect")
}

/// The bit positions a public, unkeyed hash gives `item` (FNV-1a 64 and
/// the splitmix64 finalizer, split Kirsch–Mitzenmacher): what an attacker
/// computes offline.
fn public_positions(item: &[u8], params: BloomParams) -> Vec<u64> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in item {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    let step = (h.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15) | 1;
    (0..u64::from(params.hashes))
        .map(|i| h.wrapping_add(i.wrapping_mul(step)) % params.bits)
        .collect()
}

/// Ids whose public positions together cover every bit of `target`'s.
fn crafted_to_cover(target: &[u8], params: BloomParams) -> Vec<Vec<u8>> {
    let mut crafted = Vec::new();
    for bit in public_positions(target, params) {
        let id = (0u64..)
            .map(|n| format!("crafted-{n}").into_bytes())
            .find(|id| public_positions(id, params).contains(&bit))
            .unwrap();
        crafted.push(id);
    }
    crafted
}

#[test]
fn ids_crafted_with_a_public_hash_never_make_an_unsent_id_a_duplicate() {
    let server = RedisServer::start().expect("redis-server");
    let params = BloomParams::for_capacity(1_000, 0.01).unwrap();
    let target = b"order-never-sent";
    let crafted = crafted_to_cover(target, params);
    assert!(crafted.len() <= params.hashes as usize);
    for filter in [
        RedisBloomDeduplicator::new(connect(&server), "bf", "kept", params).unwrap(),
        RedisBloomDeduplicator::new(connect(&server), "bf", "given", params)
            .unwrap()
            .with_secret([0x42; 16]),
    ] {
        smol::block_on(async {
            for id in &crafted {
                filter.mark_as_seen(id).await.unwrap();
            }
            assert!(
                !filter.is_duplicate(target).await.unwrap(),
                "{filter:?}: an id never sent reads as seen"
            );
        });
    }
}

#[test]
fn replicas_share_the_kept_secret_and_a_clear_makes_a_new_one() {
    let server = RedisServer::start().expect("redis-server");
    let params = BloomParams::for_capacity(1_000, 0.01).unwrap();
    let a = RedisBloomDeduplicator::new(connect(&server), "bf", "orders", params).unwrap();
    let b = RedisBloomDeduplicator::new(connect(&server), "bf", "orders", params).unwrap();
    smol::block_on(async {
        for i in 0..200 {
            let id = format!("order-{i}");
            assert!(!a.check_and_mark(id.as_bytes()).await.unwrap());
            assert!(b.check_and_mark(id.as_bytes()).await.unwrap(), "{id}");
        }
    });
    let secret = server.command("GET bf:{orders}:secret").unwrap();
    smol::block_on(a.clear()).unwrap();
    smol::block_on(async {
        assert!(!a.check_and_mark(b"order-1").await.unwrap());
    });
    let after = server.command("GET bf:{orders}:secret").unwrap();
    assert_ne!(secret, after, "a cleared filter starts under a new secret");
}

#[test]
fn a_filter_whose_secret_is_gone_is_read_under_a_new_one_never_unkeyed() {
    let server = RedisServer::start().expect("redis-server");
    let params = BloomParams::for_capacity(1_000, 0.01).unwrap();
    // Bits at an item's public positions, and no secret (evicted, or
    // never made): the filter must not fall back to the public hash.
    for bit in public_positions(b"order-7", params) {
        server
            .command(&format!("SETBIT bf:{{old}} {bit} 1"))
            .unwrap();
    }
    let filter = RedisBloomDeduplicator::new(connect(&server), "bf", "old", params).unwrap();
    smol::block_on(async {
        assert!(!filter.is_duplicate(b"order-7").await.unwrap());
    });
    assert_eq!(
        server.command("EXISTS bf:{old}:secret").unwrap().trim(),
        ":1"
    );
}

#[test]
fn a_replica_that_read_the_secret_before_another_cleared_marks_under_the_new_one() {
    let server = RedisServer::start().expect("redis-server");
    let params = BloomParams::for_capacity(1_000, 0.01).unwrap();
    let a = RedisBloomDeduplicator::new(connect(&server), "bf", "shared", params).unwrap();
    let b = RedisBloomDeduplicator::new(connect(&server), "bf", "shared", params).unwrap();
    smol::block_on(async {
        assert!(
            !b.check_and_mark(b"warm").await.unwrap(),
            "b reads the secret"
        );
        a.clear().await.unwrap();
        assert!(!b.check_and_mark(b"order-1").await.unwrap());
        assert!(
            a.is_duplicate(b"order-1").await.unwrap(),
            "b marked under a's secret"
        );
        // The secret evicted: the next caller makes one, the others follow.
        server.command("DEL bf:{shared}:secret").unwrap();
        assert!(!a.check_and_mark(b"order-2").await.unwrap());
        assert!(b.is_duplicate(b"order-2").await.unwrap());
    });
}
