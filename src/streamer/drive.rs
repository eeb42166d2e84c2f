//! The drive's clock: how long the engine was busy (between
//! `prewarm_pause(true)` and `prewarm_pause(false)`, which an engine calls
//! around a forward pass), and how much of that time no read was in
//! progress. A drive that sits idle while the engine computes is time a
//! read ahead could have used (docs/c-api.md, "Statistics").
//!
//! A mutex, taken when a read begins or ends and when the engine says it is
//! busy or idle: never on the prefetch, claim or release path.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
struct State {
    /// Reads in progress (a worker between taking a job and finishing it).
    reading: u32,
    /// Since when the engine is busy, while it is.
    busy_since: Option<Instant>,
    /// Since when the drive is idle during a busy time, while it is.
    idle_since: Option<Instant>,
    busy: Duration,
    idle: Duration,
}

impl State {
    /// Opens or closes the idle interval as the state now says.
    fn update(&mut self, now: Instant) {
        let idle_now = self.busy_since.is_some() && self.reading == 0;
        match (idle_now, self.idle_since) {
            (true, None) => self.idle_since = Some(now),
            (false, Some(since)) => {
                self.idle += now.saturating_duration_since(since);
                self.idle_since = None;
            }
            _ => {}
        }
    }
}

/// See the module doc.
#[derive(Debug, Default)]
pub(crate) struct DriveClock {
    state: Mutex<State>,
}

/// Busy time and the drive's idle time within it, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DriveTimes {
    pub(crate) busy_ns: u64,
    pub(crate) idle_ns: u64,
}

impl DriveClock {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics while holding it; a poisoned state is still right.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A worker began a read.
    pub(crate) fn read_began(&self) {
        let mut s = self.state();
        s.reading += 1;
        s.update(Instant::now());
    }

    /// A worker finished a read (ok or failed).
    pub(crate) fn read_ended(&self) {
        let mut s = self.state();
        s.reading = s.reading.saturating_sub(1);
        s.update(Instant::now());
    }

    /// The engine is busy (`true`) or idle.
    pub(crate) fn set_busy(&self, busy: bool) {
        let now = Instant::now();
        let mut s = self.state();
        match (busy, s.busy_since) {
            (true, None) => s.busy_since = Some(now),
            (false, Some(since)) => {
                s.busy += now.saturating_duration_since(since);
                s.busy_since = None;
            }
            _ => {}
        }
        s.update(now);
    }

    /// The times so far, open intervals counted up to now.
    pub(crate) fn times(&self) -> DriveTimes {
        let now = Instant::now();
        let s = self.state();
        let open = |since: Option<Instant>| {
            since.map_or(Duration::ZERO, |t| now.saturating_duration_since(t))
        };
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        DriveTimes {
            busy_ns: ns(s.busy + open(s.busy_since)),
            idle_ns: ns(s.idle + open(s.idle_since)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread::sleep;

    /// Idle counts only while busy with no read in progress.
    #[test]
    fn idle_is_busy_time_without_a_read() {
        let c = DriveClock::default();
        c.read_began();
        sleep(Duration::from_millis(20)); // not busy: nothing counts
        c.set_busy(true);
        sleep(Duration::from_millis(20)); // busy, reading
        c.read_ended();
        sleep(Duration::from_millis(30)); // busy, idle
        c.read_began();
        sleep(Duration::from_millis(20)); // busy, reading
        c.read_ended();
        c.set_busy(false);
        sleep(Duration::from_millis(20)); // neither
        let t = c.times();
        // Sleeps only ever overshoot: lower bounds, and the reading time
        // (40 ms at least) between the two.
        assert!(t.busy_ns >= 70_000_000, "{t:?}");
        assert!(t.idle_ns >= 30_000_000, "{t:?}");
        assert!(t.busy_ns - t.idle_ns >= 40_000_000, "{t:?}");
        // A busy time still open counts up to now.
        c.set_busy(true);
        sleep(Duration::from_millis(10));
        let later = c.times();
        assert!(later.idle_ns >= t.idle_ns + 10_000_000, "{later:?}");
    }
}
