//! The self-tuning caps of [`RequestSlots`](super::RequestSlots): a tenant's cap grows while
//! the API server's latency stays flat under it and shrinks when latency rises or the server
//! throttles; the total cap falls only when the server throttles. No hand-set number is needed.
//!
//! Two caps, because the two things they protect differ. The latency one tenant's flood adds
//! to everyone's requests is what a quiet tenant feels, so each tenant's requests in flight
//! are capped (times its weight) by the latency rule below: one tenant alone cannot raise the
//! server's latency beyond ~2× its baseline. Many tenants at once (a fleet being created, a
//! resync) have no quiet tenant to protect but throughput to gain: their total is bounded only
//! by the server's own throttling (429), starting at [`AdaptiveLimit::max`]. The rules below
//! are the tenant cap's, except where they name the total.
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
//!   at the lowest cap that held a tenant back and whose latency is still high becomes the
//!   baseline (the server became slower for good: with the fewest requests of ours in
//!   flight, none of its latency is our queueing). A baseline that followed recent latency
//!   under load would drift up with the queue the cap itself builds, and walk the cap up
//!   without end;
//! - samples are judged in windows of at least [`WINDOW`] samples and twice the cap;
//! - a window with a throttled answer (429, or 503 from an overloaded server) cuts the tenant
//!   cap to ¾ of it, and the total to ¾ of the requests in flight then; a window without one
//!   raises the total by 1, up to [`AdaptiveLimit::max`];
//! - latency judges only a window in which the tenant cap was reached (a request had to
//!   wait for its tenant's cap, not the total's): then a mean latency ratio above
//!   [`SHRINK_ABOVE`] (requests queue at the server) lowers the cap by one eighth of it, at
//!   least 1, and one below [`GROW_BELOW`] raises it by 1 (more concurrency still costs no
//!   latency). A cap that is not reached is neither raised (an idle controller does not walk
//!   its cap up to the maximum and then meet a flood with it) nor lowered (the latency of
//!   many tenants together is not one tenant's doing, and a cap lowered for it would meet the
//!   next lone flood too low);
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

/// Bounds and start of the self-tuning caps
/// ([`RequestSlots::adaptive`](super::RequestSlots::adaptive)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveLimit {
    /// A tenant's cap to start with.
    pub initial: usize,
    /// The lowest cap, a tenant's and the total (at least 1).
    pub min: usize,
    /// The highest cap, a tenant's and the total; the total starts there.
    pub max: usize,
}

/// The caps a [`Tuner`] sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Requests in flight in all.
    pub total: usize,
    /// Requests in flight of one tenant, per unit of its weight.
    pub tenant: usize,
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

    /// The window's mean latency in ms (0 without samples), for logs.
    fn mean_ms(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        (self.sum / self.count).as_secs_f64() * 1000.0
    }

    /// The baseline in ms (0 before there is one), for logs.
    fn base_ms(&self) -> f64 {
        self.lowest.map_or(0.0, |l| l.as_secs_f64() * 1000.0)
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

/// The tuning state of one pair of self-tuning caps.
#[derive(Debug)]
pub struct Tuner {
    bounds: AdaptiveLimit,
    caps: Caps,
    reads: Baseline,
    writes: Baseline,
    /// Samples in this window.
    samples: u32,
    throttled: bool,
    saturated: bool,
}

impl Tuner {
    /// A tuner within `bounds`; returns it with the caps to start with.
    pub fn new(bounds: AdaptiveLimit) -> (Self, Caps) {
        let min = bounds.min.max(1);
        let bounds = AdaptiveLimit {
            min,
            max: bounds.max.max(min),
            initial: bounds.initial.clamp(min, bounds.max.max(min)),
        };
        let caps = Caps {
            total: bounds.max,
            tenant: bounds.initial,
        };
        let tuner = Self {
            bounds,
            caps,
            reads: Baseline::default(),
            writes: Baseline::default(),
            samples: 0,
            throttled: false,
            saturated: false,
        };
        (tuner, caps)
    }

    /// A request had to wait for its tenant's cap: the cap is what limits now.
    pub fn saturated(&mut self) {
        self.saturated = true;
    }

    /// One answered request, with `busy` requests in flight now; returns the new caps when
    /// this sample ends a window that changes them.
    pub fn observe(
        &mut self,
        class: Class,
        latency: Duration,
        throttled: bool,
        busy: usize,
    ) -> Option<Caps> {
        let baseline = match class {
            Class::Read => &mut self.reads,
            Class::Write => &mut self.writes,
        };
        baseline.observe(latency);
        self.samples += 1;
        self.throttled |= throttled;
        let cap = self.caps.tenant;
        let window = WINDOW.max(u32::try_from(cap.saturating_mul(2)).unwrap_or(u32::MAX));
        if self.samples < window && !self.throttled {
            return None;
        }
        let (n, sum) = [self.reads.judge(), self.writes.judge()]
            .into_iter()
            .flatten()
            .fold((0, 0.0), |(n, s), (c, r)| (n + c, s + r));
        let mean = if n == 0 { 1.0 } else { sum / f64::from(n) };
        // Latency judges the tenant cap only in a window where that cap held a tenant back:
        // otherwise the latency is many tenants' together (a fleet being created), which no
        // tenant's cap would change, and a cap lowered for it would meet the next lone
        // tenant's flood too low.
        let tenant = if self.throttled {
            cap * 3 / 4
        } else if !self.saturated {
            cap
        } else if mean > SHRINK_ABOVE {
            cap - (cap / 8).max(1)
        } else if mean < GROW_BELOW {
            cap + 1
        } else {
            cap
        };
        let total = if self.throttled {
            busy.min(self.caps.total) * 3 / 4
        } else {
            self.caps.total + 1
        };
        let rebase = self.saturated && mean > SHRINK_ABOVE && cap <= self.bounds.min;
        tracing::debug!(
            cap,
            total = self.caps.total,
            busy,
            ratio = format_args!("{mean:.2}"),
            saturated = self.saturated,
            throttled = self.throttled,
            writes_ms = format_args!("{:.1}", self.writes.mean_ms()),
            writes_base_ms = format_args!("{:.1}", self.writes.base_ms()),
            reads_ms = format_args!("{:.1}", self.reads.mean_ms()),
            "request slots window"
        );
        self.reads.end_window(rebase);
        self.writes.end_window(rebase);
        self.samples = 0;
        self.throttled = false;
        self.saturated = false;
        let (min, max) = (self.bounds.min, self.bounds.max);
        let total = total.clamp(min, max);
        let next = Caps {
            total,
            tenant: tenant.clamp(min, max).min(total),
        };
        let old = std::mem::replace(&mut self.caps, next);
        (next != old).then_some(next)
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
                *cap = next.tenant;
            }
        }
    }

    #[test]
    fn a_cap_grows_while_latency_is_flat_and_settles_where_it_rises() {
        // A server that works on 10 requests at once: latency flat up to 10 in flight, then
        // rising in proportion (they queue).
        let (mut tuner, caps) = Tuner::new(AdaptiveLimit::default());
        let mut cap = caps.tenant;
        let server = |in_flight: usize| 5 * MS * u32::try_from(in_flight.div_ceil(10)).unwrap();
        run(&mut tuner, &mut cap, 5_000, server);
        assert!((10..=20).contains(&cap), "settled at {cap}");
    }

    #[test]
    fn requests_of_different_costs_are_not_queueing() {
        // Writes that cost 1 to 9 ms each (a namespace, a quota, a status), whatever the
        // cap: no queue at all. Their fastest answer is no baseline for their mean: judged
        // against it, the cap fell to the minimum and stayed there.
        let (mut tuner, caps) = Tuner::new(AdaptiveLimit::default());
        let mut cap = caps.tenant;
        let mut i = 0_u32;
        run(&mut tuner, &mut cap, 5_000, |_| {
            i = (i * 7 + 3) % 9;
            MS * (1 + i)
        });
        assert!(cap > 32, "a flat mix of costs grew the cap only to {cap}");
    }

    #[test]
    fn a_cap_that_is_not_reached_does_not_grow() {
        let (mut tuner, caps) = Tuner::new(AdaptiveLimit::default());
        for _ in 0..5_000 {
            let next = tuner.observe(Class::Write, 5 * MS, false, caps.tenant);
            assert!(next.is_none_or(|c| c.tenant == caps.tenant), "{next:?}");
        }
    }

    #[test]
    fn latency_no_tenant_cap_caused_does_not_lower_it() {
        // A baseline at 5 ms, then 50 ms answers while no tenant reaches its cap (many
        // tenants with a request or two each): the tenant cap stays. Once a tenant is held
        // back by it at that latency, it falls.
        let (mut tuner, caps) = Tuner::new(AdaptiveLimit::default());
        let mut cap = caps.tenant;
        run(&mut tuner, &mut cap, 64, |_| 5 * MS);
        let before = cap;
        for _ in 0..2_000 {
            let next = tuner.observe(Class::Write, 50 * MS, false, 40);
            assert!(next.is_none_or(|c| c.tenant == before), "{next:?}");
        }
        run(&mut tuner, &mut cap, 64, |_| 50 * MS);
        assert!(
            cap < before,
            "a tenant held back at 10× the baseline: {before} → {cap}"
        );
    }

    #[test]
    fn throttling_cuts_the_cap_and_rising_latency_lowers_it() {
        let (mut tuner, _) = Tuner::new(AdaptiveLimit {
            initial: 32,
            min: 2,
            max: 64,
        });
        // The tenant cap to ¾ of itself, the total to ¾ of the requests in flight.
        let cut = tuner.observe(Class::Write, 5 * MS, true, 40);
        assert_eq!(
            cut,
            Some(Caps {
                total: 30,
                tenant: 24
            })
        );
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
        let (mut tuner, caps) = Tuner::new(AdaptiveLimit::default());
        let mut cap = caps.tenant;
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
        let (mut tuner, caps) = Tuner::new(AdaptiveLimit::default());
        let mut cap = caps.tenant;
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
        let (mut tuner, caps) = Tuner::new(AdaptiveLimit::default());
        let mut cap = caps.tenant;
        for i in 0..2_000 {
            tuner.saturated();
            let (class, latency) = if i % 2 == 0 {
                (Class::Read, MS)
            } else {
                (Class::Write, 10 * MS)
            };
            if let Some(next) = tuner.observe(class, latency, false, cap) {
                cap = next.tenant;
            }
        }
        assert!(cap > 20, "a flat mix grew the cap only to {cap}");
    }

    #[test]
    fn bounds_are_kept() {
        let (_, caps) = Tuner::new(AdaptiveLimit {
            initial: 100,
            min: 0,
            max: 8,
        });
        assert_eq!(
            caps,
            Caps {
                total: 8,
                tenant: 8
            }
        );
        let (mut tuner, caps) = Tuner::new(AdaptiveLimit {
            initial: 1,
            min: 1,
            max: 8,
        });
        assert_eq!(
            tuner.observe(Class::Write, MS, true, 1),
            Some(Caps {
                total: 1,
                tenant: 1
            }),
            "never below 1"
        );
        assert_eq!(caps.tenant, 1);
    }
}
