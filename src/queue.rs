//! A bounded lock-free multi-producer multi-consumer queue: the streamer's
//! demand and speculative queues of work items (slot indices, dense expert ids).
//!
//! The algorithm is Dmitry Vyukov's "Bounded MPMC queue"
//! (<https://www.1024cores.net/home/lock-free-algorithms/queues/bounded-mpmc-queue>),
//! the same one behind crossbeam's `ArrayQueue`. A ring of `capacity` cells
//! (a power of two) each carries a sequence number; producers race on `tail`,
//! consumers on `head`, and the cell's sequence, not the counters, says
//! whether the cell may be written or read. One change from the original:
//! Vyukov's sequence is `p` for "free, awaiting the push at position `p`" and
//! `p + 1` for "full, awaiting the pop at `p`"; with one cell those two states
//! collide (full at `p` equals free at `p + 1`), so he requires capacity ≥ 2.
//! We store `2p` and `2p + 1` instead, which keeps capacity 1 exact.
//!
//! This module owns the cells and the items in them: an item pushed is owned
//! by the queue until exactly one `pop` returns it, and the queue drops
//! whatever is left when it is dropped. It must never allocate after
//! [`Queue::with_capacity`], never block or sleep (waking idle workers is the
//! streamer's job, not the queue's), and never wait for another thread:
//! `push` and `pop` either finish or report full / empty.
//!
//! Because nothing waits, "full" and "empty" are what the next cell says, not
//! what the counters say: `pop` returns `None` while the push that claimed the
//! next position is still writing its item, even if a later push has already
//! finished; `push` returns `Err` while the pop that claimed the cell it needs
//! is still reading. A caller that must not lose work therefore pairs every
//! push with a wake-up of the consumers (after the push returns), so the
//! consumer that saw `None` is woken once the slow push lands.

use std::fmt;
use std::mem::MaybeUninit;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicUsize, Backoff, Ordering, UnsafeCell};

/// One ring cell: a sequence number saying whose turn it is, and the item.
struct Cell<T> {
    /// `2p` while the cell is free and waits for the push at position `p`;
    /// `2p + 1` while it holds the item pushed at `p` and waits for the pop
    /// at `p`. Only the thread that won position `p` on `tail` (resp. `head`)
    /// advances it, from `2p` to `2p + 1` (resp. from `2p + 1` to
    /// `2(p + capacity)`), so it only grows (modulo wrapping).
    sequence: AtomicUsize,
    /// Initialised exactly while `sequence` is odd (`2p + 1`). Written only by
    /// the pusher that won position `p`, read (moved out) only by the popper
    /// that won it; the sequence's release/acquire pairs order the two.
    value: UnsafeCell<MaybeUninit<T>>,
}

/// A bounded lock-free MPMC FIFO queue (Vyukov's algorithm).
///
/// `push` and `pop` take `&self`, never allocate and never wait; share the
/// queue between threads with an `Arc` or a borrow.
pub struct Queue<T> {
    /// The next position a pop will take. Advanced only by a pop's successful
    /// CAS, after the cell at that position was seen full, so
    /// `head <= tail <= head + capacity` (as unwrapped positions).
    head: CachePadded<AtomicUsize>,
    /// The next position a push will take. Advanced only by a push's
    /// successful CAS, after the cell at that position was seen free.
    tail: CachePadded<AtomicUsize>,
    /// The ring; position `p` lives in `cells[p & mask]`. Its length is the
    /// capacity, a power of two, fixed at construction.
    cells: Box<[Cell<T>]>,
    /// `cells.len() - 1`.
    mask: usize,
}

// SAFETY: the queue hands each item from the one pushing thread to the one
// popping thread (that is why `T: Send` is required) and every access to a
// cell's value is ordered by that cell's sequence (see `push` and `pop`), so
// sharing `&Queue<T>` between threads gives no thread shared access to a `T`.
unsafe impl<T: Send> Sync for Queue<T> {}

impl<T> Queue<T> {
    /// An empty queue that holds `capacity` items, rounded up to a power of
    /// two. All memory is allocated here; `push` and `pop` never allocate.
    ///
    /// # Panics
    ///
    /// If `capacity` is 0, or so large that its power of two does not fit the
    /// position arithmetic (more than `usize::MAX / 4` items).
    pub fn with_capacity(capacity: usize) -> Self {
        Self::starting_at(capacity, 0)
    }

    /// An empty queue whose first push and pop use position `start`; tests
    /// use it to cross the `usize` wraparound of the positions.
    fn starting_at(capacity: usize, start: usize) -> Self {
        assert!(capacity >= 1, "queue capacity must be at least 1");
        let capacity = capacity
            .checked_next_power_of_two()
            .filter(|&rounded| rounded <= usize::MAX / 4)
            .expect("queue capacity too large");
        let mask = capacity - 1;
        // Cell `index` starts free for the one position in
        // `start..start + capacity` that maps to it.
        let cells = (0..capacity)
            .map(|index| {
                let position = start.wrapping_add(index.wrapping_sub(start) & mask);
                Cell {
                    sequence: AtomicUsize::new(position.wrapping_mul(2)),
                    value: UnsafeCell::new(MaybeUninit::uninit()),
                }
            })
            .collect();
        Queue {
            head: CachePadded::new(AtomicUsize::new(start)),
            tail: CachePadded::new(AtomicUsize::new(start)),
            cells,
            mask,
        }
    }

    /// The cell of `position`.
    #[inline]
    fn cell(&self, position: usize) -> &Cell<T> {
        // SAFETY: `mask` is `cells.len() - 1` and the length a power of two,
        // so `position & mask` is always in bounds.
        unsafe { self.cells.get_unchecked(position & self.mask) }
    }

    /// How many items the queue holds when full (a power of two).
    pub fn capacity(&self) -> usize {
        self.cells.len()
    }

    /// Appends `item`, or gives it back as `Err(item)` if the queue is full
    /// (including while the pop that frees the needed cell is still running).
    pub fn push(&self, item: T) -> Result<(), T> {
        // After losing a race on `tail`, spin a little (1, 2, 4, … 64 spins)
        // before retrying, so contending threads stop invalidating each
        // other's cache line on every attempt; never sleeps or yields.
        let backoff = Backoff::new();
        let mut position = self.tail.load(Ordering::Relaxed);
        loop {
            let cell = self.cell(position);
            // Acquire: pairs with the Release in `pop` that freed this cell,
            // so that pop's read of the previous item happens before our write.
            let sequence = cell.sequence.load(Ordering::Acquire);
            let lag = sequence.wrapping_sub(position.wrapping_mul(2)) as isize;
            if lag == 0 {
                // The cell is free for `position`; claim the position.
                match self.tail.compare_exchange_weak(
                    position,
                    position.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        cell.value.with_mut(|value| {
                            // SAFETY: winning the CAS on `tail` for `position`
                            // while the sequence is `2 * position` makes this
                            // thread the only one touching the value until it
                            // stores `2 * position + 1` below; the previous
                            // item was moved out before that sequence was
                            // stored (acquired above), so nothing is
                            // overwritten that still needs dropping.
                            unsafe { value.write(MaybeUninit::new(item)) };
                        });
                        // Release: publishes the item written above to the pop
                        // that acquires this sequence.
                        cell.sequence
                            .store(position.wrapping_mul(2).wrapping_add(1), Ordering::Release);
                        return Ok(());
                    }
                    Err(current) => {
                        backoff.spin();
                        position = current;
                    }
                }
            } else if lag < 0 {
                // The cell still holds the item from `position - capacity`.
                return Err(item);
            } else {
                // Another push took `position`; catch up with `tail`.
                position = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Removes the oldest item, or returns `None` if the queue is empty
    /// (including while the push of the next item is still running).
    pub fn pop(&self) -> Option<T> {
        // As in `push`, on `head`.
        let backoff = Backoff::new();
        let mut position = self.head.load(Ordering::Relaxed);
        loop {
            let cell = self.cell(position);
            // Acquire: pairs with the Release in `push` that filled this cell,
            // so the item's write happens before our read.
            let sequence = cell.sequence.load(Ordering::Acquire);
            let lag = sequence.wrapping_sub(position.wrapping_mul(2).wrapping_add(1)) as isize;
            if lag == 0 {
                // The cell holds the item pushed at `position`; claim it.
                match self.head.compare_exchange_weak(
                    position,
                    position.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        let item = cell.value.with(|value| {
                            // SAFETY: the sequence `2 * position + 1`, acquired
                            // above, says the value was initialised by the push
                            // at `position`; winning the CAS on `head` makes this
                            // thread the only one to move it out, and no push
                            // writes the cell until we store the next sequence.
                            unsafe { value.read().assume_init() }
                        });
                        // Release: publishes that our read of the item is done,
                        // so the push at `position + capacity` may overwrite it.
                        cell.sequence.store(
                            position.wrapping_add(self.cells.len()).wrapping_mul(2),
                            Ordering::Release,
                        );
                        return Some(item);
                    }
                    Err(current) => {
                        backoff.spin();
                        position = current;
                    }
                }
            } else if lag < 0 {
                // The cell waits for the push at `position`: empty.
                return None;
            } else {
                // Another pop took `position`; catch up with `head`.
                position = self.head.load(Ordering::Relaxed);
            }
        }
    }

    /// How many items the queue holds, as of some recent moment: exact when
    /// no push or pop is running, an estimate in `0..=capacity` otherwise.
    ///
    /// The loads are Relaxed: a thread that must see another thread's push
    /// here (say, before deciding to sleep) pairs a SeqCst fence after the
    /// push with one before this call, as the streamer's park/wake does.
    pub fn len(&self) -> usize {
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Relaxed);
        // The two loads are not one snapshot: `head` may have passed the
        // `tail` we read, or `tail` run ahead of the `head` we read.
        (tail.wrapping_sub(head) as isize).clamp(0, self.cells.len() as isize) as usize
    }

    /// Whether the queue holds no items, as of some recent moment (see
    /// [`len`](Self::len)).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> Drop for Queue<T> {
    fn drop(&mut self) {
        // `&mut self`: no push or pop is running, so every position in
        // `head..tail` holds an item and `pop` moves each out exactly once.
        if std::mem::needs_drop::<T>() {
            while self.pop().is_some() {}
        }
    }
}

impl<T> fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("capacity", &self.capacity())
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::Queue;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::thread;

    #[test]
    fn single_thread_fifo() {
        let queue = Queue::with_capacity(8);
        for value in 0..8u32 {
            assert_eq!(queue.push(value), Ok(()));
        }
        assert_eq!(queue.push(8), Err(8));
        for value in 0..8u32 {
            assert_eq!(queue.pop(), Some(value));
        }
        assert_eq!(queue.pop(), None);
    }

    #[test]
    fn capacity_rounds_up_to_a_power_of_two() {
        assert_eq!(Queue::<u32>::with_capacity(1).capacity(), 1);
        assert_eq!(Queue::<u32>::with_capacity(2).capacity(), 2);
        assert_eq!(Queue::<u32>::with_capacity(5).capacity(), 8);
        assert_eq!(Queue::<u32>::with_capacity(1024).capacity(), 1024);
        let queue = Queue::with_capacity(5);
        for value in 0..8u32 {
            assert_eq!(queue.push(value), Ok(()));
        }
        assert_eq!(queue.push(8), Err(8));
    }

    #[test]
    #[should_panic(expected = "at least 1")]
    fn zero_capacity_panics() {
        let _ = Queue::<u32>::with_capacity(0);
    }

    #[test]
    fn full_and_empty() {
        let queue = Queue::with_capacity(4);
        assert!(queue.is_empty());
        assert_eq!(queue.len(), 0);
        assert_eq!(queue.pop(), None);
        for value in 0..4u32 {
            assert_eq!(queue.len(), value as usize);
            queue.push(value).unwrap();
        }
        assert_eq!(queue.len(), 4);
        assert!(!queue.is_empty());
        assert_eq!(queue.push(4), Err(4));
        assert_eq!(queue.push(5), Err(5));
        assert_eq!(queue.pop(), Some(0));
        assert_eq!(queue.len(), 3);
        assert_eq!(queue.push(4), Ok(()));
        assert_eq!(queue.push(5), Err(5));
        for value in 1..5u32 {
            assert_eq!(queue.pop(), Some(value));
        }
        assert_eq!(queue.pop(), None);
        assert_eq!(queue.pop(), None);
        assert!(queue.is_empty());
    }

    #[test]
    fn capacity_one_alternates_full_and_empty() {
        let queue = Queue::with_capacity(1);
        for value in 0..100u32 {
            assert_eq!(queue.pop(), None);
            assert_eq!(queue.push(value), Ok(()));
            assert_eq!(queue.push(value + 1), Err(value + 1));
            assert_eq!(queue.len(), 1);
            assert_eq!(queue.pop(), Some(value));
        }
    }

    /// Pushes and pops in bursts of every length up to the capacity, so the
    /// positions lap the ring many times at every offset.
    fn wrap_around(queue: &Queue<u64>, rounds: u64) {
        let capacity = queue.capacity() as u64;
        let mut next_in = 0u64;
        let mut next_out = 0u64;
        for round in 0..rounds {
            let burst = round % capacity + 1;
            for _ in 0..burst {
                assert_eq!(queue.push(next_in), Ok(()));
                next_in += 1;
            }
            assert_eq!(queue.len() as u64, burst);
            for _ in 0..burst {
                assert_eq!(queue.pop(), Some(next_out));
                next_out += 1;
            }
            assert_eq!(queue.pop(), None);
        }
    }

    #[test]
    fn wraps_around_many_times() {
        let rounds = if cfg!(miri) { 50 } else { 10_000 };
        for capacity in [1, 2, 4, 8] {
            wrap_around(&Queue::with_capacity(capacity), rounds);
        }
    }

    #[test]
    fn positions_wrap_past_usize_max() {
        for capacity in [1, 2, 4, 8] {
            let queue = Queue::starting_at(capacity, usize::MAX - 20);
            wrap_around(&queue, 64);
            // Full still reads as full across the wrap.
            let start = usize::MAX - 1;
            let queue = Queue::starting_at(capacity, start);
            for value in 0..capacity as u64 {
                queue.push(value).unwrap();
            }
            assert_eq!(queue.push(99), Err(99));
            assert_eq!(queue.len(), capacity);
            assert_eq!(queue.pop(), Some(0));
        }
    }

    /// Counts its drops in a shared counter.
    struct DropCounter(Arc<AtomicUsize>);

    impl Drop for DropCounter {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn drops_every_item_exactly_once() {
        let drops = Arc::new(AtomicUsize::new(0));
        let queue = Queue::with_capacity(8);
        // Lap the ring once so the items left at the end straddle the wrap.
        for _ in 0..6 {
            assert!(queue.push(DropCounter(drops.clone())).is_ok());
            drop(queue.pop().unwrap());
        }
        assert_eq!(drops.load(Ordering::Relaxed), 6);
        for _ in 0..8 {
            assert!(queue.push(DropCounter(drops.clone())).is_ok());
        }
        // A rejected item comes back to the caller, who drops it.
        let rejected = queue.push(DropCounter(drops.clone()));
        assert!(rejected.is_err());
        drop(rejected);
        assert_eq!(drops.load(Ordering::Relaxed), 7);
        drop(queue.pop().unwrap());
        drop(queue.pop().unwrap());
        assert_eq!(drops.load(Ordering::Relaxed), 9);
        // Six items are still queued; dropping the queue drops each once.
        drop(queue);
        assert_eq!(drops.load(Ordering::Relaxed), 15);
        assert_eq!(Arc::strong_count(&drops), 1);
    }

    #[test]
    fn many_producers_many_consumers_each_item_once() {
        const PRODUCERS: usize = 4;
        const CONSUMERS: usize = 4;
        let per_producer: usize = if cfg!(miri) { 60 } else { 100_000 };
        let total = PRODUCERS * per_producer;
        // A small ring so producers see it full and consumers see it empty.
        let queue = Arc::new(Queue::<u32>::with_capacity(16));
        let popped = Arc::new(AtomicUsize::new(0));
        let seen: Arc<Vec<AtomicBool>> =
            Arc::new((0..total).map(|_| AtomicBool::new(false)).collect());

        let producers: Vec<_> = (0..PRODUCERS)
            .map(|producer| {
                let queue = queue.clone();
                thread::spawn(move || {
                    for index in 0..per_producer {
                        let mut item = (producer * per_producer + index) as u32;
                        while let Err(rejected) = queue.push(item) {
                            item = rejected;
                            thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let consumers: Vec<_> = (0..CONSUMERS)
            .map(|_| {
                let (queue, popped, seen) = (queue.clone(), popped.clone(), seen.clone());
                thread::spawn(move || {
                    // The last item this consumer took from each producer: one
                    // consumer must see each producer's items in push order.
                    let mut last_index = [None::<usize>; PRODUCERS];
                    while popped.load(Ordering::Relaxed) < total {
                        let Some(item) = queue.pop() else {
                            thread::yield_now();
                            continue;
                        };
                        let item = item as usize;
                        assert!(
                            !seen[item].swap(true, Ordering::Relaxed),
                            "item {item} popped twice"
                        );
                        let (producer, index) = (item / per_producer, item % per_producer);
                        assert!(
                            last_index[producer] < Some(index),
                            "producer {producer}'s items out of order"
                        );
                        last_index[producer] = Some(index);
                        popped.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for handle in producers.into_iter().chain(consumers) {
            handle.join().unwrap();
        }
        assert_eq!(popped.load(Ordering::Relaxed), total);
        assert!(seen.iter().all(|flag| flag.load(Ordering::Relaxed)));
        assert_eq!(queue.pop(), None);
    }
}

/// Model checks: `RUSTFLAGS="--cfg loom" cargo test --release --lib queue::loom`.
///
/// Every racing operation runs in a spawned thread and the model's main
/// thread only sets up, joins and checks: an operation on the main thread
/// right after `spawn` is not always reordered against the spawned thread's,
/// so a race written that way can go unexplored.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::Queue;
    use crate::sync::{thread, Arc};

    /// Runs `operation` on `queue` in a new model thread.
    fn spawn<T: Send + 'static, R: Send + 'static>(
        queue: &Arc<Queue<T>>,
        operation: impl FnOnce(&Queue<T>) -> R + Send + 'static,
    ) -> thread::JoinHandle<R> {
        let queue = queue.clone();
        thread::spawn(move || operation(&queue))
    }

    /// Drains the queue, in order.
    fn drain(queue: &Queue<u32>) -> Vec<u32> {
        std::iter::from_fn(|| queue.pop()).collect()
    }

    #[test]
    fn concurrent_pushes_both_land() {
        loom::model(|| {
            let queue = Arc::new(Queue::with_capacity(2));
            let first = spawn(&queue, |queue| queue.push(1));
            let second = spawn(&queue, |queue| queue.push(2));
            assert_eq!(first.join().unwrap(), Ok(()));
            assert_eq!(second.join().unwrap(), Ok(()));
            let mut items = drain(&queue);
            items.sort_unstable();
            assert_eq!(items, [1, 2]);
        });
    }

    #[test]
    fn push_races_pop_on_empty_queue() {
        loom::model(|| {
            let queue = Arc::new(Queue::with_capacity(2));
            let pusher = spawn(&queue, |queue| queue.push(7));
            let popper = spawn(&queue, |queue| queue.pop());
            assert_eq!(pusher.join().unwrap(), Ok(()));
            match popper.join().unwrap() {
                Some(item) => {
                    assert_eq!(item, 7);
                    assert_eq!(queue.pop(), None);
                }
                None => assert_eq!(drain(&queue), [7]),
            }
        });
    }

    #[test]
    fn push_races_pop_on_full_queue() {
        loom::model(|| {
            let queue = Arc::new(Queue::with_capacity(1));
            queue.push(1).unwrap();
            let pusher = spawn(&queue, |queue| queue.push(2));
            let popper = spawn(&queue, |queue| queue.pop());
            // The item was pushed before the race, so the pop must find it.
            assert_eq!(popper.join().unwrap(), Some(1));
            match pusher.join().unwrap() {
                Ok(()) => assert_eq!(drain(&queue), [2]),
                Err(rejected) => {
                    assert_eq!(rejected, 2);
                    assert_eq!(queue.pop(), None);
                }
            }
        });
    }

    #[test]
    fn concurrent_pops_take_each_item_once() {
        loom::model(|| {
            let queue = Arc::new(Queue::with_capacity(2));
            queue.push(1).unwrap();
            queue.push(2).unwrap();
            let first = spawn(&queue, |queue| queue.pop());
            let second = spawn(&queue, |queue| queue.pop());
            let mut items = [
                first.join().unwrap().unwrap(),
                second.join().unwrap().unwrap(),
            ];
            items.sort_unstable();
            assert_eq!(items, [1, 2]);
            assert_eq!(queue.pop(), None);
        });
    }

    #[test]
    fn two_producers_one_consumer_on_a_one_item_ring() {
        loom::model(|| {
            let queue = Arc::new(Queue::with_capacity(1));
            let producers = [10, 20]
                .map(|item| spawn(&queue, move |queue| queue.push(item).ok().map(|()| item)));
            let consumer = spawn(&queue, |queue| queue.pop());
            let mut pushed: Vec<u32> = producers
                .into_iter()
                .filter_map(|handle| handle.join().unwrap())
                .collect();
            let mut popped: Vec<u32> = consumer.join().unwrap().into_iter().collect();
            popped.extend(drain(&queue));
            pushed.sort_unstable();
            popped.sort_unstable();
            assert!(
                !pushed.is_empty(),
                "one of two pushes into an empty ring must land"
            );
            assert_eq!(popped, pushed);
        });
    }

    #[test]
    fn dropping_the_queue_drops_queued_items() {
        loom::model(|| {
            let item = Arc::new(5u32);
            let queue = Arc::new(Queue::with_capacity(2));
            let shared = item.clone();
            let pusher = spawn(&queue, move |queue| queue.push(shared).is_ok());
            assert!(pusher.join().unwrap());
            assert_eq!(Arc::strong_count(&item), 2);
            drop(queue);
            assert_eq!(Arc::strong_count(&item), 1);
        });
    }
}
