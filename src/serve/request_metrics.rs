//! The request counters the `/metrics` middleware keeps ([`Metrics`]) and the
//! Prometheus text helpers (`family`, `series`, `histogram`) the page is written with.
//! A leaf below the server's state, which holds one [`Metrics`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use crate::engine::Histogram;

/// Bounds of the request-latency buckets, in seconds: a small completion takes
/// milliseconds, a rollout of many prompts minutes.
const REQUEST_BOUNDS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// What the middleware counts.
#[derive(Default)]
pub struct Metrics {
    /// Requests by (route template, status).
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// Latency by route template.
    latency: Mutex<BTreeMap<String, Histogram>>,
}

impl Metrics {
    pub(super) fn record(&self, route: &str, status: u16, seconds: f64) {
        *self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((route.to_string(), status))
            .or_default() += 1;
        self.latency
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(route.to_string())
            .or_insert_with(|| Histogram::new(&REQUEST_BOUNDS))
            .record(seconds);
    }

    /// Requests by endpoint and status, and their latencies by endpoint (copied out
    /// of the locks first, so a scrape holds them only that long).
    pub(super) fn write(&self, out: &mut String) {
        let requests = self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        family(
            out,
            "treegrpo_requests_total",
            "counter",
            "HTTP requests by endpoint and status.",
        );
        for ((route, status), n) in &requests {
            let _ = writeln!(
                out,
                "treegrpo_requests_total{{endpoint=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        let latency = self
            .latency
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        family(
            out,
            "treegrpo_request_duration_seconds",
            "histogram",
            "Time to the response's headers, by endpoint.",
        );
        for (route, h) in &latency {
            histogram(
                out,
                "treegrpo_request_duration_seconds",
                &format!("endpoint=\"{route}\""),
                h,
            );
        }
    }
}

/// Unlabelled series of one kind: (name, help, value) each.
pub(super) fn series(out: &mut String, kind: &str, rows: &[(&str, &str, u64)]) {
    for (name, help, value) in rows {
        family(out, name, kind, help);
        let _ = writeln!(out, "{name} {value}");
    }
}

pub(super) fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// One histogram's `_bucket`, `_sum` and `_count` lines; `labels` go before `le`.
pub(super) fn histogram(out: &mut String, name: &str, labels: &str, h: &Histogram) {
    let sep = if labels.is_empty() { "" } else { "," };
    for (bound, count) in h.bounds.iter().zip(&h.buckets) {
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {count}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", h.count);
    let braces = if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    };
    let _ = writeln!(out, "{name}_sum{braces} {}", h.sum_seconds);
    let _ = writeln!(out, "{name}_count{braces} {}", h.count);
}
