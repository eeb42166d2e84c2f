//! Throughput of the streamer's work queue (`smoe`'s Vyukov queue) against
//! `crossbeam_queue::ArrayQueue`, in the same run and on the same machine.
//!
//! Run with `cargo bench --bench queue`. Two workloads:
//! - `push_pop_pair`: one thread, one push then one pop per iteration (the
//!   uncontended cost of an enqueue/dequeue).
//! - `transfer_2p2c`: two producers push `ITEMS` unique items between them,
//!   two consumers pop until all have arrived; throughput is items per second.
//!   A thread that finds the queue full (empty) yields rather than spins, so
//!   the figure stays meaningful on machines with fewer than four cores.

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use crossbeam_queue::ArrayQueue;
use smoe::internals::Queue;

/// The queue size the streamer uses for a 64-slot ring (`4 × slots`).
const CAPACITY: usize = 256;
/// Items moved per `transfer_2p2c` iteration.
const ITEMS: usize = 200_000;

/// The two operations the benchmarks need, so both queues run the same code.
trait WorkQueue: Sync {
    fn with_capacity(capacity: usize) -> Self;
    fn push(&self, item: u32) -> Result<(), u32>;
    fn pop(&self) -> Option<u32>;
}

impl WorkQueue for Queue<u32> {
    fn with_capacity(capacity: usize) -> Self {
        Queue::with_capacity(capacity)
    }
    fn push(&self, item: u32) -> Result<(), u32> {
        Queue::push(self, item)
    }
    fn pop(&self) -> Option<u32> {
        Queue::pop(self)
    }
}

impl WorkQueue for ArrayQueue<u32> {
    fn with_capacity(capacity: usize) -> Self {
        ArrayQueue::new(capacity)
    }
    fn push(&self, item: u32) -> Result<(), u32> {
        ArrayQueue::push(self, item)
    }
    fn pop(&self) -> Option<u32> {
        ArrayQueue::pop(self)
    }
}

/// Moves `ITEMS` items from two producers to two consumers; returns the
/// elapsed time of the transfer (thread start-up included, set-up excluded).
fn transfer<Q: WorkQueue>() -> Duration {
    let queue = Q::with_capacity(CAPACITY);
    let received = AtomicUsize::new(0);
    let start = Instant::now();
    thread::scope(|scope| {
        for producer in 0..2 {
            let queue = &queue;
            scope.spawn(move || {
                for index in 0..ITEMS / 2 {
                    let mut item = (producer * ITEMS / 2 + index) as u32;
                    while let Err(rejected) = queue.push(item) {
                        item = rejected;
                        thread::yield_now();
                    }
                }
            });
        }
        for _ in 0..2 {
            let (queue, received) = (&queue, &received);
            scope.spawn(move || {
                while received.load(Ordering::Relaxed) < ITEMS {
                    match queue.pop() {
                        Some(item) => {
                            black_box(item);
                            received.fetch_add(1, Ordering::Relaxed);
                        }
                        None => thread::yield_now(),
                    }
                }
            });
        }
    });
    start.elapsed()
}

fn bench_push_pop_pair(c: &mut Criterion) {
    let mut group = c.benchmark_group("push_pop_pair");
    group.throughput(Throughput::Elements(1));
    let ours = <Queue<u32> as WorkQueue>::with_capacity(CAPACITY);
    let theirs = <ArrayQueue<u32> as WorkQueue>::with_capacity(CAPACITY);
    group.bench_function("smoe::Queue", |b| {
        b.iter(|| {
            let _ = ours.push(black_box(1));
            black_box(ours.pop())
        })
    });
    group.bench_function("crossbeam ArrayQueue", |b| {
        b.iter(|| {
            let _ = theirs.push(black_box(1));
            black_box(theirs.pop())
        })
    });
    group.finish();
}

fn bench_transfer(c: &mut Criterion) {
    let mut group = c.benchmark_group("transfer_2p2c");
    group.throughput(Throughput::Elements(ITEMS as u64));
    group.sample_size(20);
    group.bench_function("smoe::Queue", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| transfer::<Queue<u32>>()).sum())
    });
    group.bench_function("crossbeam ArrayQueue", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| transfer::<ArrayQueue<u32>>()).sum())
    });
    group.finish();
}

criterion_group!(benches, bench_push_pop_pair, bench_transfer);
criterion_main!(benches);
