//! The scenarios, run for one controller: P2 (fleet → Ready), P3 (requests after a restart and
//! during a full resync), P4 (a quiet tenant's change alone and after a flood), P5 (RSS), and
//! the numbers P6 (writes vs the minimum) reads from P2.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use idem_bench::BaseTenant;
use kube::{Api, Client};

use idem_tests::ControlPlane;

use super::child::{Controller, Reconcile, Side, cpu_of_pid};
use super::counts::{self, Counts};
use super::fleet::{self, Tracker};
use crate::dev::progress::Step;

/// Objects the job writes per tenant: 3 namespaces, 9 children, 1 status.
pub const WRITES_PER_TENANT: u64 = 13;
/// How long a controller must stay silent before a replay or resync counts as finished.
const QUIET: Duration = Duration::from_secs(1);

/// What to run, and how big.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Selected scenarios (`p2` … `p6`).
    pub scenarios: BTreeSet<String>,
    /// Tenants of the P2 fleet.
    pub tenants: usize,
    /// BaseTenants of each P4 flood (one tenant, one namespace each).
    pub flood: usize,
    /// P4's floods, one after another: its figures right after a flood are medians over them.
    pub floods: usize,
    /// Resync period during P3's resync measurement.
    pub resync_secs: u64,
    /// Changes of the quiet tenant measured alone in P4.
    pub alone_samples: usize,
    /// Workers of every controller.
    pub workers: usize,
    /// `bench-idem`'s cap on API requests in flight, shared fairly among tenants (`auto`,
    /// a number, or 0: none).
    pub requests_in_flight: String,
}

impl Plan {
    /// Whether scenario `name` runs.
    pub fn has(&self, name: &str) -> bool {
        self.scenarios.contains(name)
    }
}

/// How long after the fleet is Ready P2 reads the controller's memory again: longer than
/// idem's wait before it gives free memory back (1 s quiet, at most one release per 10 s).
pub const AT_REST: Duration = Duration::from_secs(12);

/// P2's figures for one controller.
#[derive(Clone, Debug, Default)]
pub struct P2 {
    /// From the first create to the last tenant Ready.
    pub time: Duration,
    /// The controller's requests meanwhile.
    pub counts: Counts,
    /// Reconciles per tenant.
    pub reconciles_per_tenant: f64,
    /// Each tenant's create → Ready time, sorted.
    pub ready_latencies: Vec<Duration>,
    /// RSS once the fleet is Ready.
    pub rss: u64,
    /// Its anonymous part (heap, stacks), without the binary's and libraries' pages.
    pub rss_anon: u64,
    /// RSS [`AT_REST`] after the fleet is Ready, nothing new to do meanwhile.
    pub rss_rest: u64,
    /// Its anonymous part.
    pub rss_anon_rest: u64,
    /// The most RSS the process ever had, measured at the same time (`VmHWM`, or the sample
    /// at Ready when the kernel had not counted it in yet).
    pub rss_peak: u64,
    /// The controller's CPU time (user + system) from the first create to the last tenant
    /// Ready.
    pub cpu: Duration,
    /// The API server's and etcd's CPU time over the same span: the work the whole fill
    /// (the creates, the controller's requests and watches, the controller manager's
    /// reactions) cost the server, which on a small machine shares its cores with the rest.
    pub server_cpu: Duration,
}

/// P4's figures for one controller.
#[derive(Clone, Debug, Default)]
pub struct P4 {
    /// The quiet tenant's change → Ready times with nothing else to do.
    pub alone: Vec<Duration>,
    /// The same, the first change right after each flood was created.
    pub after: Vec<Duration>,
    /// The same, changed again and again from right after each flood was created until it
    /// drained.
    pub flooded: Vec<Duration>,
    /// From each flood's first create until every object of it was Ready.
    pub drains: Vec<Duration>,
    /// Cumulative reconciles per tenant class (`quiet`, `flood`, `others`) against seconds
    /// since the flood began.
    pub timeline: BTreeMap<String, Vec<(f64, usize)>>,
}

/// Everything measured of one controller.
#[derive(Clone, Debug)]
pub struct SideResult {
    /// Which controller.
    pub side: Side,
    /// P2 (always run: every other scenario needs the fleet).
    pub p2: P2,
    /// P3: the controller's requests after a restart, until it went quiet.
    pub restart: Option<Counts>,
    /// P3: the controller's requests during one full resync.
    pub resync: Option<Counts>,
    /// P4.
    pub p4: Option<P4>,
    /// P5: RSS at the end, and the objects in its caches then.
    pub p5: Option<(u64, usize)>,
}

/// Runs the selected scenarios for `side` on the control plane at `kubeconfig`.
///
/// # Errors
/// When the controller fails, a wait times out or the API fails.
pub async fn run_side(
    side: Side,
    binary: &Path,
    kubeconfig: &Path,
    client: &Client,
    cp: &ControlPlane,
    plan: &Plan,
    out: &Path,
) -> anyhow::Result<SideResult> {
    let run = side.name();
    let log = out.join(format!("{run}.log"));
    let spawn = |resync: u64| -> anyhow::Result<Controller> {
        let extra = match side {
            Side::Idem => vec![format!("--requests-in-flight={}", plan.requests_in_flight)],
            Side::Kube | Side::ControllerRuntime => Vec::new(),
        };
        let mut c = Controller::spawn(binary, kubeconfig, run, plan.workers, resync, &extra, &log)?;
        c.wait_synced(Duration::from_secs(120))?;
        Ok(c)
    };
    let tracker = Tracker::start(client, run).await;
    let mut ctrl = spawn(0)?;

    // P2: the fleet.
    let names: Vec<String> = (0..plan.tenants)
        .map(|i| format!("{run}-t{i:04}"))
        .collect();
    let fleet_objs: Vec<BaseTenant> = names
        .iter()
        .map(|n| fleet::tenant(run, n, &n[run.len() + 1..], &["a", "b", "c"]))
        .collect();
    let step = Step::start(format!(
        "{run}: P2 {} tenants × 3 namespaces → Ready",
        plan.tenants
    ));
    let before = cp.metrics().await?;
    let cpu_before = ctrl.cpu()?;
    let server_before = server_cpu(cp)?;
    let start = Instant::now();
    let created = fleet::create_all(&Api::all(client.clone()), fleet_objs).await?;
    let timeout = Duration::from_secs(120) + Duration::from_millis(500) * plan.tenants as u32;
    let bar = step.bar().clone();
    let total = names.len();
    tracker
        .wait_ready(&names, timeout, |n| {
            bar.set_message(format!("{run}: P2 {n}/{total} Ready"))
        })
        .await?;
    let time = start.elapsed();
    let cpu = ctrl.cpu()?.saturating_sub(cpu_before);
    let server_cpu = server_cpu(cp)?.saturating_sub(server_before);
    let after = cp.metrics().await?;
    let reconciles = ctrl.reconciles_since(start).len();
    let mut ready_latencies: Vec<Duration> = names
        .iter()
        .filter_map(|n| {
            let ready = *tracker.get(n)?.ready_at.get(&1)?;
            Some(ready.saturating_duration_since(*created.get(n)?))
        })
        .collect();
    ready_latencies.sort();
    let p2 = P2 {
        time,
        counts: counts::delta(&before, &after),
        reconciles_per_tenant: reconciles as f64 / plan.tenants as f64,
        ready_latencies,
        rss: ctrl.rss_bytes()?,
        rss_anon: ctrl.rss_anon_bytes()?,
        rss_rest: 0,
        rss_anon_rest: 0,
        rss_peak: 0,
        cpu,
        server_cpu,
    };
    // The same process a moment later, with nothing new to do: what it keeps of the fill.
    tokio::time::sleep(AT_REST).await;
    let p2 = P2 {
        rss_rest: ctrl.rss_bytes()?,
        rss_anon_rest: ctrl.rss_anon_bytes()?,
        // The kernel folds a task's counts into VmHWM lazily: never below a sample taken.
        rss_peak: ctrl.rss_peak_bytes()?.max(p2.rss),
        ..p2
    };
    step.done(&format!(
        "{:.1}s, {:.1}s CPU, {}",
        time.as_secs_f64(),
        cpu.as_secs_f64(),
        p2.counts.summary()
    ));
    let mut result = SideResult {
        side,
        p2,
        restart: None,
        resync: None,
        p4: None,
        p5: None,
    };

    if plan.has("p3") {
        let step = Step::start(format!("{run}: P3 restart of the converged fleet"));
        let before = kill_and_settle(ctrl, cp).await?;
        let mark = Instant::now();
        ctrl = spawn(plan.resync_secs)?;
        wait_all_reconciled(&ctrl, &names, mark, Duration::from_secs(300)).await?;
        let after = cp.metrics().await?;
        let restart = counts::delta(&before, &after);
        step.done(&restart.summary());
        let step = Step::start(format!(
            "{run}: P3 full resync (period {} s)",
            plan.resync_secs
        ));
        let mark = Instant::now();
        let wait = Duration::from_secs(plan.resync_secs * 2 + 120);
        wait_all_reconciled(&ctrl, &names, mark, wait).await?;
        let after_resync = cp.metrics().await?;
        let resync = counts::delta(&after, &after_resync);
        step.done(&resync.summary());
        result.restart = Some(restart);
        result.resync = Some(resync);
        // P4 runs without resync: restart once more and let the replay finish unmeasured.
        ctrl.kill();
        let mark = Instant::now();
        ctrl = spawn(0)?;
        wait_all_reconciled(&ctrl, &names, mark, Duration::from_secs(300)).await?;
    }

    if plan.has("p4") {
        result.p4 = Some(p4(run, client, &tracker, &mut ctrl, &names, plan).await?);
    }
    if plan.has("p5") {
        let flood = if plan.has("p4") {
            plan.flood * plan.floods
        } else {
            0
        };
        let cached = plan.tenants * (1 + 3 * 4) + flood * (1 + 4);
        result.p5 = Some((ctrl.rss_bytes()?, cached));
    }
    ctrl.check_alive()?;
    ctrl.kill();
    Ok(result)
}

/// The CPU time the control plane's API server and etcd have used so far.
fn server_cpu(cp: &ControlPlane) -> anyhow::Result<Duration> {
    let mut total = Duration::ZERO;
    for (name, pid) in cp.pids() {
        if name == "kube-apiserver" || name == "etcd" {
            total += cpu_of_pid(*pid).with_context(|| format!("the CPU time of {name}"))?;
        }
    }
    Ok(total)
}

/// Kills the controller and returns `/metrics` once the API server has counted the end of
/// its watches (a WATCH is counted when it ends), so they do not land in the next
/// measurement; gives up waiting after 5 s.
async fn kill_and_settle(ctrl: Controller, cp: &ControlPlane) -> anyhow::Result<String> {
    /// The controller's watches: BaseTenants and the four child kinds.
    const WATCHES: u64 = 5;
    let before = cp.metrics().await?;
    ctrl.kill();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = cp.metrics().await?;
        if counts::delta(&before, &now).get("WATCH") >= WATCHES || Instant::now() > deadline {
            return Ok(now);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until each of `names` was reconciled at least once since `mark`, then until no
/// reconcile was reported for [`QUIET`].
async fn wait_all_reconciled(
    ctrl: &Controller,
    names: &[String],
    mark: Instant,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let want: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    loop {
        let seen: BTreeSet<String> = ctrl
            .reconciles_since(mark)
            .into_iter()
            .map(|r| r.name)
            .collect();
        if want.iter().all(|n| seen.contains(*n)) {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {} tenants reconciled within {timeout:?}",
            want.iter().filter(|n| seen.contains(**n)).count(),
            want.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut count = ctrl.reconcile_count();
    let mut since = Instant::now();
    while since.elapsed() < QUIET {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = ctrl.reconcile_count();
        if now != count {
            (count, since) = (now, Instant::now());
        }
        anyhow::ensure!(Instant::now() < deadline, "the controller never went quiet");
    }
    Ok(())
}

/// P4: the quiet tenant's change latency alone, then from right after a flood until it drained.
async fn p4(
    run: &str,
    client: &Client,
    tracker: &Tracker,
    ctrl: &mut Controller,
    names: &[String],
    plan: &Plan,
) -> anyhow::Result<P4> {
    let quiet = names.first().context("P4 needs at least one tenant")?;
    let mut cpu = 10;
    let change = async |cpu: &mut u32| -> anyhow::Result<Duration> {
        *cpu += 1;
        let sent = Instant::now();
        let generation = fleet::change_cpu(client, quiet, &cpu.to_string()).await?;
        let ready = tracker
            .wait_generation(quiet, generation, Duration::from_secs(600))
            .await?;
        Ok(ready.saturating_duration_since(sent))
    };
    let step = Step::start(format!("{run}: P4 quiet tenant's change, alone"));
    let mut alone = Vec::new();
    for _ in 0..plan.alone_samples {
        alone.push(change(&mut cpu).await?);
    }
    step.done(&format!("median {} ms", median_ms(&alone)));

    let mut result = P4 {
        alone,
        ..P4::default()
    };
    for flood in 0..plan.floods {
        let step = Step::start(format!(
            "{run}: P4 flood {} of {}: {} objects of one tenant, quiet tenant changed meanwhile",
            flood + 1,
            plan.floods,
            plan.flood
        ));
        let flood_names: Vec<String> = (0..plan.flood)
            .map(|i| format!("{run}-f{flood}-{i:04}"))
            .collect();
        let objs = flood_names
            .iter()
            .map(|n| fleet::tenant(run, n, "flood", &["a"]))
            .collect();
        let start = Instant::now();
        fleet::create_all(&Api::all(client.clone()), objs).await?;
        let mut changes = Vec::new();
        loop {
            changes.push(change(&mut cpu).await?);
            let ready = tracker.ready_count(&flood_names);
            step.set_message(format!(
                "{run}: P4 flood {} of {}: {ready}/{} Ready, quiet tenant changed {} times",
                flood + 1,
                plan.floods,
                plan.flood,
                changes.len()
            ));
            if ready == flood_names.len() || changes.len() >= 30 {
                break;
            }
        }
        let timeout = Duration::from_secs(120) + Duration::from_millis(500) * plan.flood as u32;
        tracker.wait_ready(&flood_names, timeout, |_| {}).await?;
        let drain = start.elapsed();
        ctrl.check_alive()?;
        if flood == 0 {
            result.timeline = timeline(&ctrl.reconciles_since(start), start, quiet);
        }
        step.done(&format!(
            "drained in {:.1}s; quiet tenant {} ms right after, median {} ms",
            drain.as_secs_f64(),
            changes.first().map_or(0, Duration::as_millis),
            median_ms(&changes)
        ));
        result.after.extend(changes.first().copied());
        result.flooded.extend(changes);
        result.drains.push(drain);
    }
    Ok(result)
}

/// Cumulative reconciles per class of tenant over seconds since `start`.
fn timeline(
    reconciles: &[Reconcile],
    start: Instant,
    quiet: &str,
) -> BTreeMap<String, Vec<(f64, usize)>> {
    let mut out: BTreeMap<String, Vec<(f64, usize)>> = BTreeMap::new();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for r in reconciles {
        let class = if r.name == quiet {
            "quiet tenant"
        } else if r.tenant == "flood" {
            "flood tenant"
        } else {
            "other tenants"
        };
        let n = counts.entry(class).or_default();
        *n += 1;
        let t = r.at.saturating_duration_since(start).as_secs_f64();
        out.entry(class.to_owned()).or_default().push((t, *n));
    }
    out
}

/// The median in whole milliseconds (0 for none).
pub fn median_ms(samples: &[Duration]) -> u128 {
    let mut v: Vec<Duration> = samples.to_vec();
    v.sort();
    v.get(v.len() / 2).map_or(0, Duration::as_millis)
}
