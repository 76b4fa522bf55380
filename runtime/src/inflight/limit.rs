//! The self-tuning cap of [`RequestSlots`](super::RequestSlots): it grows while the API
//! server's latency stays flat under a full cap and shrinks when latency rises or the server
//! throttles, so no hand-set number is needed.
//!
//! The rule (additive increase, multiplicative decrease on throttling, as TCP's congestion
//! control; the latency signal as in delay-based congestion control):
//!
//! - each answered request is one sample: its latency (slot granted → response headers)
//!   divided by the *baseline* of its class, the lowest latency seen lately for reads (GET)
//!   or for writes (every other verb), so a mix of cheap reads and costly writes is not read
//!   as congestion. The baseline only falls, with one exception: a window at the lowest cap
//!   whose latency is still high sets it to that window's lowest latency (the server became
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

/// The lowest latency of one class: overall, and in the current window.
#[derive(Debug, Default)]
struct Baseline {
    lowest: Option<Duration>,
    window: Option<Duration>,
}

impl Baseline {
    fn observe(&mut self, latency: Duration) {
        self.lowest = Some(self.lowest.map_or(latency, |c| c.min(latency)));
        self.window = Some(self.window.map_or(latency, |c| c.min(latency)));
    }

    /// Ends a window; with `rebase`, the window's lowest latency becomes the baseline.
    fn end_window(&mut self, rebase: bool) {
        let window = self.window.take();
        if rebase && window.is_some() {
            self.lowest = window;
        }
    }
}

/// The tuning state of one self-tuning cap.
#[derive(Debug)]
pub struct Tuner {
    bounds: AdaptiveLimit,
    reads: Baseline,
    writes: Baseline,
    /// Sum and count of this window's latency ratios.
    ratio_sum: f64,
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
            ratio_sum: 0.0,
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
        let base = baseline
            .lowest
            .unwrap_or(latency)
            .max(Duration::from_micros(50));
        self.ratio_sum += latency.as_secs_f64() / base.as_secs_f64();
        self.samples += 1;
        self.throttled |= throttled;
        let window = WINDOW.max(u32::try_from(cap.saturating_mul(2)).unwrap_or(u32::MAX));
        if self.samples < window && !self.throttled {
            return None;
        }
        let mean = self.ratio_sum / f64::from(self.samples);
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
        self.ratio_sum = 0.0;
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
        latency: impl Fn(usize) -> Duration,
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
        // Latency 4× the baseline once the baseline is known: lowered window by window,
        // never raised on the way, down to the minimum.
        tuner.observe(Class::Write, 5 * MS, false, cap);
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
