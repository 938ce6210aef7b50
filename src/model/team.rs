//! A persistent team of threads for the forward pass: one wake-up per phase group and
//! spinning barriers between phases, instead of a rayon fork-join per matmul.
//!
//! At batch 1 a token is about 240 small matmuls; a fork-join that parks and wakes
//! threads costs microseconds each, a spin barrier between two running threads a
//! fraction of one. [`Team::run`] hands one closure to every member (the calling thread
//! is member 0); members split each phase's work by their index and meet at
//! [`Member::barrier`]. Workers spin briefly after a run (the next one usually follows
//! within microseconds) and then sleep on a condition variable, so an idle engine
//! costs no CPU.
//!
//! A team is shared: runs from different threads take turns (a lock per run). A panic
//! in any member poisons the run: members waiting at a barrier panic too, the caller
//! waits until no member still uses its closure, then re-raises the panic.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::kernels::{Epilogue, OutputSink};

/// How long an idle worker spins for the next run before it sleeps.
const IDLE_SPIN: Duration = Duration::from_micros(200);

/// A job as the workers see it: the caller's closure with its lifetime erased. It is
/// only dereferenced between the publishing of a run and its completion, while
/// [`Team::run`] keeps the closure alive (it does not return before every member is
/// done, even when one panics).
#[derive(Clone, Copy)]
struct Job(*const (dyn Fn(&Member) + Sync));

// SAFETY: the closure behind it is `Sync`, and the pointer is only used while
// `Team::run` keeps it alive (see `Job`).
unsafe impl Send for Job {}

struct Shared {
    size: usize,
    /// Bumped once per run; workers compare it with the last they ran.
    generation: AtomicU64,
    job: Mutex<Option<Job>>,
    /// Workers that finished the current run.
    done: AtomicUsize,
    barrier_count: AtomicUsize,
    barrier_round: AtomicU64,
    poisoned: AtomicBool,
    shutdown: AtomicBool,
    /// Sleeping workers wait here; the count is read under the lock by the waker.
    sleepers: Mutex<usize>,
    wake: Condvar,
}

/// One member's view of a run.
pub struct Member<'a> {
    index: usize,
    shared: &'a Shared,
}

impl Member<'_> {
    /// This member's index, `0..size` (0 is the calling thread).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Members in the run.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// This member's share of `0..n`: contiguous, as equal as possible, in index order.
    pub fn share(&self, n: usize) -> std::ops::Range<usize> {
        let size = self.shared.size;
        n * self.index / size..n * (self.index + 1) / size
    }

    /// Waits until every member has reached this barrier. Everything a member wrote
    /// before it is visible to every member after it.
    pub fn barrier(&self) {
        let s = self.shared;
        if s.size == 1 {
            return;
        }
        let round = s.barrier_round.load(Ordering::Acquire);
        if s.barrier_count.fetch_add(1, Ordering::AcqRel) + 1 == s.size {
            s.barrier_count.store(0, Ordering::Relaxed);
            s.barrier_round.fetch_add(1, Ordering::AcqRel);
            return;
        }
        let mut spins = 0u32;
        while s.barrier_round.load(Ordering::Acquire) == round {
            if s.poisoned.load(Ordering::Relaxed) {
                panic!("another member of the forward's thread team panicked");
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                // Someone else needs this core (a shared machine): let it run.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// A persistent thread team (see the module docs).
pub struct Team {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Team")
            .field("size", &self.shared.size)
            .finish()
    }
}

impl Team {
    /// A team of `size` members: the caller plus `size - 1` worker threads.
    pub fn new(size: usize) -> Team {
        let size = size.max(1);
        let shared = Arc::new(Shared {
            size,
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            done: AtomicUsize::new(0),
            barrier_count: AtomicUsize::new(0),
            barrier_round: AtomicU64::new(0),
            poisoned: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: Mutex::new(0),
            wake: Condvar::new(),
        });
        let workers = (1..size)
            .map(|index| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("treegrpo-forward-{index}"))
                    .spawn(move || worker(index, &shared))
                    .expect("spawning a forward thread")
            })
            .collect();
        Team {
            shared,
            workers,
            run_lock: Mutex::new(()),
        }
    }

    /// A team sized from `TREEGRPO_THREADS`, else `RAYON_NUM_THREADS`, else the
    /// machine's available parallelism.
    pub fn from_env() -> Team {
        Team::new(threads_from_env())
    }

    /// Members in the team, the calling thread included.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// Runs `f` on every member at once and returns when all are done.
    pub fn run<F: Fn(&Member) + Sync>(&self, f: F) {
        let s = &*self.shared;
        if s.size == 1 {
            f(&Member {
                index: 0,
                shared: s,
            });
            return;
        }
        let _turn = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let job: &(dyn Fn(&Member) + Sync) = &f;
        // SAFETY: only the lifetime is erased; `run` outlives every use (see `Job`).
        let job: *const (dyn Fn(&Member) + Sync) = unsafe { std::mem::transmute(job) };
        s.poisoned.store(false, Ordering::Relaxed);
        s.done.store(0, Ordering::Relaxed);
        // A poisoned run may have left members counted at a barrier.
        s.barrier_count.store(0, Ordering::Relaxed);
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(Job(job));
        s.generation.fetch_add(1, Ordering::AcqRel);
        {
            let sleepers = s.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            if *sleepers > 0 {
                s.wake.notify_all();
            }
        }
        let mine = catch_unwind(AssertUnwindSafe(|| {
            f(&Member {
                index: 0,
                shared: s,
            })
        }));
        if mine.is_err() {
            s.poisoned.store(true, Ordering::Relaxed);
        }
        // Every worker must be done with `f` before it goes out of scope.
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) < s.size - 1 {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Err(panic) = mine {
            resume_unwind(panic);
        }
        if s.poisoned.load(Ordering::Relaxed) {
            panic!("a member of the forward's thread team panicked");
        }
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        {
            let _sleepers = self
                .shared
                .sleepers
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(index: usize, s: &Shared) {
    let mut seen = 0u64;
    loop {
        // Spin for the next run, then sleep.
        let idle_since = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            if s.generation.load(Ordering::Acquire) != seen {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && idle_since.elapsed() > IDLE_SPIN {
                let mut sleepers = s.sleepers.lock().unwrap_or_else(|e| e.into_inner());
                *sleepers += 1;
                while s.generation.load(Ordering::Acquire) == seen
                    && !s.shutdown.load(Ordering::Acquire)
                {
                    sleepers = s.wake.wait(sleepers).unwrap_or_else(|e| e.into_inner());
                }
                *sleepers -= 1;
            } else {
                std::hint::spin_loop();
            }
        }
        seen = s.generation.load(Ordering::Acquire);
        let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Job(f)) = job {
            // SAFETY: the run that published `f` waits for this worker's `done`
            // before it returns, so `f` is alive here.
            let f = unsafe { &*f };
            if catch_unwind(AssertUnwindSafe(|| f(&Member { index, shared: s }))).is_err() {
                s.poisoned.store(true, Ordering::Relaxed);
            }
        }
        s.done.fetch_add(1, Ordering::AcqRel);
    }
}

/// `TREEGRPO_THREADS`, else `RAYON_NUM_THREADS`, else the available parallelism.
pub fn threads_from_env() -> usize {
    ["TREEGRPO_THREADS", "RAYON_NUM_THREADS"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// A buffer members write in disjoint parts between barriers.
///
/// Rust cannot see that "member i writes rows of its share, and nobody reads them until
/// the next barrier" is race-free, so this wraps the raw pointer; every accessor is
/// `unsafe` and states what the caller guarantees.
pub struct SharedBuf<'a> {
    ptr: *mut f32,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: access goes through the unsafe accessors, whose contracts rule out races.
unsafe impl Sync for SharedBuf<'_> {}

impl<'a> SharedBuf<'a> {
    /// Shares `buf` with the team's members for as long as it is borrowed.
    pub fn new(buf: &'a mut [f32]) -> Self {
        SharedBuf {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    /// # Safety
    /// No member writes any element of `range` until the next barrier every reader
    /// passes after this borrow ends.
    pub unsafe fn get(&self, range: std::ops::Range<usize>) -> &[f32] {
        assert!(range.start <= range.end && range.end <= self.len);
        std::slice::from_raw_parts(self.ptr.add(range.start), range.len())
    }

    /// # Safety
    /// No other member reads or writes any element of `range` until the next barrier.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn get_mut(&self, range: std::ops::Range<usize>) -> &mut [f32] {
        assert!(range.start <= range.end && range.end <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len())
    }

    /// Values in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no value.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A kernel sink over the buffer, `[rows, width]`, columns past `cols` dropped.
    ///
    /// # Safety
    /// Members using sinks over the buffer at once give them disjoint panel ranges
    /// (so disjoint columns), and nobody reads those columns until the next barrier.
    pub unsafe fn sink(&self, width: usize, cols: usize, epilogue: Epilogue) -> OutputSink<'_> {
        OutputSink::from_raw_parts(self.ptr, self.len, width, cols, epilogue)
    }

    /// The whole buffer, to read.
    ///
    /// # Safety
    /// As [`Self::get`], for every element.
    pub unsafe fn all(&self) -> &[f32] {
        self.get(0..self.len)
    }
}

/// The process's forward team, created on first use with [`threads_from_env`] members.
/// One team for every model in the process: forwards take turns per run rather than
/// oversubscribing the cores.
pub fn global() -> &'static Team {
    static TEAM: std::sync::OnceLock<Team> = std::sync::OnceLock::new();
    TEAM.get_or_init(Team::from_env)
}
