//! The Redis Bloom filter hashes under a secret: ids crafted with a public
//! hash to cover the bits of an id never sent do not make it read as a
//! duplicate; replicas share the secret; a filter written before secrets
//! were kept is still read as it was written.

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
/// computes offline, and how filters written before secrets were kept
/// placed their bits.
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
fn a_filter_written_before_secrets_were_kept_is_read_as_it_was_written() {
    let server = RedisServer::start().expect("redis-server");
    let params = BloomParams::for_capacity(1_000, 0.01).unwrap();
    for bit in public_positions(b"order-7", params) {
        server
            .command(&format!("SETBIT bf:{{old}} {bit} 1"))
            .unwrap();
    }
    let filter = RedisBloomDeduplicator::new(connect(&server), "bf", "old", params).unwrap();
    smol::block_on(async {
        assert!(filter.is_duplicate(b"order-7").await.unwrap());
        assert!(!filter.check_and_mark(b"order-8").await.unwrap());
        assert!(filter.is_duplicate(b"order-8").await.unwrap());
    });
    assert_eq!(
        server.command("EXISTS bf:{old}:secret").unwrap().trim(),
        ":0"
    );
    smol::block_on(filter.clear()).unwrap();
    smol::block_on(async {
        assert!(!filter.is_duplicate(b"order-7").await.unwrap());
        filter.mark_as_seen(b"order-7").await.unwrap();
    });
    assert_eq!(
        server.command("EXISTS bf:{old}:secret").unwrap().trim(),
        ":1"
    );
}
