//! Progress on stderr for the long commands (rollout, bench, sft, train, update): a
//! bar with position, rate and ETA when stderr is a terminal, and plain lines at most
//! every few seconds when it is not, so CI logs and pipes get no carriage returns and
//! no ANSI codes.
//!
//! The library reports plain events (`rollout::Progress`, `train::UpdateProgress`,
//! `closed_loop::LoopEvent`, `closed_loop::WarmStartEvent`); drawing them is the
//! binary's concern alone (indicatif is a `cli` dependency: the Python binding builds
//! the library without it).

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressState, ProgressStyle};

/// The most often a pipe gets a progress line from one display.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// How often a terminal's bar is redrawn between events (elapsed time, ETA, spinner).
const TICK: Duration = Duration::from_millis(250);

/// One progress display: a bar on a terminal, throttled lines otherwise. Clones share
/// it, so a clone can move into a callback that runs on another task.
#[derive(Clone)]
pub struct Progress(Arc<Display>);

enum Display {
    /// A terminal: the bar, inside the group that every display of the command shares
    /// (so lines printed above them and bars below one another don't tear).
    Bar {
        group: MultiProgress,
        bar: ProgressBar,
        /// The count behind the bar's figures (its style reads it on every draw).
        tally: Arc<Mutex<Tally>>,
    },
    /// Not a terminal.
    Lines(Mutex<Lines>),
}

impl Progress {
    /// A display of `len` `unit`s (0: a count without a known end), headed `prefix`.
    pub fn new(prefix: &str, unit: &'static str, len: u64) -> Self {
        if std::io::stderr().is_terminal() {
            Self::bar(MultiProgress::new(), prefix, unit, len)
        } else {
            Self::lines(prefix, unit, len)
        }
    }

    /// A second display under this one (a step's phase under the run's steps).
    pub fn below(&self, prefix: &str, unit: &'static str, len: u64) -> Self {
        match &*self.0 {
            Display::Bar { group, .. } => Self::bar(group.clone(), prefix, unit, len),
            Display::Lines(_) => Self::lines(prefix, unit, len),
        }
    }

    fn bar(group: MultiProgress, prefix: &str, unit: &'static str, len: u64) -> Self {
        let tally = Arc::new(Mutex::new(Tally::new(unit, Instant::now())));
        let bar = group.add(ProgressBar::new(len));
        bar.set_style(bar_style(&tally, unit, len));
        bar.set_prefix(prefix.to_string());
        bar.enable_steady_tick(TICK);
        Progress(Arc::new(Display::Bar { group, bar, tally }))
    }

    fn lines(prefix: &str, unit: &'static str, len: u64) -> Self {
        let lines = Lines::new(prefix, unit, len, LINE_EVERY, Instant::now());
        Progress(Arc::new(Display::Lines(Mutex::new(lines))))
    }

    /// Starts over at 0 of `len` `unit`s under a new prefix (the next phase or row),
    /// its time counting from now.
    pub fn restart(&self, prefix: &str, unit: &'static str, len: u64) {
        let now = Instant::now();
        match &*self.0 {
            Display::Bar { bar, tally, .. } => {
                // Reset first: a redraw in between would show the last phase's count.
                bar.reset();
                *lock(tally) = Tally::new(unit, now);
                bar.set_style(bar_style(tally, unit, len));
                bar.set_length(len);
                bar.set_prefix(prefix.to_string());
                bar.set_message("");
                // Finishing stopped the ticker; a restarted bar needs it again.
                bar.enable_steady_tick(TICK);
            }
            Display::Lines(l) => lock(l).restart(prefix, unit, len, now),
        }
    }

    /// Starts the count at `pos` (a resumed run): the rate counts only what follows.
    pub fn start_at(&self, pos: u64) {
        match &*self.0 {
            Display::Bar { bar, tally, .. } => {
                lock(tally).base = pos;
                bar.set_position(pos);
            }
            Display::Lines(l) => {
                let mut l = lock(l);
                l.tally.base = pos;
                l.pos = pos;
            }
        }
    }

    /// The length, once known (an update knows its rows only once it packed them).
    pub fn set_length(&self, len: u64) {
        match &*self.0 {
            Display::Bar { bar, tally, .. } => {
                if bar.length() != Some(len) {
                    let unit = lock(tally).unit;
                    bar.set_style(bar_style(tally, unit, len));
                    bar.set_length(len);
                }
            }
            Display::Lines(l) => lock(l).len = len,
        }
    }

    /// `pos` units done, and what else is worth showing beside them.
    pub fn update(&self, pos: u64, message: String) {
        let now = Instant::now();
        match &*self.0 {
            Display::Bar { bar, tally, .. } => {
                lock(tally).record(pos, now);
                bar.set_message(message);
                bar.set_position(pos);
            }
            Display::Lines(l) => {
                let line = lock(l).update(pos, message, now);
                if let Some(line) = line {
                    eprintln!("{line}");
                }
            }
        }
    }

    /// A phase with nothing to count (an evaluation): a spinner and `message` on a
    /// terminal, one line at once otherwise.
    pub fn status(&self, prefix: &str, message: &str) {
        match &*self.0 {
            Display::Bar { bar, .. } => {
                bar.reset();
                bar.set_style(spinner_style());
                bar.set_prefix(prefix.to_string());
                bar.set_message(message.to_string());
                bar.enable_steady_tick(TICK);
            }
            Display::Lines(l) => {
                let line = lock(l).status(prefix, message, Instant::now());
                eprintln!("{line}");
            }
        }
    }

    /// Prints `line` on stderr above the bars.
    pub fn println(&self, line: impl AsRef<str>) {
        match &*self.0 {
            // Hidden (or failed) drawing still owes the line to the user.
            Display::Bar { group, .. } => {
                if group.println(line.as_ref()).is_err() || group.is_hidden() {
                    eprintln!("{}", line.as_ref());
                }
            }
            Display::Lines(_) => eprintln!("{}", line.as_ref()),
        }
    }

    /// Runs `f` (which prints, on stdout say) with the bars cleared, then redraws them.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &*self.0 {
            Display::Bar { group, .. } => group.suspend(f),
            Display::Lines(_) => f(),
        }
    }

    /// Done: the bar stays as it ended; a pipe gets the last state if it has not yet.
    pub fn finish(&self) {
        match &*self.0 {
            Display::Bar { bar, .. } => bar.finish(),
            Display::Lines(l) => {
                if let Some(line) = lock(l).finish(Instant::now()) {
                    eprintln!("{line}");
                }
            }
        }
    }

    /// Done for good, and of no interest once over (a step's phase): the bar goes
    /// away; a pipe gets the last state if it has not yet.
    pub fn clear(&self) {
        match &*self.0 {
            Display::Bar { group, bar, .. } => {
                bar.finish_and_clear();
                group.remove(bar);
            }
            Display::Lines(l) => {
                if let Some(line) = lock(l).finish(Instant::now()) {
                    eprintln!("{line}");
                }
            }
        }
    }
}

/// The display's state, even if a panic elsewhere poisoned its lock (it is only what
/// is shown).
fn lock<T>(l: &Mutex<T>) -> MutexGuard<'_, T> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

/// `prefix [=====>    ] 5/8 prompts  12s, 1.7 s/prompt, ETA 8s  message`, or without
/// a length, a spinner and the count.
fn bar_style(tally: &Arc<Mutex<Tally>>, unit: &'static str, len: u64) -> ProgressStyle {
    let template = if len > 0 {
        format!("{{prefix}} [{{bar:24}}] {{pos}}/{{len}} {unit}  {{stats}}  {{wide_msg}}")
    } else {
        format!("{{prefix}} {{spinner}} {{pos}} {unit}  {{stats}}  {{wide_msg}}")
    };
    let tally = tally.clone();
    ProgressStyle::with_template(&template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
        .with_key(
            "stats",
            move |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let stats = lock(&tally).stats(s.len().unwrap_or(0), Instant::now());
                let _ = w.write_str(&stats);
            },
        )
}

/// `prefix ⠋ message (12s)`.
fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{prefix} {spinner} {wide_msg} ({elapsed})")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

/// A count's timing, behind both displays' figures. The rate is the mean from the
/// start to the last update, and the ETA counts down from that update: the events
/// are sparse (a prompt, a step, minutes apart), and a moving average (indicatif's
/// own) decays towards zero between them.
#[derive(Debug, Clone, Copy)]
struct Tally {
    unit: &'static str,
    /// When the count (or its phase) started.
    start: Instant,
    /// Where it started (a resumed run's earlier steps are not part of its rate).
    base: u64,
    /// The last position reported, and when.
    last: Option<(u64, Instant)>,
}

impl Tally {
    fn new(unit: &'static str, now: Instant) -> Self {
        Tally {
            unit,
            start: now,
            base: 0,
            last: None,
        }
    }

    fn record(&mut self, pos: u64, now: Instant) {
        self.last = Some((pos, now));
    }

    /// `12s, 1.7 s/prompt, ETA 8s` for a count of `len` (0: no known end) at `now`.
    fn stats(&self, len: u64, now: Instant) -> String {
        let mut s = duration(now.saturating_duration_since(self.start));
        let Some((pos, at)) = self.last else {
            return s;
        };
        let done = pos.saturating_sub(self.base);
        let secs = at.saturating_duration_since(self.start).as_secs_f64();
        if done == 0 || secs <= 0.0 {
            return s;
        }
        let per_sec = done as f64 / secs;
        let _ = write!(s, ", {}", rate(per_sec, self.unit));
        if len > pos {
            let left = Duration::from_secs_f64((len - pos) as f64 / per_sec);
            let left = left.saturating_sub(now.saturating_duration_since(at));
            let _ = write!(s, ", ETA {}", duration(left));
        }
        s
    }
}

/// `12 rows/s`, `1.50 rows/s`, or below one a second, the time each takes (`52.0
/// s/prompt`), as tqdm shows it.
fn rate(per_sec: f64, unit: &str) -> String {
    if per_sec >= 10.0 {
        format!("{per_sec:.0} {unit}/s")
    } else if per_sec >= 1.0 || per_sec <= 0.0 || !per_sec.is_finite() {
        format!("{per_sec:.2} {unit}/s")
    } else {
        // Our units are plurals in -s: prompts, tokens, steps, modes.
        let one = unit.strip_suffix('s').unwrap_or(unit);
        format!("{:.1} s/{one}", 1.0 / per_sec)
    }
}

/// `7s`, `2m05s`, `1h02m`.
fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// The plain-lines display, its clock passed in (so tests can drive it).
struct Lines {
    prefix: String,
    tally: Tally,
    len: u64,
    pos: u64,
    message: String,
    /// When a line was last printed (at first: when the display was made).
    last_line: Instant,
    every: Duration,
    /// The state changed since the last line printed.
    unprinted: bool,
    printed_any: bool,
}

impl Lines {
    fn new(prefix: &str, unit: &'static str, len: u64, every: Duration, now: Instant) -> Self {
        Lines {
            prefix: prefix.to_string(),
            tally: Tally::new(unit, now),
            len,
            pos: 0,
            message: String::new(),
            last_line: now,
            every,
            unprinted: false,
            printed_any: false,
        }
    }

    /// A new phase; the throttle carries over, so phases don't add lines.
    fn restart(&mut self, prefix: &str, unit: &'static str, len: u64, now: Instant) {
        self.prefix = prefix.to_string();
        self.tally = Tally::new(unit, now);
        self.len = len;
        self.pos = 0;
        self.message.clear();
        self.unprinted = false;
        self.printed_any = false;
    }

    /// A phase with nothing to count, announced at once (it is no periodic line).
    fn status(&mut self, prefix: &str, message: &str, now: Instant) -> String {
        self.restart(prefix, "", 0, now);
        self.last_line = now;
        self.printed_any = true;
        format!("{prefix}: {message}")
    }

    /// The line to print now, if one is due.
    fn update(&mut self, pos: u64, message: String, now: Instant) -> Option<String> {
        self.pos = pos;
        self.message = message;
        self.tally.record(pos, now);
        self.unprinted = true;
        (now.saturating_duration_since(self.last_line) >= self.every).then(|| self.emit(now))
    }

    /// The last state, unless the last line already showed it.
    fn finish(&mut self, now: Instant) -> Option<String> {
        (self.unprinted || !self.printed_any).then(|| self.emit(now))
    }

    fn emit(&mut self, now: Instant) -> String {
        self.last_line = now;
        self.unprinted = false;
        self.printed_any = true;
        self.line(now)
    }

    /// `rollout: 5/8 prompts (62%), 12s, 2.4 s/prompt, ETA 7s; 40 rollouts, …`.
    fn line(&self, now: Instant) -> String {
        let unit = self.tally.unit;
        let mut s = format!("{}: ", self.prefix);
        match (self.pos.min(self.len) * 100).checked_div(self.len) {
            Some(pct) => {
                let _ = write!(s, "{}/{} {unit} ({pct}%)", self.pos, self.len);
            }
            None => {
                let _ = write!(s, "{} {unit}", self.pos);
            }
        }
        let _ = write!(s, ", {}", self.tally.stats(self.len, now));
        if !self.message.is_empty() {
            let _ = write!(s, "; {}", self.message);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, secs: u64) -> Instant {
        t0 + Duration::from_secs(secs)
    }

    #[test]
    fn lines_come_at_most_every_interval_and_once_more_at_the_end() {
        let t0 = Instant::now();
        let mut l = Lines::new("rollout", "prompts", 8, Duration::from_secs(5), t0);
        assert_eq!(l.update(1, "a".into(), at(t0, 1)), None);
        assert_eq!(l.update(2, "b".into(), at(t0, 4)), None);
        let first = l.update(3, "c".into(), at(t0, 5));
        assert_eq!(
            first.as_deref(),
            Some("rollout: 3/8 prompts (37%), 5s, 1.7 s/prompt, ETA 8s; c")
        );
        // The interval counts from the last line, not from the start.
        assert_eq!(l.update(4, "d".into(), at(t0, 9)), None);
        assert!(l.update(5, "e".into(), at(t0, 10)).is_some());
        // The end prints what the last line did not show ...
        assert_eq!(l.update(8, "f".into(), at(t0, 11)), None);
        assert_eq!(
            l.finish(at(t0, 12)).as_deref(),
            Some("rollout: 8/8 prompts (100%), 12s, 1.4 s/prompt; f")
        );
        // ... and nothing twice.
        assert_eq!(l.finish(at(t0, 13)), None);
    }

    #[test]
    fn an_interval_of_zero_prints_every_update() {
        let t0 = Instant::now();
        let mut l = Lines::new("update", "tokens", 0, Duration::ZERO, t0);
        for i in 1..=3 {
            let line = l
                .update(i * 20, String::new(), at(t0, i))
                .expect("a line each time");
            assert_eq!(
                line,
                format!("update: {} tokens, {i}s, 20 tokens/s", i * 20)
            );
            assert!(!line.contains('\r') && !line.contains('\x1b'), "{line:?}");
        }
        assert_eq!(l.finish(at(t0, 4)), None);
    }

    #[test]
    fn the_rate_holds_between_sparse_updates_and_the_eta_counts_down() {
        let t0 = Instant::now();
        let mut tally = Tally::new("steps", t0);
        assert_eq!(tally.stats(4, at(t0, 30)), "30s");
        tally.record(1, at(t0, 60));
        assert_eq!(tally.stats(4, at(t0, 60)), "1m00s, 60.0 s/step, ETA 3m00s");
        // Half a minute on, no step yet: the rate stands, the ETA is shorter.
        assert_eq!(tally.stats(4, at(t0, 90)), "1m30s, 60.0 s/step, ETA 2m30s");
        // Late: the ETA stops at zero.
        assert_eq!(tally.stats(4, at(t0, 300)), "5m00s, 60.0 s/step, ETA 0s");
    }

    #[test]
    fn a_display_with_no_updates_still_says_where_it_ended() {
        let t0 = Instant::now();
        let mut l = Lines::new("train", "steps", 4, Duration::from_secs(5), t0);
        assert_eq!(
            l.finish(at(t0, 2)).as_deref(),
            Some("train: 0/4 steps (0%), 2s")
        );
    }

    #[test]
    fn a_restart_keeps_the_throttle_and_counts_the_new_phase_from_zero() {
        let t0 = Instant::now();
        let mut l = Lines::new("step 1 rollout", "prompts", 2, Duration::from_secs(5), t0);
        assert!(l.update(2, String::new(), at(t0, 6)).is_some());
        l.restart("step 1 update", "tokens", 10, at(t0, 7));
        assert_eq!(l.update(5, String::new(), at(t0, 8)), None);
        assert_eq!(
            l.update(10, String::new(), at(t0, 11)).as_deref(),
            Some("step 1 update: 10/10 tokens (100%), 4s, 2.50 tokens/s")
        );
    }

    #[test]
    fn a_resumed_count_rates_only_what_follows() {
        let t0 = Instant::now();
        let mut l = Lines::new("train", "steps", 10, Duration::ZERO, t0);
        l.tally.base = 6;
        l.pos = 6;
        assert_eq!(
            l.update(8, String::new(), at(t0, 4)).as_deref(),
            Some("train: 8/10 steps (80%), 4s, 2.0 s/step, ETA 4s")
        );
    }

    #[test]
    fn a_status_is_one_line_at_once() {
        let t0 = Instant::now();
        let mut l = Lines::new("sft", "steps", 0, Duration::from_secs(5), t0);
        assert_eq!(
            l.status("sft", "evaluating on 2 test questions", t0),
            "sft: evaluating on 2 test questions"
        );
        assert_eq!(l.finish(at(t0, 1)), None);
    }

    #[test]
    fn rates_below_one_a_second_read_as_seconds_each() {
        assert_eq!(rate(123.4, "tokens"), "123 tokens/s");
        assert_eq!(rate(2.5, "tokens"), "2.50 tokens/s");
        assert_eq!(rate(0.02, "prompts"), "50.0 s/prompt");
        assert_eq!(rate(0.0, "steps"), "0.00 steps/s");
    }

    #[test]
    fn durations_read_compactly() {
        assert_eq!(duration(Duration::from_secs(7)), "7s");
        assert_eq!(duration(Duration::from_secs(125)), "2m05s");
        assert_eq!(duration(Duration::from_secs(3720)), "1h02m");
    }
}
