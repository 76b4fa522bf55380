//! The self-tuning cap of [`RequestSlots`](super::RequestSlots): it grows while the API
//! server's latency stays flat under a full cap and shrinks when latency rises or the server
//! throttles, so no hand-set number is needed.
//!
//! The rule (additive increase, multiplicative decrease on throttling, as TCP's congestion
//! control; the latency signal as in delay-based congestion control):
//!
//! - each answered request is one sample; a window of samples is judged by the mean latency
//!   of each class (reads: GET, usually served from the API server's watch cache; writes:
//!   every other verb, which go to storage) divided by that class's *baseline*, weighted by
//!   the class's samples, so a mix of cheap reads and costly writes is not read as
//!   congestion;
//! - a class's baseline is the lowest mean latency of its samples over a window (of at least
//!   [`CLASS_SAMPLES`] of them), not the lowest single latency: requests of one class differ
//!   in cost (a namespace, a quota, a status), and their fastest answer is an outlier a whole
//!   window never reaches, so a cap judged against it would read the server's own service
//!   time as queueing and never grow. The baseline only falls, with one exception: a window
//!   at the lowest cap whose latency is still high becomes the baseline (the server became
//!   slower for good: with the fewest requests of ours in flight, none of its latency is our
//!   queueing). A baseline that followed recent latency under load would drift up with the
//!   queue the cap itself builds, and walk the cap up without end;
//! - samples are judged in windows of at least [`WINDOW`] samples and twice the cap;
//! - a window with a throttled answer (429, or 503 from an overloaded server) cuts the cap
//!   to ¾ of it;
//! - a window whose mean latency ratio exceeds [`SHRINK_ABOVE`] (requests queue at the
//!   server) lowers the cap by one eighth of it, at least 1;
//! - a window in which the cap was reached (a request had to wait for a slot) and whose mean
//!   ratio stayed below [`GROW_BELOW`] raises it by 1: more concurrency still costs no
//!   latency. A cap that is not reached is not raised: an idle controller does not walk its
//!   cap up to the maximum and then meet a flood with it;
//! - the cap stays within [`AdaptiveLimit::min`] and [`AdaptiveLimit::max`].

use std::time::Duration;

/// The fewest samples a window judges.
pub const WINDOW: u32 = 16;
/// The fewest samples of a class whose mean in a window may set the class's baseline.
pub const CLASS_SAMPLES: u32 = 8;
/// Mean latency ÷ baseline below which a saturated cap grows.
pub const GROW_BELOW: f64 = 1.5;
/// Mean latency ÷ baseline above which the cap shrinks.
pub const SHRINK_ABOVE: f64 = 2.0;

/// Bounds and start of a self-tuning cap ([`RequestSlots::adaptive`](super::RequestSlots::adaptive)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveLimit {
    /// The cap to start with.
    pub initial: usize,
    /// The lowest cap (at least 1).
    pub min: usize,
    /// The highest cap.
    pub max: usize,
}

impl Default for AdaptiveLimit {
    /// Start at 4, between 1 and 64.
    fn default() -> Self {
        Self {
            initial: 4,
            min: 1,
            max: 64,
        }
    }
}

/// The class a request's latency is compared within.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// GET: usually served from the API server's watch cache.
    Read,
    /// Every other verb: goes to storage.
    Write,
}

impl Class {
    /// The class of a request of `method`.
    pub fn of(method: &http::Method) -> Self {
        if method == http::Method::GET {
            Self::Read
        } else {
            Self::Write
        }
    }
}

/// The samples of one class in the current window, and its lowest window mean so far.
#[derive(Debug, Default)]
struct Baseline {
    lowest: Option<Duration>,
    sum: Duration,
    count: u32,
}

impl Baseline {
    fn observe(&mut self, latency: Duration) {
        self.sum += latency;
        self.count += 1;
    }

    /// The window's mean latency, when it has enough samples to set the baseline by.
    fn window_mean(&self) -> Option<Duration> {
        (self.count >= CLASS_SAMPLES).then(|| self.sum / self.count)
    }

    /// The window's samples and the sum of their latency ratios (as many times the mean's
    /// ratio to the baseline, the window's own mean counting as a lower one); `None` without
    /// samples. Samples of a class with no baseline yet count as flat.
    fn judge(&self) -> Option<(u32, f64)> {
        if self.count == 0 {
            return None;
        }
        let mean = self.sum / self.count;
        let base = match (self.lowest, self.window_mean()) {
            (Some(lowest), Some(window)) => lowest.min(window),
            (Some(lowest), None) => lowest,
            (None, _) => mean,
        }
        .max(Duration::from_micros(50));
        let ratio = mean.as_secs_f64() / base.as_secs_f64();
        Some((self.count, ratio * f64::from(self.count)))
    }

    /// Ends a window: its mean lowers the baseline (with `rebase`, becomes it), when it has
    /// enough samples.
    fn end_window(&mut self, rebase: bool) {
        if let Some(mean) = self.window_mean() {
            self.lowest = Some(match self.lowest {
                Some(lowest) if !rebase => lowest.min(mean),
                _ => mean,
            });
        }
        self.sum = Duration::ZERO;
        self.count = 0;
    }
}

/// The tuning state of one self-tuning cap.
#[derive(Debug)]
pub struct Tuner {
    bounds: AdaptiveLimit,
    reads: Baseline,
    writes: Baseline,
    /// Samples in this window.
    samples: u32,
    throttled: bool,
    saturated: bool,
}

impl Tuner {
    /// A tuner within `bounds`; returns it with the cap to start with.
    pub fn new(bounds: AdaptiveLimit) -> (Self, usize) {
        let min = bounds.min.max(1);
        let bounds = AdaptiveLimit {
            min,
            max: bounds.max.max(min),
            initial: bounds.initial.clamp(min, bounds.max.max(min)),
        };
        let tuner = Self {
            bounds,
            reads: Baseline::default(),
            writes: Baseline::default(),
            samples: 0,
            throttled: false,
            saturated: false,
        };
        (tuner, bounds.initial)
    }

    /// A request found every slot taken: the cap is what limits now.
    pub fn saturated(&mut self) {
        self.saturated = true;
    }

    /// One answered request; returns the new cap when this sample ends a window that
    /// changes it.
    pub fn observe(
        &mut self,
        class: Class,
        latency: Duration,
        throttled: bool,
        cap: usize,
    ) -> Option<usize> {
        let baseline = match class {
            Class::Read => &mut self.reads,
            Class::Write => &mut self.writes,
        };
        baseline.observe(latency);
        self.samples += 1;
        self.throttled |= throttled;
        let window = WINDOW.max(u32::try_from(cap.saturating_mul(2)).unwrap_or(u32::MAX));
        if self.samples < window && !self.throttled {
            return None;
        }
        let (n, sum) = [self.reads.judge(), self.writes.judge()]
            .into_iter()
            .flatten()
            .fold((0, 0.0), |(n, s), (c, r)| (n + c, s + r));
        let mean = if n == 0 { 1.0 } else { sum / f64::from(n) };
        let next = if self.throttled {
            cap * 3 / 4
        } else if mean > SHRINK_ABOVE {
            cap - (cap / 8).max(1)
        } else if self.saturated && mean < GROW_BELOW {
            cap + 1
        } else {
            cap
        };
        let rebase = mean > SHRINK_ABOVE && cap <= self.bounds.min;
        self.reads.end_window(rebase);
        self.writes.end_window(rebase);
        self.samples = 0;
        self.throttled = false;
        self.saturated = false;
        let next = next.clamp(self.bounds.min, self.bounds.max);
        (next != cap).then_some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn run(
        tuner: &mut Tuner,
        cap: &mut usize,
        samples: usize,
        mut latency: impl FnMut(usize) -> Duration,
    ) {
        for _ in 0..samples {
            tuner.saturated();
            if let Some(next) = tuner.observe(Class::Write, latency(*cap), false, *cap) {
                *cap = next;
            }
        }
    }

    #[test]
    fn a_cap_grows_while_latency_is_flat_and_settles_where_it_rises() {
        // A server that works on 10 requests at once: latency flat up to 10 in flight, then
        // rising in proportion (they queue).
        let (mut tuner, mut cap) = Tuner::new(AdaptiveLimit::default());
        let server = |in_flight: usize| 5 * MS * u32::try_from(in_flight.div_ceil(10)).unwrap();
        run(&mut tuner, &mut cap, 5_000, server);
        assert!((10..=20).contains(&cap), "settled at {cap}");
    }

    #[test]
    fn requests_of_different_costs_are_not_queueing() {
        // Writes that cost 1 to 9 ms each (a namespace, a quota, a status), whatever the
        // cap: no queue at all. Their fastest answer is no baseline for their mean: judged
        // against it, the cap fell to the minimum and stayed there.
        let (mut tuner, mut cap) = Tuner::new(AdaptiveLimit::default());
        let mut i = 0_u32;
        run(&mut tuner, &mut cap, 5_000, |_| {
            i = (i * 7 + 3) % 9;
            MS * (1 + i)
        });
        assert!(cap > 32, "a flat mix of costs grew the cap only to {cap}");
    }

    #[test]
    fn a_cap_that_is_not_reached_does_not_grow() {
        let (mut tuner, cap) = Tuner::new(AdaptiveLimit::default());
        for _ in 0..5_000 {
            assert_eq!(tuner.observe(Class::Write, 5 * MS, false, cap), None);
        }
    }

    #[test]
    fn throttling_cuts_the_cap_and_rising_latency_lowers_it() {
        let (mut tuner, _) = Tuner::new(AdaptiveLimit {
            initial: 32,
            min: 2,
            max: 64,
        });
        assert_eq!(tuner.observe(Class::Write, 5 * MS, true, 32), Some(24));
        let mut cap = 24;
        // A window at 5 ms sets the baseline; then latency 4× it: lowered window by window,
        // never raised on the way, down to the minimum.
        run(&mut tuner, &mut cap, 48, |_| 5 * MS);
        let mut caps = vec![cap];
        for _ in 0..5_000 {
            if cap == 2 {
                break;
            }
            run(&mut tuner, &mut cap, 1, |_| 20 * MS);
            if caps.last() != Some(&cap) {
                caps.push(cap);
            }
        }
        assert_eq!(cap, 2, "down to the minimum: {caps:?}");
        assert!(caps.windows(2).all(|w| w[1] < w[0]), "{caps:?}");
    }

    #[test]
    fn a_server_slower_for_good_is_the_new_baseline() {
        // 5 ms at first; then 40 ms whatever the cap (the server, not our queue): the cap
        // falls to the minimum, the baseline follows, and the cap grows again.
        let (mut tuner, mut cap) = Tuner::new(AdaptiveLimit::default());
        run(&mut tuner, &mut cap, 200, |_| 5 * MS);
        let grown = cap;
        run(&mut tuner, &mut cap, 400, |_| 40 * MS);
        assert!(
            cap < grown,
            "the slower server lowered the cap: {grown} → {cap}"
        );
        run(&mut tuner, &mut cap, 3_000, |_| 40 * MS);
        assert!(
            cap > grown,
            "a flat latency, however high, grows the cap again: {cap}"
        );
    }

    #[test]
    fn a_server_that_slows_down_gradually_keeps_the_cap_it_serves() {
        // A server that works on 10 requests at once, whose own service time grows from 5 to
        // 20 ms (a store that fills up; more objects to watch): for any cap its latency is
        // flat up to 10 in flight. The cap stays where that holds, instead of reading the
        // slower service as queueing and falling to the minimum.
        let (mut tuner, mut cap) = Tuner::new(AdaptiveLimit::default());
        let mut n = 0_u32;
        let mut caps = Vec::new();
        run(&mut tuner, &mut cap, 20_000, |in_flight| {
            n += 1;
            let service = 5.0 + 15.0 * f64::from(n) / 20_000.0;
            let queued = u32::try_from(in_flight.div_ceil(10)).unwrap();
            caps.push(in_flight);
            Duration::from_secs_f64(service / 1000.0) * queued
        });
        let late = &caps[caps.len() / 2..];
        let low = late.iter().filter(|&&c| c < 8).count();
        assert!(
            low * 10 < late.len(),
            "the cap fell below 8 in {low} of the last {} samples (now {cap})",
            late.len()
        );
    }

    #[test]
    fn cheap_reads_among_writes_are_not_congestion() {
        // Half the requests are 1 ms reads, half 10 ms writes, at any concurrency: flat.
        let (mut tuner, mut cap) = Tuner::new(AdaptiveLimit::default());
        for i in 0..2_000 {
            tuner.saturated();
            let (class, latency) = if i % 2 == 0 {
                (Class::Read, MS)
            } else {
                (Class::Write, 10 * MS)
            };
            if let Some(next) = tuner.observe(class, latency, false, cap) {
                cap = next;
            }
        }
        assert!(cap > 20, "a flat mix grew the cap only to {cap}");
    }

    #[test]
    fn bounds_are_kept() {
        let (_, cap) = Tuner::new(AdaptiveLimit {
            initial: 100,
            min: 0,
            max: 8,
        });
        assert_eq!(cap, 8);
        let (mut tuner, cap) = Tuner::new(AdaptiveLimit {
            initial: 1,
            min: 1,
            max: 8,
        });
        assert_eq!(
            tuner.observe(Class::Write, MS, true, cap),
            None,
            "never below 1"
        );
    }
}
