//! The flash queue's guarantees under power cuts: a workload runs on a
//! simulated NOR flash that loses power at its k-th step (a word written
//! or a page erased), for every k; the cut word is half programmed and the
//! cut page half erased. The device then restarts on what the flash holds
//! and the queue must hold exactly what was acknowledged (guarantees 1 to
//! 4 of `guard_embassy::flash`).

use std::collections::VecDeque;
use std::ops::Range;

use embassy_futures::block_on;
use embedded_storage_async::nor_flash::{
    ErrorType, MultiwriteNorFlash, NorFlash, NorFlashError, NorFlashErrorKind, ReadNorFlash,
};
use guard_core::dlq::{DeadLetterSink, FailedElement};
use guard_core::time::Instant;
use guard_embassy::flash::{
    FlashDeadLetterQueue, FlashError, FlashQueue, FlashRecord, LayoutProblem, RecordError,
    StoreError,
};

const WORD: usize = 4;
const PAGE: usize = 256;
const PAGES: usize = 4;

/// What the simulated flash reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The power is gone: nothing more happens until the restart.
    PowerOff,
    OutOfBounds,
    NotAligned,
}

impl NorFlashError for Fault {
    fn kind(&self) -> NorFlashErrorKind {
        match self {
            Fault::PowerOff => NorFlashErrorKind::Other,
            Fault::OutOfBounds => NorFlashErrorKind::OutOfBounds,
            Fault::NotAligned => NorFlashErrorKind::NotAligned,
        }
    }
}

/// NOR flash in memory: erasing sets a page to 0xFF, writing can only
/// clear bits (so rewriting a word ANDs it, as `MultiwriteNorFlash`
/// allows), and the power goes at a chosen step.
struct PowerCutFlash {
    bytes: Vec<u8>,
    /// Steps (word writes and page erases) done so far.
    steps: usize,
    /// The step at which the power goes, if any.
    cut_at: Option<usize>,
    powered: bool,
    /// Chooses which bits of the cut word are programmed and which bytes
    /// of the cut page are erased.
    rng: u64,
}

impl PowerCutFlash {
    fn erased() -> Self {
        Self::restart(vec![0xFF; PAGE * PAGES])
    }

    /// The flash as a device finds it after a restart: `bytes` as they
    /// were left, the power on, no cut planned.
    fn restart(bytes: Vec<u8>) -> Self {
        PowerCutFlash {
            bytes,
            steps: 0,
            cut_at: None,
            powered: true,
            rng: 0x9E37_79B9_7F4A_7C15,
        }
    }

    fn cut_at(mut self, step: usize, seed: u64) -> Self {
        self.cut_at = Some(step);
        self.rng ^= seed.wrapping_mul(0xD129_0B3A_5C5F_1E8D) | 1;
        self
    }

    fn random(&mut self) -> u64 {
        // xorshift64: a fixed, seeded sequence, so a failure repeats.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Counts a step; `true` if the power goes during it.
    fn step(&mut self) -> bool {
        let cut = self.cut_at == Some(self.steps);
        self.steps += 1;
        cut
    }

    fn check(&self, offset: u32, len: usize, align: usize) -> Result<usize, Fault> {
        if !self.powered {
            return Err(Fault::PowerOff);
        }
        let start = offset as usize;
        if !start.is_multiple_of(align) || !len.is_multiple_of(align) {
            return Err(Fault::NotAligned);
        }
        if start + len > self.bytes.len() {
            return Err(Fault::OutOfBounds);
        }
        Ok(start)
    }
}

impl ErrorType for PowerCutFlash {
    type Error = Fault;
}

impl ReadNorFlash for PowerCutFlash {
    const READ_SIZE: usize = 1;

    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), Fault> {
        let start = self.check(offset, bytes.len(), 1)?;
        bytes.copy_from_slice(&self.bytes[start..start + bytes.len()]);
        Ok(())
    }

    fn capacity(&self) -> usize {
        self.bytes.len()
    }
}

impl NorFlash for PowerCutFlash {
    const WRITE_SIZE: usize = WORD;
    const ERASE_SIZE: usize = PAGE;

    async fn erase(&mut self, from: u32, to: u32) -> Result<(), Fault> {
        let start = self.check(from, (to - from) as usize, PAGE)?;
        for page in (start..to as usize).step_by(PAGE) {
            if self.step() {
                // Half erased, in one of three ways (a real erase works on
                // the whole page at once): the first half back to 0xFF,
                // the second half, or some bytes anywhere; the rest as
                // they were.
                let way = self.random() % 3;
                for i in page..page + PAGE {
                    let erased = match way {
                        0 => i < page + PAGE / 2,
                        1 => i >= page + PAGE / 2,
                        _ => self.random() & 1 == 0,
                    };
                    if erased {
                        self.bytes[i] = 0xFF;
                    }
                }
                self.powered = false;
                return Err(Fault::PowerOff);
            }
            self.bytes[page..page + PAGE].fill(0xFF);
        }
        Ok(())
    }

    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), Fault> {
        let start = self.check(offset, bytes.len(), WORD)?;
        for (i, word) in bytes.chunks(WORD).enumerate() {
            let at = start + i * WORD;
            if self.step() {
                // Half programmed: some of the bits it clears are cleared.
                let mask = self.random().to_le_bytes();
                for (j, byte) in word.iter().enumerate() {
                    self.bytes[at + j] &= byte | mask[j];
                }
                self.powered = false;
                return Err(Fault::PowerOff);
            }
            for (j, byte) in word.iter().enumerate() {
                self.bytes[at + j] &= byte;
            }
        }
        Ok(())
    }
}

impl MultiwriteNorFlash for PowerCutFlash {}

const R: usize = 64;
type Queue = FlashQueue<PowerCutFlash, R>;

fn queue(flash: PowerCutFlash) -> Queue {
    FlashQueue::new(flash, 0..(PAGE * PAGES) as u32).expect("a valid range")
}

/// Record `id`'s bytes: its id, then a filler that tells it apart, of a
/// length that varies with the id (6 to 56 bytes), so records straddle
/// pages at different places.
fn record(id: u32) -> Vec<u8> {
    let len = 6 + (id as usize * 7) % 51;
    let mut bytes = id.to_le_bytes().to_vec();
    bytes.extend((4..len).map(|i| (id as u8).wrapping_mul(31).wrapping_add(i as u8)));
    bytes
}

/// The id of a record read back, checking it is exactly one that was
/// pushed (guarantee 3: nothing half-read).
fn id_of(bytes: &[u8]) -> u32 {
    let id = u32::from_le_bytes(bytes[..4].try_into().expect("a record holds its id"));
    assert_eq!(
        bytes,
        record(id),
        "record {id} read back is not what was pushed"
    );
    id
}

/// What the device did when the power went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InFlight {
    Nothing,
    Push(u32),
    Pop(u32),
}

/// Pops the oldest, checking it is the model's oldest (guarantee 4).
fn pop(queue: &mut Queue, acked: &mut VecDeque<u32>) -> Result<(), InFlight> {
    let Some(&front) = acked.front() else {
        return Ok(());
    };
    match block_on(queue.peek()) {
        Ok(Some(bytes)) => assert_eq!(id_of(bytes), front, "the oldest is first"),
        Ok(None) => panic!("record {front} acknowledged but not there"),
        Err(FlashError::Flash(Fault::PowerOff)) => return Err(InFlight::Nothing),
        Err(e) => panic!("peek failed: {e}"),
    }
    match block_on(queue.pop()) {
        Ok(true) => {
            acked.pop_front();
            Ok(())
        }
        Ok(false) => panic!("record {front} acknowledged but not popped"),
        Err(FlashError::Flash(Fault::PowerOff)) => Err(InFlight::Pop(front)),
        Err(e) => panic!("pop failed: {e}"),
    }
}

/// How full a workload keeps the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// A pop after every second push, and whenever the queue is full: the
    /// queue spans every page, so the page erased for room is the oldest.
    Full,
    /// A pop whenever more than two records are held: blank pages lie
    /// between the newest and the oldest, which is erased once popped.
    Short,
}

/// Pushes the records `ids`, popping as `shape` says and whenever the
/// queue is full, until all are pushed or the power goes. `acked` is what
/// the queue holds at the start, and is kept as what it must hold (only
/// acknowledged pushes and pops change it); returns what the power cut.
fn workload(
    queue: &mut Queue,
    acked: &mut VecDeque<u32>,
    ids: Range<u32>,
    shape: Shape,
) -> InFlight {
    let mut next = ids.start;
    while next < ids.end {
        match block_on(queue.push(&record(next))) {
            Ok(()) => {
                acked.push_back(next);
                next += 1;
                let pop_now = match shape {
                    Shape::Full => next.is_multiple_of(3),
                    Shape::Short => acked.len() > 2,
                };
                if pop_now && let Err(cut) = pop(queue, acked) {
                    return cut;
                }
            }
            Err(FlashError::Full) => {
                assert!(
                    !acked.is_empty(),
                    "full while it holds nothing, at record {next}"
                );
                if let Err(cut) = pop(queue, acked) {
                    return cut;
                }
            }
            Err(FlashError::Flash(Fault::PowerOff)) => return InFlight::Push(next),
            Err(e) => panic!("push of record {next} failed: {e}"),
        }
    }
    InFlight::Nothing
}

/// Pops every record `acked` holds, oldest first, until the power goes.
fn drain(queue: &mut Queue, acked: &mut VecDeque<u32>) -> Result<(), InFlight> {
    while !acked.is_empty() {
        pop(queue, acked)?;
    }
    Ok(())
}

/// Every id the queue holds, oldest first.
fn contents(queue: &mut Queue) -> Vec<u32> {
    let mut ids = Vec::new();
    block_on(queue.for_each(|bytes| ids.push(id_of(bytes)))).expect("the queue reads back");
    ids
}

/// What a restarted queue may hold: what was acknowledged, less a cut
/// pop's record (at least once), plus a cut push's record if it landed
/// whole. Nothing else (guarantees 1 and 2).
fn allowed(acked: &VecDeque<u32>, cut: InFlight) -> Vec<Vec<u32>> {
    let acked: Vec<u32> = acked.iter().copied().collect();
    let mut allowed = vec![acked.clone()];
    match cut {
        InFlight::Pop(id) => {
            assert_eq!(acked.first(), Some(&id));
            allowed.push(acked[1..].to_vec());
        }
        InFlight::Push(id) => {
            let mut with = acked;
            with.push(id);
            allowed.push(with);
        }
        InFlight::Nothing => {}
    }
    allowed
}

/// Restarts on `bytes` and checks the queue against what was acknowledged
/// before the cut; then it must work on: its records pop in order, and
/// new ones go in after them. Returns what it held.
fn check_after_restart(bytes: Vec<u8>, acked: &VecDeque<u32>, cut: InFlight, at: &str) -> Vec<u32> {
    let mut queue = queue(PowerCutFlash::restart(bytes));
    let found = contents(&mut queue);
    assert!(
        allowed(acked, cut).contains(&found),
        "cut {at} during {cut:?}: acknowledged {acked:?}, found {found:?}"
    );
    let mut left: VecDeque<u32> = found.iter().copied().collect();
    while !left.is_empty() {
        pop(&mut queue, &mut left).unwrap_or_else(|_| panic!("cut {at}: no power?"));
    }
    // Enough to wrap every page twice, so a page the cut left behind is
    // reused.
    assert_eq!(
        workload(&mut queue, &mut left, 1000..1040, Shape::Full),
        InFlight::Nothing,
        "cut {at}"
    );
    while !left.is_empty() {
        pop(&mut queue, &mut left).unwrap_or_else(|_| panic!("cut {at}: no power?"));
    }
    assert_eq!(block_on(queue.peek()).expect("peek"), None);
    found
}

/// The steps a workload takes with the power on throughout.
fn steps_of_workload(shape: Shape) -> usize {
    let mut queue = queue(PowerCutFlash::erased());
    let mut acked = VecDeque::new();
    assert_eq!(
        workload(&mut queue, &mut acked, 0..60, shape),
        InFlight::Nothing
    );
    assert!(!acked.is_empty());
    queue.into_flash().steps
}

#[test]
fn a_power_cut_at_any_step_keeps_what_was_acknowledged() {
    for shape in [Shape::Full, Shape::Short] {
        let steps = steps_of_workload(shape);
        // Each workload wraps the four pages several times: the cuts fall
        // in pushes, pops, page closes and page erases.
        assert!(steps > 500, "{steps} steps");
        for seed in 0..3 {
            for step in 0..steps {
                let mut queue = queue(PowerCutFlash::erased().cut_at(step, seed));
                let mut acked = VecDeque::new();
                let cut = workload(&mut queue, &mut acked, 0..60, shape);
                let flash = queue.into_flash();
                assert!(!flash.powered, "the cut at step {step} happened");
                let at = format!("at step {step} ({shape:?}, seed {seed})");
                check_after_restart(flash.bytes, &acked, cut, &at);
            }
        }
    }
}

#[test]
fn a_second_cut_after_the_restart_keeps_what_was_acknowledged() {
    // The power goes, the device restarts and works on (repairing what the
    // cut left), and the power goes again at any step of that.
    let steps = steps_of_workload(Shape::Full);
    let mut second_cuts = 0;
    for step in (0..steps).step_by(5) {
        let mut queue = queue(PowerCutFlash::erased().cut_at(step, 1));
        let mut acked = VecDeque::new();
        let cut = workload(&mut queue, &mut acked, 0..60, Shape::Full);
        let bytes = queue.into_flash().bytes;
        // What the restarted device finds: a function of the bytes.
        let found = check_after_restart(bytes.clone(), &acked, cut, &format!("at step {step}"));
        for second in 0.. {
            let mut queue = self::queue(PowerCutFlash::restart(bytes.clone()).cut_at(second, 2));
            let mut acked: VecDeque<u32> = found.iter().copied().collect();
            // Half the restarts hand on what they find before making more
            // (a sender draining a backlog), half make more first.
            let cut = match step % 2 {
                0 => drain(&mut queue, &mut acked)
                    .err()
                    .unwrap_or_else(|| workload(&mut queue, &mut acked, 2000..2012, Shape::Short)),
                _ => workload(&mut queue, &mut acked, 2000..2012, Shape::Short),
            };
            let flash = queue.into_flash();
            if flash.powered {
                // The second run ended before its step `second`.
                assert_eq!(cut, InFlight::Nothing);
                break;
            }
            second_cuts += 1;
            let at = format!("at step {step}, then at step {second}");
            check_after_restart(flash.bytes, &acked, cut, &at);
        }
    }
    assert!(second_cuts > 1000, "{second_cuts} second cuts");
}

#[test]
fn a_full_queue_refuses_and_writes_nothing() {
    let mut queue = queue(PowerCutFlash::erased());
    let mut pushed = 0u32;
    loop {
        match block_on(queue.push(&[pushed as u8; 60])) {
            Ok(()) => pushed += 1,
            Err(FlashError::Full) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        pushed >= 8,
        "four pages of 256 bytes hold {pushed} records of 60"
    );
    let flash = queue.into_flash();
    let before = flash.bytes.clone();
    let mut queue = self::queue(flash);
    assert_eq!(block_on(queue.push(&[0xAA; 60])), Err(FlashError::Full));
    let flash = queue.into_flash();
    assert_eq!(flash.bytes, before, "a refused push changes nothing");
    // The oldest is still there: it is never evicted.
    let mut queue = self::queue(flash);
    assert_eq!(block_on(queue.peek()).unwrap(), Some(&[0u8; 60][..]));
    assert_eq!(block_on(queue.len()).unwrap(), pushed as usize);
}

#[test]
fn a_record_too_long_or_a_bad_layout_is_refused_by_name() {
    let mut queue = queue(PowerCutFlash::erased());
    assert_eq!(
        block_on(queue.push(&[1; R + 1])),
        Err(FlashError::TooBig { len: R + 1, max: R })
    );
    let made = |range: core::ops::Range<u32>| {
        FlashQueue::<PowerCutFlash, R>::new(PowerCutFlash::erased(), range).err()
    };
    assert_eq!(
        made(1..512),
        Some(FlashError::InvalidRange(LayoutProblem::StartNotAtPage))
    );
    assert_eq!(
        made(0..300),
        Some(FlashError::InvalidRange(LayoutProblem::EndNotAtPage))
    );
    assert_eq!(
        made(0..0),
        Some(FlashError::InvalidRange(LayoutProblem::TooSmall))
    );
    // One page: a cut push's half-written record would count as live and
    // leave the page full for good (found by cutting a one-page queue at
    // every step), so two are needed.
    assert_eq!(
        made(0..256),
        Some(FlashError::InvalidRange(LayoutProblem::TooSmall))
    );
    assert_eq!(
        made(0..2048),
        Some(FlashError::InvalidRange(LayoutProblem::PastCapacity))
    );
    let too_large = FlashQueue::<PowerCutFlash, 512>::new(PowerCutFlash::erased(), 0..1024).err();
    assert_eq!(
        too_large,
        Some(FlashError::InvalidRange(LayoutProblem::RecordSizeTooLarge))
    );
    let too_small = FlashQueue::<PowerCutFlash, 3>::new(PowerCutFlash::erased(), 0..1024).err();
    assert_eq!(
        too_small,
        Some(FlashError::InvalidRange(LayoutProblem::RecordSizeBelowWord))
    );
    // The messages say what is wrong.
    assert_eq!(
        FlashError::<Fault>::InvalidRange(LayoutProblem::EndNotAtPage).to_string(),
        "the flash range cannot hold a queue: its end is not at a page boundary"
    );
    assert_eq!(
        FlashError::<Fault>::TooBig { len: 65, max: 64 }.to_string(),
        "a record of 65 bytes is longer than the queue's 64"
    );
}

#[test]
fn a_record_longer_than_the_buffer_is_reported_not_read() {
    // Written by a build with records of 128 bytes, read by one of 64.
    let mut wide = FlashQueue::<PowerCutFlash, 128>::new(PowerCutFlash::erased(), 0..1024).unwrap();
    block_on(wide.push(&[7; 100])).unwrap();
    let mut narrow = queue(wide.into_flash());
    assert_eq!(
        block_on(narrow.peek()).err(),
        Some(FlashError::RecordTooLong { needed: 100 })
    );
}

type Failed = FailedElement<heapless::Vec<u8, 32>, heapless::String<24>>;
type DeadLetters =
    FlashDeadLetterQueue<PowerCutFlash, heapless::Vec<u8, 32>, heapless::String<24>, R>;

fn failed(id: u8, error: Option<&str>) -> Failed {
    FailedElement::new(
        heapless::Vec::from_slice(&[id; 5]).unwrap(),
        error.map(|e| heapless::String::try_from(e).unwrap()),
        u32::from(id) + 1,
        Instant::from_millis(1_000 + u64::from(id)),
    )
}

#[test]
fn failed_elements_survive_a_restart_oldest_first() {
    let mut dlq = DeadLetters::new(PowerCutFlash::erased(), 0..1024).unwrap();
    block_on(dlq.push(failed(1, Some("timeout")))).unwrap();
    block_on(dlq.add(
        heapless::Vec::from_slice(&[2; 5]).unwrap(),
        None,
        3,
        Instant::from_millis(1_002),
    ))
    .unwrap();
    // guard-core's failure handling sends through the sink.
    DeadLetterSink::send(&mut dlq, failed(3, Some(""))).unwrap();
    let bytes = dlq.into_flash().bytes;
    let mut dlq = DeadLetters::new(PowerCutFlash::restart(bytes), 0..1024).unwrap();
    assert_eq!(block_on(dlq.len()).unwrap(), 3);
    assert_eq!(
        block_on(dlq.poll()).unwrap(),
        Some(failed(1, Some("timeout")))
    );
    let second = block_on(dlq.poll()).unwrap().unwrap();
    assert_eq!(second.error(), None);
    assert_eq!(second.attempts(), 3);
    assert_eq!(second.failed_at(), Instant::from_millis(1_002));
    assert_eq!(block_on(dlq.peek()).unwrap(), Some(failed(3, Some(""))));
    assert!(block_on(dlq.remove_oldest()).unwrap());
    assert_eq!(block_on(dlq.poll()).unwrap(), None);
}

#[test]
fn a_dead_letter_that_cannot_be_stored_is_handed_back() {
    let mut dlq = DeadLetters::new(PowerCutFlash::erased(), 0..1024).unwrap();
    let mut stored = 0;
    let back = loop {
        match block_on(dlq.push(failed(stored, Some("refused by the broker")))) {
            Ok(()) => stored += 1,
            Err(refused) => break refused,
        }
    };
    assert_eq!(back.why, StoreError::Flash(FlashError::Full));
    assert_eq!(back.failed, failed(stored, Some("refused by the broker")));
    // The sink hands it back too.
    let same_size = failed(9, Some("refused by the broker"));
    assert_eq!(
        DeadLetterSink::send(&mut dlq, same_size.clone()),
        Err(same_size)
    );
    // A dead letter larger than a record: refused before any write.
    type Wide = FlashDeadLetterQueue<PowerCutFlash, heapless::Vec<u8, 128>, (), 32>;
    let mut wide = Wide::new(PowerCutFlash::erased(), 0..1024).unwrap();
    let big = FailedElement::new(
        heapless::Vec::from_slice(&[1; 100]).unwrap(),
        None,
        1,
        Instant::ZERO,
    );
    let back = block_on(wide.push(big.clone())).unwrap_err();
    assert_eq!(back.why, StoreError::Record(RecordError::TooLong));
    assert_eq!(back.failed, big);
}

#[test]
fn a_record_that_does_not_decode_is_reported_and_left() {
    let mut queue = queue(PowerCutFlash::erased());
    block_on(queue.push(b"not a failed element")).unwrap();
    let mut dlq = DeadLetters::on(queue);
    assert!(matches!(
        block_on(dlq.poll()),
        Err(StoreError::Record(RecordError::Invalid(_)))
    ));
    // Still there for whoever looks; removed only when asked.
    assert_eq!(block_on(dlq.len()).unwrap(), 1);
    assert!(block_on(dlq.remove_oldest()).unwrap());
    assert!(block_on(dlq.is_empty()).unwrap());
}

mod records {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_failed_element_reads_back_as_written(
            element in proptest::collection::vec(any::<u8>(), 0..32),
            error in proptest::option::of("[a-z ]{0,24}"),
            attempts in any::<u32>(),
            nanos in any::<u64>(),
        ) {
            let failed: Failed = FailedElement::new(
                heapless::Vec::from_slice(&element).unwrap(),
                error.as_deref().map(|e| heapless::String::try_from(e).unwrap()),
                attempts,
                Instant::from_nanos(nanos),
            );
            let mut buf = [0u8; 96];
            let len = failed.encode(&mut buf).unwrap();
            prop_assert_eq!(Failed::decode(&buf[..len]).unwrap(), failed.clone());
            // Any shorter buffer: refused, never written past.
            for short in 0..len {
                prop_assert_eq!(failed.encode(&mut buf[..short]), Err(RecordError::TooLong));
            }
            // Any cut of the record: refused, never a made-up value.
            for cut in 0..len {
                prop_assert!(Failed::decode(&buf[..cut]).is_err());
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_decode_only_to_a_value_that_encodes_back(
            bytes in proptest::collection::vec(any::<u8>(), 0..80),
        ) {
            if let Ok(failed) = Failed::decode(&bytes) {
                let mut buf = [0u8; 96];
                let len = failed.encode(&mut buf).unwrap();
                prop_assert_eq!(&buf[..len], &bytes[..]);
            }
        }
    }
}
