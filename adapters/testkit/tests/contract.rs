//! LocalLocker passes the Locker contract that every backend runs.

#[test]
fn local_locker_passes_the_locker_contract() {
    guard_testkit::contract::run_all(&guard_std::LocalLocker::new(), "contract", 50);
}
